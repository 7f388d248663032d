# Shared state of the workflow: the validated plan and helpers for rules.
import sys

from fnlcore import paths
from fnlcore.app.plan import build_plan
from fnlcore.errors import ConfigError

try:
    PLAN = build_plan(config)
except ConfigError as err:
    # One clear line instead of a traceback: the message names the key and the fix.
    sys.stderr.write(f"\nConfiguration error: {err}\n\n")
    raise SystemExit(1)

RESULTS = PLAN.results_dir


def pattern(template, **fixed):
    """Fill some fields of a fnlcore.paths template, keep the rest as {wildcards}."""

    class Keep(dict):
        def __missing__(self, key):
            return "{" + key + "}"

    return template.format_map(Keep(results=RESULTS, **fixed))


def dataset_settings(name):
    from fnlcore.app.plan import DatasetSettings

    return PLAN.datasets.get(name) or DatasetSettings(name=name, raw_dir=f"resources/raw/{name}")


def partition_spec(slug):
    try:
        return PLAN.partitions[slug]
    except KeyError:
        raise ValueError(
            f"partition {slug!r} is not declared in the configuration; declared: {sorted(PLAN.partitions)}"
        )


def noise_spec(slug):
    try:
        return PLAN.noises[slug]
    except KeyError:
        raise ValueError(f"noise {slug!r} is not declared in the configuration; declared: {sorted(PLAN.noises)}")


wildcard_constraints:
    dataset=r"[a-z0-9_]+",
    partition=r"[A-Za-z0-9.\-_]+",
    noise=r"[A-Za-z0-9.\-_]+",
    annotator=r"[A-Za-z0-9.\-_]+",
    pseed=r"\d+",
    nseed=r"\d+",
    client=r"\d+",
    seed=r"\d+",
    train=r"[A-Za-z0-9.\-_]+",
    method=r"[A-Za-z0-9.\-_]+",
    paper=r"[a-z0-9_]+",
    table=r"[A-Za-z0-9_]+",


def annotator_settings(slug):
    """The annotator settings behind an annotator slug (from any noise spec declaring it: NoiseSpec.annotator_slug)."""
    from fnlcore.app.annotate import AnnotatorSettings

    for spec in PLAN.noises.values():
        if spec.annotator_slug() == slug:
            return AnnotatorSettings.from_noise_spec(spec)
    raise ValueError(f"annotator {slug!r} is not used by any noise model in the configuration")
