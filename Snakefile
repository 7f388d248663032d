# FNL-Repro: from raw data to the tables of five papers on federated learning
# with noisy labels. The rules are thin: every computation lives in fnlcore.
#
#   snakemake --cores 2                       the demo (config/config.yaml)
#   snakemake --cores 2 --configfile my.yaml  your own grid
#
# The configuration is validated (JSON Schema, then fnlcore's typed specs)
# before any job runs; errors name the offending key.

import os
import sys

from snakemake.utils import min_version

min_version("9.0")


configfile: os.path.join(workflow.basedir, "config", "config.yaml")


# JSON Schema (config/schema/config.schema.yaml) with one-line errors; the typed checks
# follow in rules/common.smk.
include: "rules/validate.smk"


report: "report/workflow.rst"


# Job reasons name a few files and a count, not every input of a table (fnlcore.logs).
from fnlcore.logs import shorten_snakemake_reasons

shorten_snakemake_reasons()


include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/cache.smk"
include: "rules/partition.smk"
include: "rules/noise.smk"
include: "rules/train.smk"
include: "rules/tables.smk"
include: "rules/cross_paper.smk"


# Every rule runs in its conda environment (envs/<family>.yaml) with --software-deployment-method
# conda; on a cluster without conda, add apptainer: the rules' environments are then built
# inside this image (docs/cluster.md).
container: "docker://condaforge/miniforge3:24.11.3-0"


# The targets: the data grid's files, the selected tables, and every run of those tables, so a
# run whose outputs were deleted (or whose job failed) is run again by the plain command and
# its table rebuilt: Snakemake then agrees with `fnl status`.
rule all:
    default_target: True
    input:
        PLAN.targets(),
        CROSS_PAPER.targets(RESULTS),
        [run.files(RESULTS)["metrics"] for run in PLAN.runs()],
    # A count instead of Snakemake's list of every target (hundreds of paths for a paper)
    message:
        f"all: {len(PLAN.targets())} files ({len(PLAN.tables)} table(s): "
        + (", ".join(t.name for t in PLAN.tables) or "none")
        + f"; {len(PLAN.label_sets)} noisy label set(s) of the data grid) and their {len(PLAN.runs())} training run(s), under {RESULTS}/"


onstart:
    # One workflow at a time per results folder, whichever checkout it runs from (Snakemake's
    # own lock covers its working directory only): fnlcore/app/results_lock.py.
    from fnlcore.app.results_lock import (
        ResultsFolderLocked,
        busy_runs,
        busy_runs_message,
        lock_results,
        train_checkpoints,
    )
    from fnlcore.errors import FNLError

    try:
        if lock_results(RESULTS) is None:
            print(
                f"Warning: the file system of {RESULTS}/ cannot lock files; make sure no other "
                "workflow writes into it.",
                file=sys.stderr,
            )
    except ResultsFolderLocked as err:
        sys.stderr.write(f"\nResults folder locked: {err}\n\n")
        raise SystemExit(1)
    except FNLError as err:  # a full disk: said plainly, not a bare OSError
        sys.stderr.write(f"\nResults folder unusable: {err}\n\n")
        raise SystemExit(1)
    # One writer per run, also after a kill of Snakemake alone: its training jobs outlive it,
    # each holding its run's lock. Starting those runs again would put two writers on one
    # checkpoint, so stop before any job (and before Snakemake deletes their logs).
    busy = busy_runs(train_checkpoints(workflow, PLAN, RESULTS))
    if busy:
        sys.stderr.write(busy_runs_message(busy, "This workflow did not start"))
        raise SystemExit(1)


onerror:
    # A train job refused because another process writes its run said so in its own output,
    # long scrolled away by now: repeat who writes which run.
    from fnlcore.app.results_lock import (
        busy_runs,
        busy_runs_message,
        train_checkpoints,
    )

    busy = busy_runs(train_checkpoints(workflow, PLAN, RESULTS))
    if busy:
        sys.stderr.write(
            busy_runs_message(busy, "Some runs of this workflow were not started")
        )


onsuccess:
    # Say where the results are: the tables of this configuration and the report command.
    from fnlcore.app.summary import finished_message

    print(finished_message(PLAN), file=sys.stderr)


# Snakemake skips onsuccess when nothing is to be done: the runs of another code version are
# named then too (fnlcore/app/summary.py).
from fnlcore.app.summary import warn_when_nothing_to_do

warn_when_nothing_to_do(workflow, PLAN)
