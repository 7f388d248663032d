# Paper tables: results/tables/{scale}/{paper}/{table}.{csv,md,html,curves.png}
# The scale is part of the path: a smoke table never overwrites the paper-scale one.
# What Snakemake tracks (a plain rerun rebuilds the table when any of it changes):
#   input  -- every run's metrics file and the reported numbers;
#   params -- `content`, a digest of everything else that changes the table's numbers or
#             text (rows, columns, metrics and their summaries, tolerance, notes, the scale),
#             and `code`, the code version (the table's "Code versions" note depends on it).
# The outputs are update(): Snakemake keeps the last good table while the job runs and puts it
# back when the job fails (a truncated metrics file, a full disk), instead of deleting it.


rule table:
    """Aggregate a table's runs (mean ± std over seeds) and render it beside the reported numbers."""
    input:
        metrics=table_metrics,
        reported=table_reported,
    output:
        csv=update(pattern(TABLE, TABLE_FILES["csv"])),
        md=update(pattern(TABLE, TABLE_FILES["md"])),
        html=report(
            update(pattern(TABLE, TABLE_FILES["html"])),
            caption="../report/table.rst",
            category="Tables",
            subcategory="{paper}",
            labels={
                "paper": "{paper}",
                "table": "{table}",
                "scale": "{scale}",
                "view": "table",
            },
        ),
        curves=report(
            update(pattern(TABLE, TABLE_FILES["curves"])),
            caption="../report/curves.rst",
            category="Tables",
            subcategory="{paper}",
            labels={
                "paper": "{paper}",
                "table": "{table}",
                "scale": "{scale}",
                "view": "curves",
            },
        ),
    log:
        pattern("{results}/logs/tables/{scale}/{paper}/{table}.log"),
    conda:
        "../envs/fnl.yaml"
    params:
        table=paper_table,
        content=lambda w: paper_table(w).content_digest(),
        n_runs=lambda w: len(paper_table(w).runs),
        # tracked by Snakemake: after a code change alone (no run reruns) the table is built again,
        # so its "Code versions" note names the runs made by another code version than this one
        code=lambda w: code_version(),
    # A count instead of Snakemake's list of every run's metrics file
    message:
        "table {wildcards.paper}/{wildcards.table}: {params.n_runs} runs' metrics -> {output.md} (log: {log})"
    script:
        "../workflow_scripts/make_table.py"
