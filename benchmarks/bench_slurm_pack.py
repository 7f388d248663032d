"""Packing training runs onto shared Slurm jobs: wall time and Slurm jobs of one table, packed or not.

    sudo scripts/local-slurm.sh start --with-dbd        # or any Slurm where this user may submit
    python benchmarks/bench_slurm_pack.py --pack 2       # the demo table at a tiny scale

Builds the demo table (12 training runs, 19 jobs) at a scale where each run takes seconds, from
scratch, twice in fresh folders with the repository's Slurm profile: once with one Slurm job
per training run, once with ``--groups train=pack --group-components pack=N`` (N runs per Slurm
job, sharing its one GPU: rules/train.smk). Every job of the workflow goes through Slurm both
times; the variants alternate over ``--repeats``. Prints markdown; asserts nothing.

What packing saves here is per-job overhead (submission, scheduling, the executor's status
checks, Snakemake's and torch's start-up inside each job). On a GPU cluster it also fills a
device that one small run leaves mostly idle; that part needs a GPU node to measure.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SUBMITTED = re.compile(r"submitted with SLURM jobid (\d+) \(log: \S*/slurm_logs/((?:rule|group)_[A-Za-z0-9_]+)/")
TINY = """\
num_clients: 3
seeds: [0]
training: {rounds: 3, eval_batch_size: 512}
noises:
  fednoro_hidn: {annotator_epochs: 1}
"""


def build(pack: int, poll: float) -> tuple[float, dict[str, int], int]:
    """(wall seconds, Slurm jobs by rule or group, return code) of one build of the demo table."""
    with tempfile.TemporaryDirectory(prefix="fnl-pack-") as tmp:
        wd = Path(tmp)
        (wd / "slurm").symlink_to(REPO / "slurm", target_is_directory=True)
        (wd / "scale.yaml").write_text(TINY)
        cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--profile", "slurm",
               "--config", "scale=scale.yaml", "data_grid=[]", "tables=[demo]",
               "--set-threads", "train=1", "--set-resources", "train:mem_mb=2000",
               "--slurm-init-seconds-before-status-checks", str(poll)]
        if pack > 1:
            cmd += ["--groups", "train=pack", "--group-components", f"pack={pack}"]
        t0 = time.perf_counter()
        res = subprocess.run(cmd, cwd=wd, capture_output=True, text=True, timeout=3600)
        wall = time.perf_counter() - t0
        jobs: dict[str, int] = {}
        for _, name in SUBMITTED.findall(res.stdout + res.stderr):
            jobs[name] = jobs.get(name, 0) + 1
        if res.returncode != 0:
            print((res.stdout + res.stderr)[-3000:], file=sys.stderr)
        return wall, jobs, res.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pack", type=int, default=2, help="training runs per Slurm job")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--poll", type=int, default=2, help="seconds before the executor's first status check")
    args = ap.parse_args()
    rows = []
    for _ in range(args.repeats):
        for pack in (1, args.pack):
            wall, jobs, rc = build(pack, args.poll)
            rows.append((pack, wall, jobs, rc))
    print(f"demo table, 12 training runs; --slurm-init-seconds-before-status-checks {args.poll}\n")
    print("| runs per Slurm job | wall s | Slurm jobs | of which training | exit |")
    print("|---|---|---|---|---|")
    for pack, wall, jobs, rc in rows:
        train = jobs.get("rule_train", 0) + jobs.get("group_pack_train", 0)
        print(f"| {pack} | {wall:.0f} | {sum(jobs.values())} | {train} | {rc} |")
    unpacked = [w for p, w, _, rc in rows if p == 1 and rc == 0]
    packed = [w for p, w, _, rc in rows if p == args.pack and rc == 0]
    if unpacked and packed:
        print(f"\nratio (unpacked / packed wall time): {sum(unpacked) / len(unpacked) / (sum(packed) / len(packed)):.2f}x")


if __name__ == "__main__":
    main()
