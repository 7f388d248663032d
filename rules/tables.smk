# Paper tables: results/tables/{paper}/{table}.{csv,md,html,curves.png}


def _table(paper, table):
    for t in PLAN.tables:
        if t.paper == paper and t.table == table:
            return t
    raise ValueError(f"table {paper}/{table} is not selected in the configuration (key 'tables')")


def _table_inputs(w):
    t = _table(w.paper, w.table)
    files = [tr.run.files(RESULTS)["metrics"] for tr in t.runs]
    if t.reported is not None:
        files.append(str(t.reported))
    return files


rule table:
    """Aggregate a table's runs (mean ± std over seeds) and render it beside the reported numbers."""
    input:
        _table_inputs,
    output:
        csv=pattern("{results}/tables/{paper}/{table}.csv"),
        md=pattern("{results}/tables/{paper}/{table}.md"),
        html=report(
            pattern("{results}/tables/{paper}/{table}.html"),
            caption="../report/table.rst", category="Tables", subcategory="{paper}",
            labels={"paper": "{paper}", "table": "{table}", "view": "table"},
        ),
        curves=report(
            pattern("{results}/tables/{paper}/{table}.curves.png"),
            caption="../report/curves.rst", category="Tables", subcategory="{paper}",
            labels={"paper": "{paper}", "table": "{table}", "view": "curves"},
        ),
    params:
        table=lambda w: _table(w.paper, w.table),
        results=RESULTS,
        n_runs=lambda w: len(_table(w.paper, w.table).runs),
    log:
        pattern("{results}/logs/tables/{paper}/{table}.log"),
    # A count instead of Snakemake's list of every run's metrics file
    message:
        "table {wildcards.paper}/{wildcards.table}: {params.n_runs} runs' metrics -> {output.md} (log: {log})"
    script:
        "../workflow_scripts/make_table.py"
