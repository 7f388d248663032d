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
include: "rules/partition.smk"
include: "rules/noise.smk"
include: "rules/train.smk"
include: "rules/tables.smk"


rule all:
    default_target: True
    input:
        PLAN.targets(),
    # A count instead of Snakemake's list of every target (hundreds of paths for a paper)
    message:
        f"all: {len(PLAN.targets())} files ({len(PLAN.tables)} table(s): "
        + (", ".join(t.name for t in PLAN.tables) or "none")
        + f"; {len(PLAN.label_sets)} noisy label set(s) of the data grid) under {RESULTS}/"


onsuccess:
    # Say where the results are: the tables of this configuration and the report command.
    from fnlcore.app.summary import finished_message

    print(finished_message(PLAN), file=sys.stderr)
