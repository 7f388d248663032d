"""Portable numerics: a Python process whose float kernels give the same bits on every x86-64 CPU.

Torch, MKL, oneDNN, OpenBLAS and NumPy each pick kernels by the CPU they find (vector width,
vendor), and those kernels round differently: a record made on one machine is not the bits of
another. The variables below pin each library to one code path that every x86-64 machine runs
alike. They are read once, when a library loads, so they must be set before the process
imports torch or numpy: tests that compare recorded bits run their cases in a child process
started with them (``PortableWorker``), and ``python -m tests.golden`` re-executes itself
under them (``reexec_portable``).

Measured on an AVX-512 machine (docs/testing.md): without them, ``ATEN_CPU_CAPABILITY=avx2`` or
``MKL_CBWR=AVX2`` alone changes every golden record; with them, capping ATen, oneDNN, MKL,
OpenBLAS or NumPy's dispatch changes none. One library cannot be pinned by any variable: MKL's
vector math (torch's CPU sqrt, exp, log, ...), whose kernel follows the CPU's maker. The code
avoids it (fnlcore.numerics) and the worker proves it: every call runs under
tests/vml_guard.py (unless started with ``vml_guard=False``), which fails the call the moment a
VML-backed op runs on CPU floats.
``python -m tests.cross_cpu`` runs recorded cases under emulated CPUs (qemu-user) and natively
and reports any difference. This module imports neither torch nor numpy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
MARK = "FNL_PORTABLE_NUMERICS"

PORTABLE_ENV = {
    # ATen's scalar kernels, not the AVX2/AVX-512 builds (also its CPU normal sampler, which
    # has an AVX2 form: weight initialisation depends on it)
    "ATEN_CPU_CAPABILITY": "default",
    # MKL's conditional numerical reproducibility: one code path on Intel and AMD alike
    "MKL_CBWR": "COMPATIBLE",
    # oneDNN's JIT kernels at the lowest ISA it supports (convolutions, when it takes them)
    "ONEDNN_MAX_CPU_ISA": "SSE41",
    # OpenBLAS (NumPy's and SciPy's: scikit-learn's GMMs) at one core type every x86-64-v2 has
    "OPENBLAS_CORETYPE": "Nehalem",
    # NumPy's dispatched loops (exp, log, sorting...) at its x86-64-v2 baseline
    "NPY_DISABLE_CPU_FEATURES": "X86_V3,X86_V4,AVX512_ICL,AVX512_SPR",
    # glibc's libm (exp, log, pow, sin, tan, atan in float64: NumPy's loops above fall back to it, and
    # torch's scalar kernels call it) has FMA/AVX2 variants chosen by CPU; their last bits differ
    # (seen: exp, sin, tan, pow, atan of 4M random doubles). These are the names glibc 2.36 reads
    # (``ld.so --list-diagnostics`` shows the active feature words change; the old *_Usable ones do not)
    "GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX,-AVX2,-FMA,-FMA4",
    # one thread everywhere: a GEMM's blocking, and so its sums, can follow the thread count
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    MARK: "1",
}


def portable_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (the current environment) with every variable of PORTABLE_ENV set over it."""
    env = dict(os.environ if base is None else base)
    env.update(PORTABLE_ENV)
    env.setdefault("FNL_PLUGINS", "tests.support.plugins")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def is_portable() -> bool:
    """Whether this process was started under PORTABLE_ENV (a later ``os.environ`` edit is too late)."""
    return all(os.environ.get(k) == v for k, v in PORTABLE_ENV.items())


def reexec_portable(module: str) -> None:
    """Replace this process by ``python -m module <same args>`` under PORTABLE_ENV, unless it is one.

    Call before torch or numpy is imported.
    """
    if is_portable():
        return
    if "torch" in sys.modules or "numpy" in sys.modules:
        raise RuntimeError("reexec_portable must run before torch or numpy is imported")
    os.execve(sys.executable, [sys.executable, "-m", module, *sys.argv[1:]], portable_env())


class PortableWorker:
    """A child Python under PORTABLE_ENV that answers calls of one function, one JSON line each.

    ``call(*args)`` sends the arguments as a JSON list and returns the function's JSON result;
    the child stays up between calls (torch is imported once). A call that raises in the child
    raises ``PortableWorkerError`` here with the child's traceback.
    """

    def __init__(self, target: str, vml_guard: bool = True):
        self.target = target  # "module:function"
        self.vml_guard = vml_guard  # every call under tests/vml_guard.py (it makes a call ~2x slower)
        self._proc: subprocess.Popen | None = None

    def _start(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "tests.portable", self.target, *([] if self.vml_guard else ["--no-vml-guard"])],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, text=True,
                cwd=REPO_ROOT, env=portable_env(),
            )
        return self._proc

    def call(self, *args):
        proc = self._start()
        proc.stdin.write(json.dumps(list(args)) + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        if not line:
            raise PortableWorkerError(f"the portable worker for {self.target} exited (rc {proc.wait()}); see stderr")
        reply = json.loads(line)
        if "error" in reply:
            raise PortableWorkerError(reply["error"])
        return reply["result"]

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._proc = None


class PortableWorkerError(RuntimeError):
    pass


def numerics_report() -> dict:
    """What the float libraries of this process chose (tests/test_golden.py checks a worker's)."""
    import threadpoolctl
    import torch

    return {
        "aten": torch.backends.cpu.get_cpu_capability(),
        "blas": sorted({str(i.get("architecture")) for i in threadpoolctl.threadpool_info() if i["internal_api"] == "openblas"}),
        "torch_threads": torch.get_num_threads(),
        "portable": is_portable(),
    }


def _serve(target: str, vml_guard: bool = True) -> None:
    import contextlib
    import importlib
    import traceback

    if not is_portable():
        sys.exit("tests.portable: started without PORTABLE_ENV; use PortableWorker")
    from .vml_guard import VMLGuard

    module, func = target.split(":")
    fn = getattr(importlib.import_module(module), func)
    out = sys.stdout
    sys.stdout = sys.stderr  # whatever the function prints must not break the protocol
    for line in sys.stdin:
        try:
            with VMLGuard() if vml_guard else contextlib.nullcontext():
                reply = {"result": fn(*json.loads(line))}
        except Exception:  # the test that called reports it
            reply = {"error": traceback.format_exc()}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    _serve(sys.argv[1], "--no-vml-guard" not in sys.argv[2:])
