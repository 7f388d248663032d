"""``fnl``: the user's commands over the same workflow.

    fnl tables [--scale S]                       papers, tables and their cells (done / pending / n.i.)
    fnl status                                   runs of the configured tables: done, running (and which
                                                 process writes it) or interrupted, failed, pending
    fnl plan [--scale S] [--tables T ...] [--device D | --gpu NAME] [--threads N] [--calibration F] [--recalibrate]
                                                 runs and estimated device-hours of tables, from step costs
                                                 measured on this machine (cached in --calibration), else the
                                                 shipped ones (benchmarks/step_costs.json); --recalibrate measures;
                                                 --gpu h200 prices that GPU from any machine (unmeasured shapes
                                                 estimated from its measured ones, never from a CPU's)
    fnl rehearse [--tables T ...] [--scale S] [--device D] [--steps N] [--per-round M] [--only KEY ...] [--out DIR] [--resume | --merge CSV ...]
                                                 every distinct training configuration started, checkpointed,
                                                 killed (SIGKILL), resumed and finished on a stand-in of its
                                                 data; peak memory, checkpoint bytes, s/step in DIR/rehearsal.csv
    fnl cell PAPER TABLE --row ROW --col COL [--seed S] [--scale S] [--dry] [-- SNAKEMAKE ARGS]
                                                 print the runs behind one cell, build them with Snakemake,
                                                 then print the cell's value (per seed and over the seeds)

tables, status, plan, rehearse and cell take [--configfile F] [--config K=V ...] and read the
configuration as the workflow does (config/config.yaml, then F, then K=V, as Snakemake merges them):
its `scale` and `results_dir` (and, for plan and rehearse, the `tables` that F or K=V set) unless
--scale, --results or --tables say otherwise; status reads every key, and cell hands F and K=V on to
Snakemake.

Everything after ``--`` goes to Snakemake unchanged (``--cores 2``, ``--profile slurm``,
``--forcerun train`` to recompute runs that already exist, ...). Run from the repository root.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time
from pathlib import Path

from .errors import ConfigError

# The commands import what they use inside their functions (each marked `# lazy:`): `fnl --help`
# and argument errors answer at once, without loading torch, pandas or Snakemake.

REPO = Path(__file__).resolve().parent.parent


def _tables(scale: str, paper: str | None = None):
    """Tables of one paper (or of all papers) at a scale; a cell needs only its own paper."""
    from .app.papers import Scale, load_paper  # lazy: fnl --help start-up (note at the top)
    from .app.runs import PAPERS_DIR  # lazy: fnl --help start-up (note at the top)

    sc = Scale.load(scale)
    papers = [paper] if paper else [p.stem for p in sorted(PAPERS_DIR.glob("*.yaml"))]
    return [t for p in papers for t in load_paper(p, sc)]


def _find(tables, paper: str, table: str):
    for t in tables:
        if t.paper == paper and t.table == table:
            return t
    valid = ", ".join(f"{t.paper} {t.table}" for t in tables)
    raise ConfigError(f"no table {paper!r} {table!r}; valid (paper table): {valid}")


def cell_runs(pt, row: str, col: str, seed: int | None = None):
    """The runs of one cell; unknown names list the valid ones."""
    rows = [r.label for r in pt.spec.rows]
    cols = [c.label for c in pt.spec.columns]
    if row not in rows:
        raise ConfigError(f"table {pt.name}: no row {row!r}; valid rows: {', '.join(map(repr, rows))}")
    if col not in cols:
        raise ConfigError(f"table {pt.name}: no column {col!r}; valid columns: {', '.join(map(repr, cols))}")
    derived = next(c.average_of for c in pt.spec.columns if c.label == col)
    if derived:
        raise ConfigError(
            f"table {pt.name}: column {col!r} is the average of {list(derived)} and runs nothing; run those cells"
        )
    status = next(r.status for r in pt.spec.rows if r.label == row)
    if status != "implemented":
        raise ConfigError(f"table {pt.name}: row {row!r} is not implemented yet (rendered as n.i.)")
    runs = [tr.run for tr in pt.runs if tr.row == row and tr.column == col]
    if seed is not None:
        seeds = sorted({r.seed for r in runs})
        runs = [r for r in runs if r.seed == seed]
        if not runs:
            raise ConfigError(f"table {pt.name}: seed {seed} is not among the table's seeds {seeds}")
    return runs


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    ap = argparse.ArgumentParser(prog="fnl", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tables", help="list papers, tables and cell counts")
    _scale_results_arguments(t)
    _config_arguments(t)
    st = sub.add_parser("status", help="running and failed runs of the configured tables")
    _config_arguments(st)
    pl = sub.add_parser("plan", help="runs and estimated device-hours of tables at a scale")
    pl.add_argument("--tables", nargs="+",
                    help='"paper" or "paper/table" (default: the tables --configfile/--config set, else every table)')
    _scale_results_arguments(pl)
    _config_arguments(pl)
    pl.add_argument("--device", default="auto", help="auto | cpu | cuda: where the step costs are measured")
    pl.add_argument("--gpu", metavar="NAME",
                    help="price the runs on the GPU named NAME (e.g. h200: part of its name) from its shipped step "
                         "costs, on any machine: shapes it never measured are estimated from the ones it did")
    pl.add_argument("--threads", type=int, default=1, help="torch threads on a CPU (a train job's, 1 by default)")
    pl.add_argument("--calibration", help="step-cost cache (default: RESULTS/plan/step_costs.json)")
    pl.add_argument("--recalibrate", action="store_true",
                    help="measure every step shape of the plan on this device (minutes, with progress and an "
                         "estimate of how long); without it, shapes not measured here take the shipped step costs "
                         "(benchmarks/step_costs.json)")
    rh = sub.add_parser("rehearse", help="start, checkpoint, kill and resume every training configuration once")
    _rehearse_arguments(rh)
    dc = sub.add_parser("device-check", help="measure a GPU node in one go (methods vs the CPU, speed, syncs, "
                                             "step costs, rehearsal), within a time budget")
    _device_check_arguments(dc)
    c = sub.add_parser("cell", help="build the runs behind one table cell")
    c.add_argument("paper")
    c.add_argument("table")
    c.add_argument("--row", required=True)
    c.add_argument("--col", required=True)
    c.add_argument("--seed", type=int)
    _scale_results_arguments(c)
    _config_arguments(c)
    c.add_argument("--dry", action="store_true", help="print the targets only")
    args = ap.parse_args(argv)
    if args.cmd == "device-check":
        try:
            return _device_check(args, argv)
        except ConfigError as err:
            print(f"fnl: {err}", file=sys.stderr)
            return 2
    if args.cmd == "rehearse":
        try:
            return _rehearse(args)
        except ConfigError as err:
            print(f"fnl: {err}", file=sys.stderr)
            return 2
    if args.cmd in ("status", "plan"):
        try:
            return _status(args.configfile, args.config) if args.cmd == "status" else _plan(args)
        except ConfigError as err:
            print(f"fnl: {err}", file=sys.stderr)
            return 2
    try:
        _scale_and_results_from_config(args)
        tables = _tables(args.scale, None if args.cmd == "tables" else args.paper)
        if args.cmd == "tables":
            return _list(tables, args.results)
        pt = _find(tables, args.paper, args.table)
        runs = cell_runs(pt, args.row, args.col, args.seed)
    except ConfigError as err:
        print(f"fnl: {err}", file=sys.stderr)
        return 2
    targets = [r.files(args.results)["metrics"] for r in runs]
    print("\n".join(targets))
    if args.dry:
        return 0
    busy = _workflow_holding(args.results)
    if busy:
        print(busy, file=sys.stderr)
        return 1
    rc = subprocess.call(cell_command(pt, args.scale, args.results, targets, extra,
                                      configfile=args.configfile, config=args.config))
    if rc != 0 and any(Path(".snakemake", "locks").glob("*")):
        print(_snakemake_lock_note(args.results), file=sys.stderr)
    if rc == 0:
        from .app.cell_value import cell_report  # lazy: fnl --help start-up (note at the top)

        print(cell_report(pt, args.row, args.col, args.results, args.seed, args.scale), flush=True)
    return rc


def _scale_results_arguments(p) -> None:
    p.add_argument("--scale", help="paper | smoke | a scale file (default: the configuration's `scale`, paper)")
    p.add_argument("--results", help="the results folder (default: the configuration's `results_dir`, results)")


def _config_arguments(p) -> None:
    p.add_argument("--configfile", help="a config file over config/config.yaml, as Snakemake's --configfile")
    p.add_argument("--config", nargs="+", default=[], metavar="KEY=VALUE",
                   help="values over the config files, as Snakemake's --config "
                        "(e.g. 'tables=[\"fednoro/1\"]' scale=smoke)")


def _scale_and_results_from_config(args) -> dict:
    """Fill ``--scale`` and ``--results`` left unset from the configuration the workflow would read
    with the same ``--configfile`` / ``--config`` (config/config.yaml alone: paper, results)."""
    merged = status_config(args.configfile, args.config)
    args.scale = args.scale or merged.get("scale") or "paper"
    args.results = args.results or merged.get("results_dir") or "results"
    return merged


def _configured_plan(args, merged: dict):
    """The plan of ``--tables``, else of the tables ``--configfile``/``--config`` set, else of every table,
    at ``args.scale`` in ``args.results``; with those options the rest of that configuration counts too
    (``merged``, e.g. dataset options)."""
    from .app.plan import build_plan, validate_schema  # lazy: fnl --help start-up (note at the top)
    from .app.runs import PAPERS_DIR  # lazy: fnl --help start-up (note at the top)

    chosen = status_config(args.configfile, args.config, base=False).get("tables")
    selected = args.tables or chosen or [p.stem for p in sorted(PAPERS_DIR.glob("*.yaml"))]
    settings = {"tables": selected, "scale": args.scale, "data_grid": [], "results_dir": args.results}
    return build_plan(validate_schema({**merged, **settings} if args.configfile or args.config else settings))


def _workflow_holding(results: str) -> str | None:
    """The message for a results folder a running workflow holds (None when none does): Snakemake
    would stop with its own LockException and advise --unlock, which is unsafe while it runs."""
    from .app.results_lock import results_holder  # lazy: fnl --help start-up (note at the top)

    holder = results_holder(results)
    if holder is None:
        return None
    return (f"fnl: results folder {results!r} is in use by a running workflow ({holder}). Wait until it ends, "
            "or build this cell in a folder of its own (--results DIR). Do not run `snakemake --unlock` "
            "meanwhile: the lock it removes is that workflow's, which is not stale.")


def _snakemake_lock_note(results: str) -> str:
    """After Snakemake failed with its own lock left in this directory: what is known about it."""
    from .app.results_lock import results_holder  # lazy: fnl --help start-up (note at the top)

    holder = results_holder(results)
    if holder is not None:
        return (f"fnl: a workflow is running on {results!r} ({holder}); if Snakemake said the directory cannot be "
                "locked, wait until it ends: do not --unlock.")
    return (f"fnl: no workflow holds {results!r}. If Snakemake said the directory cannot be locked: unless another "
            "Snakemake runs in this directory (`pgrep -af snakemake`), its lock is left from a killed one; then "
            "`snakemake --unlock` and the same command are safe.")


# Options that say how many jobs run; without one, a cell runs on one core.
_PARALLELISM = ("--cores", "-c", "--jobs", "-j", "--profile", "--executor", "-e")


def cell_command(pt, scale: str, results: str, targets: list[str], extra: list[str],
                 configfile: str | None = None, config: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The Snakemake command of one cell: targets right after ``--snakefile`` (a single-valued
    option), so no option of the user's, however many values it takes (``--forcerun train``,
    ``--configfile f.yaml``), can swallow them; then ``fnl cell``'s own ``--configfile``, and one
    ``--config`` with its ``--config`` values followed by the cell's (which win); the user's
    arguments after ``--`` come last."""
    cores = [] if any(a == p or a.startswith(p + "=") for a in extra for p in _PARALLELISM) else ["--cores", "1"]
    return [
        sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), *targets,
        *(["--configfile", configfile] if configfile else []),
        # run_groups=1: only this cell's runs train (a run group would train other cells' runs too)
        "--config", *config, f"tables=[\"{pt.paper}/{pt.table}\"]", f"scale={scale}", "data_grid=[]",
        f"results_dir={results}", "run_groups=1",
        *cores, *extra,
    ]


