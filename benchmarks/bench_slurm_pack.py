"""Packing training runs onto shared Slurm jobs: wall time, Slurm jobs, and whether packed runs overlap.

    sudo scripts/local-slurm.sh start --with-dbd        # or any Slurm where this user may submit
    python benchmarks/bench_slurm_pack.py --pack 2       # the demo table at a tiny scale
    python benchmarks/bench_slurm_pack.py --pack 4 --cores 2 --rounds 60   # runs long enough to see overlap

Builds the demo table (12 training runs, 19 jobs) at a scale where each run takes seconds, from
scratch, in fresh folders with the repository's Slurm profile, once per variant:

- ``unpacked``: one Slurm job per training run;
- ``group``: ``--groups train=pack --group-components pack=N`` (README, rules/train.smk): Snakemake
  puts N runs into one Slurm job;
- ``rungroups``: the workflow's own run groups (config key ``run_groups=N``, docs/cluster.md "Run
  groups"): one ``train_group`` Slurm job per N runs of the same training settings trains them side
  by side, one process each; the runs' ``train`` jobs then link the outputs on the submit host;
- ``launcher``: the data, partitions and noise through Slurm (``--omit-from train``), then one
  ``sbatch`` per N runs whose job runs a plain local Snakemake with ``--cores C`` on those runs
  (C = min(N, --cores)), then the table through Slurm. This is not in the workflow: it is what a
  packed job must do to run its runs side by side, measured for comparison.

Every job goes through Slurm; the variants alternate over ``--repeats``. Prints markdown;
asserts nothing.

Overlap: a run is active from its log's first line (the job has started Python and torch) to
its last (its last round; the log's clock has 1 s resolution). For each Slurm job that held 2+
runs: its runs' wall time (first start to last end), the part of it during which 2+ of its runs
were active, and the sum of its runs' times. Runs are assigned to Slurm jobs from the Slurm logs
(kept with ``--slurm-keep-successful-logs``) or, for the launcher, from the targets it gave
each job. With snakemake-executor-plugin-slurm 2.8.0 / -jobstep 0.6.1 a group's runs ran one
after another (benchmarks/README.md, 2026-11-28).

What packing saves is per-job overhead (submission, scheduling, the executor's status checks,
Snakemake's and torch's start-up inside each job) and, where the runs of a job overlap, a
device that one small run leaves mostly idle; the GPU part needs a GPU node to measure.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SUBMITTED = re.compile(r"submitted with SLURM jobid (\d+) \(log: \S*/slurm_logs/((?:rule|group)_[A-Za-z0-9_]+)/")
METRICS = re.compile(r"results/runs/\S+?/metrics\.parquet")
LOG_TIME = re.compile(r"^(\d\d):(\d\d):(\d\d) ", re.M)
VARIANTS = ("unpacked", "group", "rungroups", "launcher")
TINY = """\
num_clients: 3
seeds: [0]
training: {{rounds: {rounds}, eval_batch_size: 512}}
noises:
  fednoro_hidn: {{annotator_epochs: 1}}
"""


def snakemake(wd: Path, *args: str, config: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"),
           "--config", "scale=scale.yaml", "data_grid=[]", "tables=[demo]", *config,
           "--set-threads", "train=1", "--set-resources", "train:mem_mb=2000", *args]
    res = subprocess.run(cmd, cwd=wd, capture_output=True, text=True, timeout=3600)
    if res.returncode != 0:
        print((res.stdout + res.stderr)[-3000:], file=sys.stderr)
    return res


def count_jobs(out: str, jobs: dict[str, int]) -> None:
    for _, name in SUBMITTED.findall(out):
        jobs[name] = jobs.get(name, 0) + 1


def run_interval(wd: Path, metrics: str) -> tuple[float, float] | None:
    """(start, end) epoch seconds of one run: its log's first and last lines (the log's clock has 1 s
    resolution). Not the outputs' mtimes: Snakemake touches a job's outputs when it checks them, and
    the outputs of a packed job were seen all carrying the job's end."""
    log = wd / "results" / "logs" / (str(Path(metrics).parent.relative_to("results")) + ".log")
    if not log.is_file():
        return None
    mtime = log.stat().st_mtime
    times = LOG_TIME.findall(log.read_text())
    if not times:
        return None
    day = dt.datetime.fromtimestamp(mtime)

    def at(hms: tuple[str, str, str]) -> float:
        return day.replace(hour=int(hms[0]), minute=int(hms[1]), second=int(hms[2]), microsecond=0).timestamp()

    end = at(times[-1])
    if end > mtime + 2:  # written just after midnight
        end -= 86400
    start = at(times[0])
    if start > end:  # the run began before midnight
        start -= 86400
    return start, end


