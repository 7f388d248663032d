from fnlcore.app.plan import build_plan, validate_schema
from fnlcore.app.summary import finished_message


def test_the_finished_message_names_existing_tables_and_the_report(tmp_path):
    plan = build_plan(validate_schema({"tables": ["demo"], "data_grid": [], "results_dir": str(tmp_path)}))
    assert "demo/demo" not in finished_message(plan) and "snakemake --report" in finished_message(plan)
    md = tmp_path / "tables" / "paper" / "demo" / "demo.md"  # results/tables/<scale>/<paper>/<table>
    md.parent.mkdir(parents=True)
    md.write_text("x")
    assert f"demo/demo: {md}" in finished_message(plan)
