"""README's reference tables are generated from the registries; they must be current."""

from fnlcore import docs


def test_readme_generated_sections_are_current(repo_root):
    text = (repo_root / "README.md").read_text()
    assert docs.render(text) == text, "README.md is stale: run `python -m fnlcore.docs`"


def test_readme_starts_with_the_two_setup_commands(repo_root):
    text = (repo_root / "README.md").read_text()
    block = text.split("```bash", 1)[1].split("```", 1)[0].strip().splitlines()
    assert len(block) == 2
    assert "snakemake --cores" in block[0] and "pytest" in block[1]
    ci = (repo_root / ".ci" / "run").read_text()
    assert block[1].split("#")[0].strip() in ci  # CI runs the very test command README gives