def run_log(run, results: str) -> Path:
    """The job log of a training run (results/logs/runs/...)."""
    metrics = run.files(results)["metrics"]
    return Path(metrics.replace(f"{results}/runs/", f"{results}/logs/runs/", 1).rsplit("/", 1)[0] + ".log")


def run_status(run, results: str) -> str:
    """done | running (a checkpoint or a log, no outputs yet: being written or interrupted) | failed | pending."""
    if Path(run.files(results)["metrics"]).exists():
        return "done"
    log = run_log(run, results)
    if log.exists() and " ERROR " in log.read_text(errors="replace"):
        return "failed"
    if Path(run.checkpoint(results)).exists() or log.exists():
        return "running"
    return "pending"


def run_writer(run, results: str) -> str:
    """Who writes a started run now: the live process holding its lock, or that none does."""
    from .app.results_lock import run_holder  # lazy: fnl --help start-up (note at the top)

    holder = run_holder(run.checkpoint(results))
    if holder is not None:
        return f"being written by {holder}"
    if Path(run.checkpoint(results)).exists():
        return "interrupted: no process writes it; the next workflow resumes it from its checkpoint"
    return "interrupted before its first checkpoint: the next workflow starts it over"


STATUS_ORDER = ("failed", "running", "pending", "done")


