"""Test-only start-up hook: caps the Slurm executor plugin's wait between status checks.

tests/test_slurm.py puts this folder first on the PYTHONPATH of the Snakemake processes it
starts (and so of ``fnl cell``'s Snakemake), where Python's ``site`` imports it at start-up.
It does nothing until ``snakemake_executor_plugin_slurm`` is imported; then it wraps the
plugin executor's ``next_seconds_between_status_checks`` setter so that no wait exceeds
``FNL_TEST_SLURM_MAX_POLL_SECONDS`` (default 2).

Why: snakemake-executor-plugin-slurm (2.8) adds 10 s to the wait after every status check
that finds no finished job (2, 12, 22, 32, ... s, up to 180 s) and only goes back to the
initial wait when a job finishes. A local job lasts 10-20 s (mostly Snakemake and torch
start-up), so each step of a chain of dependent jobs sat 20-30 s idle, finished, before
Snakemake saw it. Everything else -- sbatch, the squeue/sacct queries and how their
answers are read, retries, cancellation -- is the plugin's own code, unchanged.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

_PLUGIN = "snakemake_executor_plugin_slurm"


def _cap_backoff(executor_cls, cap: float) -> None:
    base = executor_cls.next_seconds_between_status_checks  # RemoteExecutor's property
    executor_cls.next_seconds_between_status_checks = property(
        base.fget, lambda self, seconds: base.fset(self, min(seconds, cap))
    )


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds the plugin with the normal finders, then patches its module once it has run."""

    def find_spec(self, name, path=None, target=None):
        if name != _PLUGIN:
            return None
        sys.meta_path.remove(self)  # one shot; also keeps the lookup below from recursing
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module
        cap = float(os.environ.get("FNL_TEST_SLURM_MAX_POLL_SECONDS", "2"))

        def exec_module(module):
            run_module(module)
            _cap_backoff(module.Executor, cap)

        spec.loader.exec_module = exec_module
        return spec


if _PLUGIN not in sys.modules:
    sys.meta_path.insert(0, _PatchOnImport())
