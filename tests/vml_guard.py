"""A guard that fails a recorded run the moment torch sends CPU floats through MKL's vector math.

On the CPU, torch computes ``sqrt``, ``exp``, ``log``, ``tanh``, ``erf``, ``sin`` and similar on
float32/float64 through MKL's vector math library (VML: ``vmsSqrt``, ``vmdLn``, ...). VML picks
its kernel by the CPU's maker and instruction set and ignores ``MKL_CBWR`` and
``ATEN_CPU_CAPABILITY``: on an AMD EPYC ``torch.sqrt`` of float32 is 1 ulp off the correctly
rounded result for about one value in six, on Intel it is not. No environment variable pins it,
so the code that recorded runs go through must not call it; fnlcore.numerics has the portable
forms. This guard is how a recorded run proves it: the portable worker (tests/portable.py)
runs every call under it.

``VML_OPS`` is what a breakpoint on every ``vms*``/``vmd*`` entry of libtorch_cpu saw, op by op,
on torch 2.13 (``pow`` with exponent ±0.5 reaches VML's square root; ``trunc``'s VML kernel is
exact on every CPU and is left out). ``python -m tests.vml_guard`` checks an op list against the
library itself under gdb, when gdb is installed.
"""

from __future__ import annotations

import traceback
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

VML_OPS = frozenset({
    "sqrt", "exp", "log", "log2", "log10", "sin", "cos", "tan", "tanh", "asin", "acos", "atan",
    "erf", "erfc", "erfinv",
})
_TORCH_DIR = str(Path(torch.__file__).resolve().parent)
_HERE = str(Path(__file__).resolve())
_FLOATS = (torch.float32, torch.float64)


class VMLCallError(RuntimeError):
    pass


def _base_name(func) -> str:
    """aten.sqrt_.default, aten._foreach_sqrt.Scalar, aten.sqrt.out -> 'sqrt'."""
    name = func.overloadpacket.__name__
    if name.startswith("_foreach_"):
        name = name[len("_foreach_"):]
    return name[:-1] if name.endswith("_") else name


def _cpu_floats(args, kwargs) -> list[torch.Tensor]:
    found = []

    def visit(a):
        if isinstance(a, torch.Tensor):
            if a.device.type == "cpu" and a.dtype in _FLOATS and a.numel():
                found.append(a)
        elif isinstance(a, (list, tuple)):
            for x in a:
                visit(x)

    visit(args)
    visit(list((kwargs or {}).values()))
    return found


def reaches_vml(func, args, kwargs) -> bool:
    """Whether this ATen call runs MKL's vector math on the CPU."""
    name = _base_name(func)
    if name == "pow":  # pow(x, ±0.5) is computed by the square-root kernel
        exponent = args[1] if len(args) > 1 else (kwargs or {}).get("exponent")
        if not isinstance(exponent, (int, float)) or abs(exponent) != 0.5:
            return False
        return bool(_cpu_floats(args[:1], None))
    if name == "_euclidean_dist":  # cdist's matrix-product form: its distances end in sqrt_
        return bool(_cpu_floats(args, kwargs))
    if name == "_cdist_forward":  # p = 2 takes the matrix-product form unless told not to (mode 2)
        p, mode = args[2], (args[3] if len(args) > 3 else None)
        return p == 2 and mode != 2 and bool(_cpu_floats(args, kwargs))
    return name in VML_OPS and bool(_cpu_floats(args, kwargs))


def caller() -> str:
    """The innermost frame outside torch and this module (who asked), and torch's frame it went through."""
    via = None
    for frame in reversed(traceback.extract_stack()):
        if frame.filename.startswith("<"):
            continue
        path = str(Path(frame.filename).resolve())
        if path == _HERE:
            continue
        if path.startswith(_TORCH_DIR):
            via = f"torch/{Path(path).relative_to(_TORCH_DIR)}:{frame.lineno} in {frame.name}"  # the outermost
            continue
        return f"{frame.filename}:{frame.lineno} in {frame.name}" + (f" (via {via})" if via else "")
    return "unknown caller"


class VMLGuard(TorchDispatchMode):
    """Raise VMLCallError on an ATen call that reaches VML (``collect=True``: record it and go on)."""

    def __init__(self, collect: bool = False):
        super().__init__()
        self.collect = collect
        self.calls: dict[tuple[str, str], int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if reaches_vml(func, args, kwargs):
            dtype = _cpu_floats(args, kwargs)[0].dtype
            where = caller()
            if not self.collect:
                raise VMLCallError(
                    f"{func} on a CPU {dtype} tensor, called from {where}: MKL's vector math gives other "
                    "bits on another CPU maker; use the portable form in fnlcore.numerics")
            key = (f"{func.overloadpacket.__name__} {dtype}", where)
            self.calls[key] = self.calls.get(key, 0) + 1
        return func(*args, **(kwargs or {}))


def _check_with_gdb() -> None:  # pragma: no cover - a maintenance check, needs gdb
    """Run each VML op under gdb with a breakpoint on every vms*/vmd* symbol and show what it hits."""
    import shutil
    import subprocess
    import sys
    import tempfile

    if not shutil.which("gdb") or not shutil.which("nm"):
        sys.exit("needs gdb and nm (Debian: gdb, binutils)")
    lib = Path(_TORCH_DIR) / "lib" / "libtorch_cpu.so"
    names = sorted({ln.split()[2] for ln in subprocess.run(["nm", str(lib)], capture_output=True, text=True).stdout
                    .splitlines() if len(ln.split()) == 3 and ln.split()[1] == "T" and ln.split()[2][:3] in ("vms", "vmd")
                    and ln.split()[2][3:4].isupper()})
    script = ["set pagination off", "set confirm off", "set breakpoint pending on"]
    for n in names:
        script += [f"break {n}", "commands", "silent", f'printf "HIT {n}\\n"', "cont", "end"]
    script.append("run")
    probe = "import torch\nx = torch.rand(4096) * 0.9 + 0.05\n" + "".join(
        f"print('OP {op}', flush=True); torch.{op}(x)\n" for op in sorted(VML_OPS))
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "cmds").write_text("\n".join(script) + "\n")
        (Path(tmp) / "probe.py").write_text(probe)
        out = subprocess.run(["gdb", "-batch", "-x", f"{tmp}/cmds", "--args", sys.executable, f"{tmp}/probe.py"],
                             capture_output=True, text=True).stdout
    op, hits = None, {}
    for line in out.splitlines():
        if line.startswith("OP "):
            op = line[3:]
        elif line.startswith("HIT ") and op:
            hits.setdefault(op, set()).add(line[4:])
    for op in sorted(VML_OPS):
        print(f"{op:8} {', '.join(sorted(hits.get(op, ()))) or 'NO VML CALL: remove it from VML_OPS'}")


if __name__ == "__main__":
    _check_with_gdb()