def status_config(configfile: str | None = None, config: list[str] | None = None, base: bool = True) -> dict:
    """The configuration the workflow reads for the same options: config/config.yaml (``base``;
    without it, what the options alone set), then ``configfile``, then ``config`` (KEY=VALUE
    strings), merged as Snakemake merges them."""
    from .schemas import load_yaml  # lazy: fnl --help start-up (note at the top)

    merged = load_yaml(REPO / "config" / "config.yaml") if base else {}
    if not (configfile or config):
        return merged
    # Snakemake's own merge and KEY=VALUE parser; imported only when an option asks for them
    from snakemake.cli import parse_config  # lazy: fnl --help start-up (note at the top)
    from snakemake.utils import update_config  # lazy: fnl --help start-up (note at the top)

    if configfile:
        update_config(merged, load_yaml(configfile))
    try:
        update_config(merged, parse_config(config or []))
    except ValueError as err:
        raise ConfigError(f"--config: {err}") from None
    return merged


def _status(configfile: str | None = None, config: list[str] | None = None) -> int:
    """Every run of the configured tables, failed and running first, each with its log; a
    started run says whether a live process writes it. On stderr: what was read and whether
    a workflow runs on the results folder."""
    from .app.plan import build_plan, validate_schema  # lazy: fnl --help start-up (note at the top)
    from .app.results_lock import results_holder  # lazy: fnl --help start-up (note at the top)

    plan = build_plan(validate_schema(status_config(configfile, config)))
    results = plan.results_dir
    names = ", ".join(t.name for t in plan.tables) or "no table"
    read = " + ".join(["config/config.yaml", *([configfile] if configfile else []), *(["--config"] if config else [])])
    holder = results_holder(results)
    workflow = f"a workflow is running on it ({holder})" if holder else "no workflow is running on it"
    print(f"fnl status: {names} ({len(plan.runs())} runs) from {read}; results in {results}/: {workflow}",
          file=sys.stderr)
    groups: dict[str, list] = {k: [] for k in ("done", "running", "failed", "pending")}
    for run in plan.runs():
        groups[run_status(run, results)].append(run)
    print("  ".join(f"{k} {len(v)}" for k, v in groups.items()))
    for kind in STATUS_ORDER:
        for run in groups[kind]:
            log = run_log(run, results)
            where = f"  log: {log}" if log.exists() else ""
            writer = f"  ({run_writer(run, results)})" if kind == "running" else ""
            print(f"{kind:8s} {run.files(results)['metrics'].rsplit('/', 1)[0]}{where}{writer}")
    # done runs of another code version: a code change alone reruns nothing, so say so (on
    # stderr, after the listing that scripts read)
    # lazy: fnl --help start-up (note at the top)
    from .provenance import other_code_runs, other_code_text

    done = [run.files(results)["metrics"] for run in groups["done"]]
    other = other_code_text(other_code_runs(done), total=len(done))
    if other:
        print(f"Warning: {other}", file=sys.stderr)
    return 1 if groups["failed"] else 0


