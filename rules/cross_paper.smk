# The cross-paper view: results/tables/{scale}/cross_paper.{csv,md}, every run configuration that
# cells of two or more selected tables hold (dataset, partition, noise, training, method; seeds
# left out), each table's reported number beside the one reproduction (fnlcore/app/cross_paper.py).
# Its inputs are metrics files of runs the selected tables already need: it adds no run.
from fnlcore.app.cross_paper import shared_groups

CROSS_PAPER = shared_groups(PLAN.tables)


rule cross_paper:
    """Set each table's reported number of a shared configuration beside its reproduction."""
    input:
        metrics=CROSS_PAPER.metrics_files(RESULTS),
        reported=CROSS_PAPER.reported_files(),
    output:
        csv=CROSS_PAPER.outputs(RESULTS)["csv"],
        md=CROSS_PAPER.outputs(RESULTS)["md"],
    log:
        f"{RESULTS}/logs/tables/{CROSS_PAPER.scale}/cross_paper.log",
    conda:
        "../envs/fnl.yaml"
    params:
        view=CROSS_PAPER,
        content=CROSS_PAPER.content_digest(),
        n_groups=len(CROSS_PAPER.groups),
        n_runs=len(CROSS_PAPER.runs()),
    # A count instead of Snakemake's list of every run's metrics file
    message:
        "cross-paper view: {params.n_groups} shared configuration(s), {params.n_runs} runs' metrics -> {output.md} (log: {log})"
    script:
        "../workflow_scripts/cross_paper.py"