def runs_by_job(wd: Path) -> dict[str, set[str]]:
    """Slurm job id -> the runs (metrics paths) its log names."""
    jobs: dict[str, set[str]] = {}
    for log in (wd / ".snakemake" / "slurm_logs").glob("*_train/**/*.log"):
        jobs.setdefault(log.stem, set()).update(METRICS.findall(log.read_text(errors="replace")))
    return jobs


def runs_by_group(wd: Path) -> dict[str, set[str]]:
    """Run group -> its runs (metrics paths), from the train_group jobs' records (fnlcore.app.run_group)."""
    import json

    return {rec.stem: {r["run"] + "/metrics.parquet" for r in json.loads(rec.read_text())["runs"]}
            for rec in (wd / "results" / "groups").glob("*.json")}


def active_at_least(intervals: list[tuple[float, float]], k: int) -> float:
    """Seconds during which at least k of the intervals are active."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    total, active, last = 0.0, 0, None
    for t, d in events:
        if last is not None and active >= k:
            total += t - last
        active += d
        last = t
    return total


def launcher(wd: Path, pack: int, cores: int | None, slurm: list[str],
             jobs: dict[str, int]) -> tuple[int, dict[str, set[str]]]:
    """Prerequisites through Slurm, one sbatch per `pack` runs (a local Snakemake inside), the rest through Slurm."""
    res = snakemake(wd, *slurm, "--omit-from", "train")
    count_jobs(res.stdout + res.stderr, jobs)
    if res.returncode != 0:
        return res.returncode, {}
    dry = snakemake(wd, "--dry-run", "--cores", "1")
    targets = sorted(set(METRICS.findall(dry.stdout)))
    cpus = min(pack, cores) if cores else pack
    procs = []
    for i in range(0, len(targets), pack):
        chunk = targets[i:i + pack]
        inner = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--cores", str(cpus),
                 "--nolock", *chunk, "--config", "scale=scale.yaml", "data_grid=[]", "tables=[demo]",
                 "--set-threads", "train=1", "--set-resources", "train:mem_mb=2000"]
        sbatch = ["sbatch", "--wait", "--parsable", "--job-name", "fnl-pack", f"--cpus-per-task={cpus}",
                  f"--mem={2000 * pack}", "--gres=gpu:1", "--output", str(wd / "launch-%j.log"),
                  "--wrap", " ".join(f"'{a}'" for a in inner)]
        procs.append((subprocess.Popen(sbatch, cwd=wd, stdout=subprocess.PIPE, text=True), chunk))
    by_job, rc = {}, 0
    for proc, chunk in procs:
        out, _ = proc.communicate(timeout=3600)
        rc = rc or proc.returncode
        by_job[out.strip().split(";")[0] or f"failed{len(by_job)}"] = set(chunk)
        jobs["launcher_train"] = jobs.get("launcher_train", 0) + 1
    if rc != 0:
        return rc, by_job
    res = snakemake(wd, *slurm)
    count_jobs(res.stdout + res.stderr, jobs)
    return res.returncode, by_job


def build(variant: str, pack: int, cores: int | None, rounds: int, poll: int) -> dict:
    """One build of the demo table from scratch: wall time, Slurm jobs, run intervals by Slurm job."""
    with tempfile.TemporaryDirectory(prefix="fnl-pack-") as tmp:
        wd = Path(tmp)
        (wd / "slurm").symlink_to(REPO / "slurm", target_is_directory=True)
        (wd / "scale.yaml").write_text(TINY.format(rounds=rounds))
        load = os.getloadavg()[0]
        slurm = ["--profile", "slurm", "--slurm-init-seconds-before-status-checks", str(poll),
                 "--slurm-keep-successful-logs", *(["--cores", str(cores)] if cores else [])]
        jobs: dict[str, int] = {}
        t0 = time.time()
        if variant == "launcher":
            rc, by_job = launcher(wd, pack, cores, slurm, jobs)
        elif variant == "rungroups":
            res = snakemake(wd, *slurm, config=(f"run_groups={pack}",))
            count_jobs(res.stdout + res.stderr, jobs)
            rc, by_job = res.returncode, runs_by_group(wd)
        else:
            extra = ["--groups", "train=pack", "--group-components", f"pack={pack}"] if variant == "group" else []
            res = snakemake(wd, *slurm, *extra)
            count_jobs(res.stdout + res.stderr, jobs)
            rc, by_job = res.returncode, runs_by_job(wd)
        wall = time.time() - t0
        found = (str(m.relative_to(wd)) for m in (wd / "results" / "runs").glob("**/metrics.parquet"))
        runs = {m: iv for m in found if (iv := run_interval(wd, m))}
        return {"variant": variant, "wall": wall, "jobs": jobs, "rc": rc, "load": load, "t0": t0,
                "runs": runs, "by_job": {j: sorted(r for r in ms if r in runs) for j, ms in by_job.items()}}


def summary(b: dict) -> dict:
    """Overlap numbers of one build."""
    ivs = list(b["runs"].values())
    packed = [[b["runs"][r] for r in rs] for rs in b["by_job"].values() if len(rs) >= 2]
    job_wall = sum(max(e for _, e in iv) - min(s for s, _ in iv) for iv in packed)
    return {
        "runs": len(ivs),
        "run_s": sum(e - s for s, e in ivs),
        "busy_s": active_at_least(ivs, 1),
        "two_s": active_at_least(ivs, 2),
        "packed_jobs": len(packed),
        "job_wall_s": job_wall,
        "job_run_s": sum(e - s for iv in packed for s, e in iv),
        "job_two_s": sum(active_at_least(iv, 2) for iv in packed),
    }


def short(metrics: str) -> str:
    parts = Path(metrics).parts  # results/runs/dataset/partition/pseed/noise/nseed/train/method/seed/metrics
    return f"{parts[5]}/{parts[8]}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pack", type=int, default=2, help="training runs per Slurm job")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--poll", type=int, default=2, help="seconds before the executor's first status check")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds per run (3: a run's log spans about 2 s here; 60: about 10 s)")
    ap.add_argument("--cores", type=int, default=None,
                    help="passed to Snakemake (--cores): the most CPUs one Slurm job may ask for, e.g. a node's "
                         "CPUs when N runs x 1 thread would ask for more; the launcher's jobs ask for min(N, this)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--timeline", action="store_true",
                    help="print each packed job's runs (seconds from the build's start)")
    args = ap.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    assert set(variants) <= set(VARIANTS), variants
    builds = [build(v, 1 if v == "unpacked" else args.pack, args.cores, args.rounds, args.poll)
              for _ in range(args.repeats) for v in variants]
    print(f"demo table, 12 training runs of {args.rounds} rounds; N = {args.pack} runs per packed job; "
          f"--cores {args.cores}; --slurm-init-seconds-before-status-checks {args.poll}\n")
    print("| variant | load | wall s | Slurm jobs | of which training | runs | sum of run s | runs active s "
          "| 2+ runs active | jobs of 2+ runs | their wall s | their sum of run s | 2+ active in them | exit |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for b in builds:
        s = summary(b)
        train = sum(n for name, n in b["jobs"].items()
                    if name in ("rule_train", "rule_train_group", "launcher_train") or name.startswith("group_"))
        frac = f"{s['two_s'] / s['busy_s']:.0%}" if s["busy_s"] else "-"
        jfrac = f"{s['job_two_s'] / s['job_wall_s']:.0%}" if s["job_wall_s"] else "-"
        print(f"| {b['variant']} | {b['load']:.1f} | {b['wall']:.0f} | {sum(b['jobs'].values())} | {train} "
              f"| {s['runs']} | {s['run_s']:.0f} | {s['busy_s']:.0f} | {frac} | {s['packed_jobs']} "
              f"| {s['job_wall_s']:.0f} | {s['job_run_s']:.0f} | {jfrac} | {b['rc']} |")
    print("\nruns active s: time during which at least one run was active; 2+ runs active: the part of it with two "
          "or more (any jobs); 2+ active in them: within each job of 2+ runs, the part of its runs' wall time "
          "(first start to last end) with two or more of its own runs active.")
    unpacked = [b["wall"] for b in builds if b["variant"] == "unpacked" and b["rc"] == 0]
    for v in [v for v in dict.fromkeys(variants) if v != "unpacked"] if unpacked else []:
        walls = [b["wall"] for b in builds if b["variant"] == v and b["rc"] == 0]
        if walls:
            ratio = sum(unpacked) / len(unpacked) / (sum(walls) / len(walls))
            print(f"\nratio (unpacked / {v} wall time): {ratio:.2f}x")
    if args.timeline:
        for b in builds:
            for job, rs in sorted(b["by_job"].items()):
                if len(rs) >= 2:
                    rel = {r: (b["runs"][r][0] - b["t0"], b["runs"][r][1] - b["t0"]) for r in rs}
                    spans = ", ".join(f"{short(r)} {rel[r][0]:.0f}-{rel[r][1]:.0f}" for r in sorted(rs, key=rel.get))
                    print(f"- {b['variant']}, Slurm job {job}: {spans}")


if __name__ == "__main__":
    main()