def _plan(args) -> int:
    """Print the runs and estimated device-hours of the selected tables (fnlcore/app/cost.py).

    A GPU (``--device cuda`` here, or ``--gpu NAME`` from any machine) is priced from that GPU's
    measurements only, a shape it never measured estimated from them (fnlcore/app/gpu_cost.py)."""
    import torch  # lazy: fnl --help start-up (note at the top)

    # lazy: fnl --help start-up (note at the top)
    from .app.cost import Calibration, Pricing, estimate_plan, format_estimate, gpu_step_costs, step_shape
    from .app.counts import ShapeCounts  # lazy: fnl --help start-up (note at the top)
    from .app.gpu_cost import find_gpu  # lazy: fnl --help start-up (note at the top)
    # lazy: fnl --help start-up (note at the top)
    from .app.measurements import device_memory_mb, own_step_costs, shipped_step_costs, shipped_step_costs_path
    from .app.resources import resource_columns  # lazy: fnl --help start-up (note at the top)
    from .fl.context import check_device, resolve_device  # lazy: fnl --help start-up (note at the top)

    if args.gpu is not None and not args.gpu.strip():
        raise ConfigError("--gpu: name a GPU, e.g. --gpu h200 (part of its name in benchmarks/step_costs.json)")
    if args.gpu and (args.device != "auto" or args.recalibrate):
        raise ConfigError(f"--gpu {args.gpu} prices a GPU that is not here from its shipped step costs: it takes "
                          "neither --device nor --recalibrate (on a node of that GPU: --device cuda [--recalibrate])")
    if args.threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {args.threads}")
    device = None
    if not args.gpu:
        check_device(args.device, where="--device")  # refused up front: no CUDA device here, or not a device
        device = resolve_device(args.device)
        torch.set_num_threads(args.threads)
    plan = _configured_plan(args, _scale_and_results_from_config(args))
    path = args.calibration or str(own_step_costs(args.results))
    progress = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    counts = ShapeCounts(Path(args.results) / "plan" / "shape_counts.json", progress=progress)
    options = {name: ds.options for name, ds in plan.datasets.items()}
    shapes = list({s.key(): s for s in (step_shape(r, options.get(r.dataset)) for r in plan.runs())}.values())
    files = [path, shipped_step_costs_path()]
    if args.gpu or device.type == "cuda":
        if args.gpu:
            description = find_gpu(args.gpu, files)
            memory = (device_memory_mb(description) or 0) * 2**20 or None
        else:
            from .app.cost import device_description  # lazy: fnl --help start-up (note at the top)

            description = device_description(device)
            memory = torch.cuda.get_device_properties(device).total_memory
        # that GPU's measurements (here, or shipped), the rest estimated from them; never a CPU's
        pricing, fallback = gpu_step_costs(shapes, description, files, counts, memory)
        calibration = Calibration(path, device, refresh=args.recalibrate, fallback=fallback, description=description)
    else:
        # the project's shipped step costs of this CPU kind stand in for the shapes not measured
        # here (a plan in seconds); --recalibrate measures every shape here, estimating how long from them
        pricing = Pricing("cpu", None, counts)
        calibration = Calibration(path, device, refresh=args.recalibrate, fallback=shipped_step_costs("cpu"))
    cost = estimate_plan(plan, calibration, progress=progress, pricing=pricing)
    print(format_estimate(cost, calibration, args.scale,
                          resource_columns(plan, args.results, gpu=pricing.device_type == "cuda", run_costs=cost.runs,
                                           cost_sources={k: calibration.source(k) for k in calibration.fallback}
                                           | {k: calibration.source(k) for k in calibration.entries})))
    return 0


