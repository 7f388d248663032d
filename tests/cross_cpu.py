"""Run golden and contract cases natively and under emulated CPUs, and report any difference.

    .venv/bin/python -m tests.cross_cpu                       # the default set, native + Nehalem + EPYC-Rome
    .venv/bin/python -m tests.cross_cpu --golden fedavg gce --variants short --contract fedavg
    .venv/bin/python -m tests.cross_cpu --cpus native Skylake-Client --jobs 3

Each CPU runs the chosen cases in one child Python under portable numerics (tests/portable.py)
and the VML guard (tests/vml_guard.py); an emulated CPU is the same Python, unmodified, under
``qemu-x86_64 -cpu MODEL`` (Debian's package qemu-user), about ten times slower. Emulation cannot
reproduce a real chip's approximate instructions, but every library that picks its code by the
CPU it finds (MKL, oneDNN, OpenBLAS, NumPy, glibc) sees another CPU: ``EPYC-Rome`` answers
AuthenticAMD, and MKL's vector math then takes its AMD kernels (``--canary`` counts the float32
values of 65,536 whose torch.sqrt is not the correctly rounded root: 9,666 natively on a Xeon,
8,576 under Nehalem and EPYC-Rome: another kernel, other bits). A path that
depends on the CPU shows up as a difference; a portable one does not. Run it before any
re-record of tests/golden/methods.json. Golden results are also compared with the record.

Exit status: 0 when every CPU gave the same result for every case (and, for golden cases, the
recorded one), 1 otherwise. It is not part of the default test suite (it takes minutes a case).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from .golden import first_difference, load_golden
from .portable import REPO_ROOT, portable_env

DEFAULT_GOLDEN = ["fedavg", "fedprox", "fedcorr", "fedgr", "feddiv", "krum", "gce"]
DEFAULT_CONTRACT = DEFAULT_GOLDEN
DEFAULT_CPUS = ["native", "Nehalem", "EPYC-Rome"]


def _child(spec: dict) -> dict:
    """Runs in the child (under PORTABLE_ENV): {case: result or {'error': ...}}."""
    import traceback

    import numpy as np
    import torch

    from .golden import case_id, golden_cases, run_case
    from .vml_guard import VMLGuard

    out: dict = {}
    if spec.get("canary"):
        x = torch.arange(1, 65537, dtype=torch.float32) / 7
        out["canary: torch.sqrt vs correctly rounded (float32, 65,536 values)"] = {
            "differing": int((torch.sqrt(x).numpy() != np.sqrt(x.numpy())).sum())}
    for name, multi, variant in golden_cases():
        if name in spec["golden"] and variant in spec["variants"]:
            cid = case_id(name, multi, variant)
            try:
                with VMLGuard():
                    out[f"golden {cid}"] = run_case(name, multi, variant)
            except Exception:
                out[f"golden {cid}"] = {"error": traceback.format_exc(limit=-3)}
    if spec["contract"]:
        from .test_batched_contract import CASES, contract_case

        for name, multi in CASES:
            if name in spec["contract"]:
                try:
                    with VMLGuard():
                        out[f"contract {case_id(name, multi)}"] = {"gaps": contract_case(name, multi)}
                except Exception:
                    out[f"contract {case_id(name, multi)}"] = {"error": traceback.format_exc(limit=-3)}
    return out


def run_on(cpu: str, spec: dict) -> tuple[dict, float]:
    cmd = [sys.executable, "-m", "tests.cross_cpu", "--child", json.dumps(spec)]
    if cpu != "native":
        cmd = ["qemu-x86_64", "-cpu", cpu, *cmd]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=portable_env(), capture_output=True, text=True)
    if proc.returncode != 0 or not proc.stdout.strip():
        tail = "\n".join(proc.stderr.splitlines()[-15:])
        raise SystemExit(f"cross_cpu: the run on {cpu} failed (rc {proc.returncode}):\n{tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.cross_cpu", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpus", nargs="+", default=DEFAULT_CPUS, help="'native' and qemu -cpu models")
    ap.add_argument("--golden", nargs="*", default=DEFAULT_GOLDEN, help="methods of the golden set")
    ap.add_argument("--variants", nargs="+", default=["short", "long"], choices=["short", "long"])
    ap.add_argument("--contract", nargs="*", default=DEFAULT_CONTRACT, help="methods of the batched contract")
    ap.add_argument("--canary", action="store_true", help="also show that torch.sqrt itself differs by CPU")
    ap.add_argument("--jobs", type=int, default=len(DEFAULT_CPUS), help="CPUs run at once")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_child(json.loads(args.child))))
        return 0
    if any(c != "native" for c in args.cpus) and not shutil.which("qemu-x86_64"):
        sys.exit("cross_cpu: qemu-x86_64 not found: install Debian's qemu-user (apt-get install qemu-user)")
    spec = {"golden": args.golden, "variants": args.variants, "contract": args.contract, "canary": args.canary}
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        runs = dict(zip(args.cpus, pool.map(lambda c: run_on(c, spec), args.cpus)))
    golden = load_golden()
    ref_cpu = args.cpus[0]
    ref = runs[ref_cpu][0]
    bad = 0
    for cpu, (_, secs) in runs.items():
        print(f"{cpu}: {secs:.0f} s")
    for case in ref:
        line = []
        for cpu in args.cpus:
            got = runs[cpu][0].get(case)
            if isinstance(got, dict) and "error" in got:
                line.append(f"{cpu}: ERROR {got['error'].strip().splitlines()[-1]}")
                bad += 1
            elif case.startswith("canary"):
                continue
            elif cpu != ref_cpu and (d := first_difference(ref[case], got)):
                line.append(f"{cpu}: DIFFERS {d[:160]}")
                bad += 1
        if case.startswith("golden "):
            rec = golden.get(case.split(" ", 1)[1])
            if rec is None:
                line.append("no record")
            elif d := first_difference(rec, ref[case]):
                line.append(f"record: DIFFERS {d[:160]}")
                bad += 1
        if case.startswith("canary"):  # expected to differ: the library the guard keeps out
            line.insert(0, ", ".join(f"{c} {runs[c][0][case]['differing']}" for c in args.cpus)
                        + " (MKL's vector math; nothing recorded uses it)")
        print(f"{case:40s} {'; '.join(line) or 'identical' + (' (and the record)' if case.startswith('golden') else '')}")
    print(f"cross_cpu: {'every case identical on ' + ', '.join(args.cpus) if not bad else f'{bad} difference(s)'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
