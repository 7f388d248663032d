"""What a finished workflow tells its user: where the tables are and how to see them."""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Sequence
from ..provenance import other_code_runs

# Options of the run that the report needs too: the same workflow, folder and configuration.
_KEEP_ONE = {"--snakefile", "-s", "--directory", "-d"}
_KEEP_MANY = {"--configfile", "--configfiles", "--config", "-C"}


def finished_message(plan, argv: Sequence[str] | None = None, cwd: str | None = None) -> str:
    """Paths of the configured tables that exist, and the report command as this user can run it."""
    lines, unbuilt = [], []
    for t in plan.tables:
        md = t.outputs(plan.results_dir)["md"]
        if Path(md).exists():
            lines.append(f"  {t.name}: {md} (also .html, .csv, .curves.png)")
        else:
            unbuilt.append(t.name)
    if lines:
        head = "Tables:"
    elif unbuilt:  # e.g. a run with --until noise, or a cell's runs only
        head = f"Artifacts are under {plan.results_dir}/ ({len(unbuilt)} configured table(s) not built yet)."
    else:
        head = f"Artifacts are under {plan.results_dir}/ (no table configured)."
    command = report_command(sys.argv if argv is None else argv, os.getcwd() if cwd is None else cwd)
    tail = f"Report with every table and figure: {command} (then open report.html)"
    return "\n".join(["", head, *lines, *other_code_warning(plan), tail, ""])


def other_code_warning(plan) -> list[str]:
    """A line when runs of the plan's tables were made by another code version (a code change alone
    reruns nothing, so this is where it shows); `fnl status` and the table footers name them."""

    done = [f for f in (run.files(plan.results_dir)["metrics"] for run in plan.runs()) if Path(f).exists()]
    other = other_code_runs(done)
    if not other:
        return []
    return [f"Warning: {len(other)} of {len(done)} runs of these tables were made by another code version than "
            "this one; `fnl status` and the tables' footers name them."]


def warn_when_nothing_to_do(workflow, plan) -> None:
    """Say :func:`other_code_warning` also when a run has nothing to do: Snakemake then returns
    before its ``onsuccess`` hook, yet after a code change alone that is exactly the run whose user
    must hear that the results were made by another code version. A no-op where Snakemake's logging
    API differs (the hook's message still comes whenever a job runs)."""
    try:
        # lazy: Snakemake (humanfriendly is its dependency) is absent from envs/labels.yaml and device checks
        from snakemake.common import NOTHING_TO_BE_DONE_MSG
        # lazy: Snakemake (humanfriendly is its dependency) is absent from envs/labels.yaml and device checks
        from snakemake.logging import logger
    except ImportError:
        return
    logger.handlers[:] = [h for h in logger.handlers if not isinstance(h, _AfterNothingToDo)]
    logger.addHandler(_AfterNothingToDo(workflow, plan, NOTHING_TO_BE_DONE_MSG))


class _AfterNothingToDo(logging.Handler):
    def __init__(self, workflow, plan, message: str) -> None:
        super().__init__(logging.INFO)
        self.workflow, self.plan, self.message = workflow, plan, message

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg != self.message or getattr(self.workflow, "dryrun", True):
            return
        lines = other_code_warning(self.plan)
        if lines:
            print("\n".join(["", *lines, ""]), file=sys.stderr)


def report_command(argv: Sequence[str], cwd: str) -> str:
    """``<the snakemake the user ran> <its workflow and config options> --report report.html``.

    The executable is written as the user can type it from ``cwd``: ``snakemake`` when that
    is the one on PATH, else its path (relative when under ``cwd``, e.g. ``.venv/bin/snakemake``);
    ``python -m snakemake`` stays a module call. Options that choose the workflow, the working
    directory and the configuration are kept, so the report covers the same targets.
    """
    return shlex.join([*_executable(argv[0] if argv else "snakemake", cwd), *_kept_options(argv[1:]),
                       "--report", "report.html"])


def _executable(argv0: str, cwd: str) -> list[str]:
    if Path(argv0).name == "__main__.py" and Path(argv0).parent.name == "snakemake":  # python -m snakemake
        return [_as_typed(sys.executable, cwd), "-m", "snakemake"]
    if not Path(argv0).name.startswith("snakemake"):  # Snakemake called from another program
        return ["snakemake"]
    on_path = shutil.which(Path(argv0).name)
    if on_path and _same_file(on_path, argv0, cwd):
        return [Path(argv0).name]
    return [_as_typed(argv0, cwd)]


def _same_file(a: str, b: str, cwd: str) -> bool:
    try:
        return os.path.samefile(a, os.path.join(cwd, b))
    except OSError:
        return False


def _as_typed(path: str, cwd: str) -> str:
    """A path relative to ``cwd`` when it lies under it (``.venv/bin/snakemake``), else absolute."""
    full = Path(cwd, path).absolute()
    try:
        rel = full.relative_to(Path(cwd).absolute())
    except ValueError:
        return str(full)
    return str(rel) if len(rel.parts) > 1 else f"./{rel}"


def _kept_options(args: Sequence[str]) -> list[str]:
    kept: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        name = arg.split("=", 1)[0]
        if name in _KEEP_ONE | _KEEP_MANY and "=" in arg:
            kept.append(arg)
        elif name in _KEEP_ONE and i + 1 < len(args):
            kept += args[i : i + 2]
            i += 1
        elif name in _KEEP_MANY:
            kept.append(arg)
            while i + 1 < len(args) and not args[i + 1].startswith("-"):
                i += 1
                kept.append(args[i])
        i += 1
    return kept