def _rehearse_arguments(rh) -> None:
    rh.add_argument("--tables", nargs="+",
                    help='"paper" or "paper/table" (default: the tables --configfile/--config set, else every table)')
    _scale_results_arguments(rh)
    _config_arguments(rh)
    rh.add_argument("--device", default="cpu", help="cpu | cuda | auto: where the configurations train")
    rh.add_argument("--steps", type=int, default=1, help="local steps of a client update (default 1)")
    rh.add_argument("--per-round", type=int, default=0,
                    help="train at most this many clients a round (default 0: the run's own count)")
    rh.add_argument("--pass-clients", type=int, default=0,
                    help="train at most this many clients a round of a pass over every client before the rounds "
                         "(FedCorr's pre-processing, FedDiv's warm-up; each pass then in two groups), the rounds "
                         "keeping every client (default 0: every client, one a round)")
    rh.add_argument("--rounds", type=int, default=4, help="rounds of each rehearsal, stage boundaries scaled along")
    rh.add_argument("--eval-samples", type=int, default=32, help="test samples scored a round")
    rh.add_argument("--threads", type=int, default=2, help="torch threads on a CPU")
    rh.add_argument("--only", nargs="+", metavar="KEY", help="rehearse only these configurations (keys)")
    rh.add_argument("--list", action="store_true", help="print the configurations and their cell counts only")
    rh.add_argument("--out", help="where rehearsal.csv and rehearsal.md go (default: RESULTS/plan)")
    rh.add_argument("--resume", action="store_true",
                    help="keep the passed rows of OUT/rehearsal.csv measured with the same options; rehearse the rest")
    rh.add_argument("--merge", nargs="+", metavar="CSV",
                    help="rehearse nothing: write OUT/rehearsal.csv and .md from these tables (shards run with "
                         "--only elsewhere); per configuration the last measured row")


