"""Rule decoded_cache: decode one split of an on-disk set once, at the size training reads it."""
from pathlib import Path

from fnlcore.datasets.decoded_cache import CacheGeometry, build_decoded_cache
from fnlcore.logs import job_log

sm = snakemake  # noqa: F821 (injected by Snakemake)
w = sm.wildcards
with job_log(sm.log[0]) as log:
    geometry = CacheGeometry.parse(w.geometry)
    log.info("decoding %s/%s at %s with %d workers", w.dataset, w.split, geometry.name, sm.threads)
    pixels = build_decoded_cache(Path(sm.input.meta).parent, w.split, geometry, workers=sm.threads)
    if Path(pixels).resolve() != Path(sm.output.pixels).resolve():
        raise RuntimeError(f"decoded cache written to {pixels}, but the rule declares {sm.output.pixels}")
