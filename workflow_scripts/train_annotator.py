"""Rule annotator: train one client's H-IDN annotator on its clean labels, save checkpoint + probabilities."""
import sys
from pathlib import Path

sm = snakemake  # noqa: F821 (injected by Snakemake)
sys.path.insert(0, str(Path(sm.scriptdir).parent))  # this checkout's fnlcore, also inside a conda env (envs/)

from fnlcore.app.annotate import save_annotator, train_annotator  # noqa: E402 (after the path is set)
from fnlcore.datasets import load_prepared  # noqa: E402 (after the path is set)
from fnlcore.logs import job_log  # noqa: E402 (after the path is set)
from fnlcore.partition import read_partition  # noqa: E402 (after the path is set)

settings = sm.params.settings
client = int(sm.wildcards.client)
with job_log(sm.log[0]) as log:
    ds = load_prepared(sm.params.data_dir)
    labels = ds.labels("train")
    assignment = read_partition(sm.input.partition, num_samples=len(labels))
    idx = assignment.clients[client]
    images = ds.images("train")[idx] if ds.info.in_memory else None
    paths = None if ds.info.in_memory else [ds.paths("train")[i] for i in idx]
    log.info("annotator %s for client %d: %d samples", sm.wildcards.annotator, client, len(idx))
    state, probs, model_name = train_annotator(
        labels[idx], ds.info.num_classes, settings, ds.info.image_size, ds.info.channels,
        images=images, paths=paths, device=str(sm.config.get("device", "auto")),
    )
    acc = float((probs.argmax(1) == labels[idx]).mean())
    log.info("annotator %s client %d: training accuracy %.3f", model_name, client, acc)
    save_annotator(sm.output.checkpoint, sm.output.probs, state, probs, idx, settings, model_name, client)