def _rehearse(args) -> int:
    """Rehearse the selected tables' configurations (fnlcore/app/rehearse.py); 1 when one did not pass."""

    from .app.measurements import rehearsal_csv  # lazy: fnl --help start-up (note at the top)
    # lazy: fnl --help start-up (note at the top)
    from .app.rehearse import Options, distinct_configs, earlier_rows, merge_tables, rehearse, write_rehearsal
    from .fl.context import check_device  # lazy: fnl --help start-up (note at the top)

    if not (args.list or args.merge):  # they train nothing; a rehearsal is refused before any work
        check_device(args.device, where="--device")
    for name in ("steps", "rounds", "eval_samples", "threads"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.per_round < 0:
        raise ConfigError(f"--per-round must be >= 0 (0: every client of the round), got {args.per_round}")
    if args.pass_clients < 0:
        raise ConfigError(f"--pass-clients must be >= 0 (0: every client, one a round), got {args.pass_clients}")
    plan = _configured_plan(args, _scale_and_results_from_config(args))
    args.out = args.out or str(Path(args.results) / "plan")
    if args.list:
        for key, r in distinct_configs(plan).items():
            print(f"{len(r.cells):5d} cells  {key}")
        return 0
    if args.merge:
        if args.resume or args.only:
            raise ConfigError("--merge rehearses nothing: give it without --resume and --only")
        rows = merge_tables(plan, [Path(p) for p in args.merge], log=print)
        total = len(distinct_configs(plan))
        header = (f"Rehearsal of {len(rows)} of the {total} configurations of {len(plan.tables)} tables at scale "
                  f"{args.scale}, merged from {len(args.merge)} table(s); each row's options are its `rehearsed_with`")
        csv, md = write_rehearsal(rows, Path(args.out), header)
        failed = [r for r in rows if r["status"] != "pass"]
        print(f"{csv}, {md}: {len(rows)} of {total} configurations, {len(rows) - len(failed)} passed, {len(failed)} not")
        return 1 if failed else 0
    opts = Options(steps=args.steps, per_round=args.per_round, pass_clients=args.pass_clients, rounds=args.rounds,
                   eval_samples=args.eval_samples,
                   device=args.device, threads=args.threads)
    t0 = time.monotonic()
    def partial(rows: list[dict]) -> None:
        write_rehearsal(rows, Path(args.out), f"Rehearsal in progress at scale {args.scale}: {len(rows)} configurations so far")

    earlier = earlier_rows(rehearsal_csv(args.out), opts) if args.resume else {}
    rows = rehearse(plan, opts, Path(args.out), args.only, log=lambda m: print(m, flush=True), on_row=partial,
                    earlier=earlier)
    wall = time.monotonic() - t0
    header = (f"Rehearsal of {len(rows)} configurations of {len(plan.tables)} tables at scale {args.scale} on "
              f"{args.device}: {args.steps} local step(s) a client update, "
              f"{args.per_round or 'all'} client(s) a round, {args.rounds} rounds, {args.eval_samples} test samples; "
              f"wall time {wall / 60:.1f} min")
    csv, md = write_rehearsal(rows, Path(args.out), header)
    failed = [r for r in rows if r["status"] != "pass"]
    print(f"{csv}, {md}: {len(rows) - len(failed)} passed, {len(failed)} not ({wall / 60:.1f} min)")
    return 1 if failed else 0


def table_cells(pt, results: str) -> dict[str, int]:
    """A table's cells as its rendered status line counts them (``RenderedTable.cell_counts``):
    every row x column, an average column's cells included (done once the cells it averages are);
    done = every seed's metrics file exists; n.i. = the rows not implemented yet."""
    spec = pt.spec
    runs: dict[tuple[str, str], list] = {}
    for tr in pt.runs:
        runs.setdefault((tr.row, tr.column), []).append(tr.run)
    measured = {k: all(Path(r.files(results)["metrics"]).exists() for r in rs) for k, rs in runs.items()}
    done = pending = ni = 0
    for r in spec.rows:
        for c in spec.columns:
            if r.status != "implemented":
                ni += 1
                continue
            sources = spec.average_of(r.label, c.label) or (c.label,)
            if all(measured.get((r.label, x), False) for x in sources):
                done += 1
            else:
                pending += 1
    return {"cells": done + pending + ni, "done": done, "pending": pending, "not_implemented": ni}


def _list(tables, results: str) -> int:
    from .app.build_table import spec_at_rounds  # lazy: fnl --help start-up (note at the top)
    from .app.papers import Scale  # lazy: fnl --help start-up (note at the top)

    scales = sorted({t.scale for t in tables})
    for name in scales:
        print(f"{Scale.load(name).describe()}")
    print(f"{'paper':8s} {'table':6s} {'cells':>5s} {'done':>5s} {'pending':>7s} {'n.i.':>5s}  title")
    for t in tables:
        c = table_cells(t, results)
        title = spec_at_rounds(t).title  # "last 10 rounds" at the rounds this scale runs
        print(f"{t.paper:8s} {t.table:6s} {c['cells']:5d} {c['done']:5d} {c['pending']:7d} "
              f"{c['not_implemented']:5d}  {title}")
    return 0


def _device_check_arguments(dc) -> None:
    dc.add_argument("--device", default="auto", help="cuda | cuda:N | cpu | auto: the device to measure")
    dc.add_argument("--out", help="folder of the CSVs, step_costs.json and summary.md (nothing is written elsewhere)")
    dc.add_argument("--quick", action="store_true",
                    help="every section at a small size (tiny models and shapes, one rehearsal): a test of the "
                         "command on a CPU in a few minutes, not a measurement")
    dc.add_argument("--budget-s", type=float, default=420.0,
                    help="seconds the sections may take together (default 420); each has its share, and what "
                         "does not fit is skipped with a note")
    dc.add_argument("--threads", type=int, default=0, help="torch threads on the CPU (default: torch's)")
    dc.add_argument("--rehearse-jobs", type=int, default=0,
                    help="rehearsals side by side on the device (default: 2 on a GPU, 1 on a CPU)")
    dc.add_argument("--ship-step-costs", metavar="JSON",
                    help="measure nothing: add the step costs of JSON (a device check's step_costs.json) to the "
                         "project's shipped benchmarks/step_costs.json")


def _device_check(args, argv: list[str]) -> int:
    """One device check (fnlcore/app/device_check/), or shipping its step costs (fnlcore/app/measurements.py)."""

    from .app import device_check  # lazy: fnl --help start-up (note at the top)
    from .app.measurements import ship_step_costs  # lazy: fnl --help start-up (note at the top)

    if args.ship_step_costs:
        added = ship_step_costs(args.ship_step_costs)
        print(f"added the step costs of {', '.join(added)} to benchmarks/step_costs.json")
        return 0
    if not args.out:
        raise ConfigError("device-check: --out DIR is required (where every result goes)")
    if args.budget_s <= 0 or args.threads < 0 or args.rehearse_jobs < 0:
        raise ConfigError("device-check: --budget-s must be > 0, --threads and --rehearse-jobs >= 0")
    return device_check.run(args.device, args.out, quick=args.quick, budget_s=args.budget_s, threads=args.threads,
                            rehearse_jobs=args.rehearse_jobs, command=shlex.join(["fnl", *argv]))


if __name__ == "__main__":
    raise SystemExit(main())
