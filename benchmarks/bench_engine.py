"""Engine efficiency: samples/s of a FedAvg round / samples/s of a bare torch loop.

    python benchmarks/bench_engine.py                        # all cases, threads = torch default
    python benchmarks/bench_engine.py --threads 1 --reps 61 --cases digits_mlp
    python benchmarks/bench_engine.py --clients 1            # one client: per-batch overhead only
    python benchmarks/bench_engine.py --device cuda          # on a GPU (default: the CPU)
    python benchmarks/bench_engine.py --fednoro              # also FedNoRo seconds per round
    python benchmarks/bench_engine.py --cases digits_mlp --profile   # cProfile of engine rounds
    # before/after: an older fnlcore, imported as a second package and timed interleaved
    BASE=$(mktemp -d) && git archive <commit> fnlcore | tar -x -C "$BASE"
    python benchmarks/bench_engine.py --baseline "$BASE"

Cases (same model class from ``fnlcore.models.build_model``, batch size,
samples, normalisation and augmentation on both sides):

- ``digits_mlp``: scikit-learn digits, train split (1,347 images) cut to
  K * floor(1347 / (K * bs)) * bs = 1,280 so that every client holds whole
  batches; MLP 64-128-10; the demo's settings (Adam lr 3e-3, wd 5e-4, batch 16,
  2 local epochs, K = 10); normalisation: the data's mean/std;
- ``cnn32_none`` / ``cnn32_crop_flip``: 2,560 random uint8 3x32x32 images, the
  small FedAvg CNN (conv5x5 32/64 + fc512), SGD lr 0.01 momentum 0.5, batch 32,
  1 local epoch, K = 10, ImageNet normalisation; no augmentation /
  RandomCrop(32, padding 4) + RandomHorizontalFlip.

Bare loop: pre-made uint8 batches and labels on the device (one shuffle, made
before timing), one model and one optimiser, then per batch
``[augment with fnlcore.augment] -> (x/255 - mean)/std -> CE(model(x), y) ->
zero_grad, backward, step``. Engine: FedAvg rounds on a ``RunContext`` built by
``fnlcore.app.train.build_context``, driven exactly as ``Simulation.run`` drives
them (``begin_round``, the engine's ``train_client`` for every client, ``aggregate``
over their updates, ``end_round``); "local" counts the clients' updates only,
"round" the whole round including aggregation; test evaluation is timed on its own.

Measurement: one repetition = one engine round and one bare pass over the same
number of samples (for every code version timed), back to back, the order
alternating; after ``--warmup`` untimed repetitions. Ratio = engine samples/s /
bare samples/s, reported as the median [quartiles] of the per-repetition ratios
of wall time (perf_counter) and the median of the per-repetition ratios of
process CPU time (process_time; with 1 thread it leaves out the time the
process waited for a core on a shared machine). With ``--baseline`` the bare
loop of each version uses that version's ``fnlcore.augment``.

``--fednoro``: seconds per FedNoRo round on digits (demo settings, 10 clients,
4 of them with 60% flipped labels, 6 rounds, warm-up 3): stage-1 rounds,
the detection step (``end_round`` of the last warm-up round: scoring every
training sample, the loss matrix, 9 GMM fits), stage-2 rounds (KD for noisy
clients + DaAgg) and evaluation, each separately.

Not a test: prints markdown tables and asserts nothing about time.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import importlib.util
import os
import pstats
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F

from fnlcore.fl.settings import TrainSettings


@dataclass(frozen=True)
class Case:
    name: str
    dataset: str  # digits | random32
    settings: TrainSettings
    num_clients: int = 10
    samples: int = 0  # random32 only: total training samples


CASES = {
    "digits_mlp": Case(
        "digits_mlp", "digits",
        TrainSettings(model="mlp", local_epochs=2, batch_size=16, optimizer="adam", lr=3e-3, weight_decay=5e-4,
                      augmentation="none"),
    ),
    "cnn32_none": Case(
        "cnn32_none", "random32",
        TrainSettings(model="cnn", local_epochs=1, batch_size=32, optimizer="sgd", lr=0.01, momentum=0.5,
                      augmentation="none"),
        samples=2560,
    ),
    "cnn32_crop_flip": Case(
        "cnn32_crop_flip", "random32",
        TrainSettings(model="cnn", local_epochs=1, batch_size=32, optimizer="sgd", lr=0.01, momentum=0.5,
                      augmentation="crop_flip"),
        samples=2560,
    ),
}


# -- the code under test ------------------------------------------------------------------------
def engine_api(package: str = "fnlcore") -> SimpleNamespace:
    """The engine entry points of ``package`` (the working tree, or a baseline copy)."""
    mod = lambda name: importlib.import_module(f"{package}.{name}")  # noqa: E731
    try:  # the training job moved from the engine (fl.run) to the application layer (app.train)
        build_context = mod("app.train").build_context
    except ImportError:
        build_context = mod("fl.run").build_context
    return SimpleNamespace(
        label="working tree" if package == "fnlcore" else package,
        augment=mod("augment"),
        FederatedData=mod("fl.data").FederatedData,
        ImageSource=mod("fl.data").ImageSource,
        evaluate=mod("fl.local").evaluate,
        # the sequential engine is fl.sequential and the contract fl.contract; a baseline from before
        # that split has both in fl.client (older still: fl.local, or method.local_update)
        train_epochs=_first(mod, ("fl.sequential", "train_epochs"), ("fl.client", "train_epochs"),
                            ("fl.local", "train_epochs")),
        train_client=_first(mod, ("fl.sequential", "train_client"), ("fl.client", "train_client")),
        Batch=_first(mod, ("fl.contract", "Batch"), ("fl.client", "Batch")),
        build_context=build_context,
        METHODS=mod("methods").METHODS,
        method_from_dict=mod("methods").method_from_dict,
        fednoro=mod("methods.fednoro"),
        build_model=mod("models").build_model,
    )


def _first(mod, *where):
    """The first of (module, attribute) that exists, or None."""
    for name, attr in where:
        try:
            return getattr(mod(name), attr)
        except (ImportError, AttributeError):
            continue
    return None


def load_baseline(src: str, name: str = "fnlcore_baseline") -> SimpleNamespace:
    """Import ``src``/fnlcore (e.g. ``git archive <commit> fnlcore | tar -x -C src``) as package ``name``."""
    root = Path(src) / "fnlcore"
    if not (root / "__init__.py").is_file():
        raise SystemExit(f"--baseline {src}: no fnlcore/__init__.py there")
    spec = importlib.util.spec_from_file_location(name, root / "__init__.py", submodule_search_locations=[str(root)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    api = engine_api(name)
    api.label = "baseline"
    return api


# -- data ------------------------------------------------------------------------------------
def load_images(case: Case, seed: int = 0):
    """(x_train uint8 NHWC, y_train, x_test, y_test, dataset name, image size, channels), batch-aligned."""
    k, bs = case.num_clients, case.settings.batch_size
    if case.dataset == "digits":
        from fnlcore.datasets.digits import digits_arrays, stratified_split

        x, y = digits_arrays()
        tr, te = stratified_split(y)
        n = len(tr) // (k * bs) * (k * bs)
        return x[tr][:n], y[tr][:n], x[te], y[te], "digits", (8, 8), 1
    rs = np.random.RandomState(seed)
    n = case.samples // (k * bs) * (k * bs)
    x = rs.randint(0, 256, (n + 1000, 32, 32, 3)).astype(np.uint8)
    y = rs.randint(0, 10, n + 1000).astype(np.int64)
    return x[:n], y[:n], x[n:], y[n:], "synthetic_cifar10", (32, 32), 3


# where the runs train (--device); timing points synchronise with it (CUDA runs asynchronously)
DEVICE = torch.device("cpu")


def make_context(case: Case, api: SimpleNamespace, given: np.ndarray | None = None, seed: int = 0,
                 settings: TrainSettings | None = None):
    xtr, ytr, xte, yte, name, size, channels = load_images(case, seed)
    if len(ytr) == 0:
        raise SystemExit(f"{case.name}: fewer samples than clients x batch size")
    dev = DEVICE
    clients = np.array_split(np.arange(len(ytr)), case.num_clients)
    y_given = ytr if given is None else given
    data = api.FederatedData(
        api.ImageSource(dev, images=xtr), api.ImageSource(dev, images=xte), torch.as_tensor(ytr).to(dev),
        torch.as_tensor(y_given.copy()).to(dev), torch.as_tensor(yte).to(dev), [torch.as_tensor(c) for c in clients],
        10,
    )
    s = settings or case.settings  # settings are read by attribute: any version's engine takes them
    return api.build_context(data, name, size, channels, s, seed, dev, log=lambda m: None)


def _now() -> tuple[float, float]:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)
    return time.perf_counter(), time.process_time()


# -- the bare loop -----------------------------------------------------------------------------
class BareLoop:
    """The reference: one model and optimiser, pre-made batches, nothing else."""

    def __init__(self, case: Case, ctx, api: SimpleNamespace):
        s = case.settings
        self.epochs = s.local_epochs
        torch.manual_seed(0)
        self.model = api.build_model(ctx.model_name, ctx.data.num_classes, ctx.channels, ctx.image_size).to(DEVICE)
        if s.optimizer == "adam":
            self.opt = torch.optim.Adam(self.model.parameters(), lr=s.lr, betas=(s.beta1, s.beta2),
                                        weight_decay=s.weight_decay)
        else:
            self.opt = torch.optim.SGD(self.model.parameters(), lr=s.lr, momentum=s.momentum,
                                       weight_decay=s.weight_decay)
        images, labels = ctx.data.train.images, ctx.data.given
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
        self.batches = [(images[b], labels[b]) for b in order.split(s.batch_size)]
        p = ctx.pipeline
        self.mean = torch.tensor(p.mean, dtype=torch.float32, device=DEVICE)[:, None, None]
        self.std = torch.tensor(p.std, dtype=torch.float32, device=DEVICE)[:, None, None]
        self.augmentation, self.padding, self.augment = p.augmentation, p.crop_padding, api.augment
        self.gen = torch.Generator().manual_seed(1)
        self.samples = self.epochs * len(labels)

    def run(self) -> tuple[float, float]:
        """(wall, cpu) seconds of ``epochs`` passes over the batches."""
        model, opt, gen, mean, std, augment = self.model, self.opt, self.gen, self.mean, self.std, self.augment
        model.train()
        w0, c0 = _now()
        for _ in range(self.epochs):
            for xb, yb in self.batches:
                if self.augmentation == "crop_flip":
                    xb = augment.random_hflip(augment.random_crop(xb, self.padding, gen), 0.5, gen)
                elif self.augmentation == "affine_flip":
                    xb = augment.random_hflip(augment.random_affine(xb, 10.0, (0.02, 0.02), gen), 0.5, gen)
                x = (xb.float().div_(255.0) - mean) / std
                loss = F.cross_entropy(model(x), yb)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        w1, c1 = _now()
        return w1 - w0, c1 - c0


# -- the engine ---------------------------------------------------------------------------------
@dataclass
class RoundTimes:
    """Wall (perf_counter) and process CPU (process_time) seconds of one round."""

    local: float = 0.0  # sum over clients of their local update
    round: float = 0.0  # begin_round .. end_round (local + aggregate + server steps)
    end_round: float = 0.0  # end_round alone (FedNoRo's detection)
    evaluate: float = 0.0
    local_cpu: float = 0.0
    round_cpu: float = 0.0


def client_update(method, r: int, k: int):
    """Client k's local update under either contract (v3: the engine's train_client; older: the method's)."""
    if hasattr(method, "local_update"):
        return method.local_update(r, k)
    package = type(method).__module__.split(".methods")[0]
    train_client = _first(lambda name: importlib.import_module(f"{package}.{name}"),
                          ("fl.sequential", "train_client"), ("fl.client", "train_client"))
    return train_client(method, r, k)


def engine_round(method, r: int, evaluate=None) -> RoundTimes:
    """One round exactly as ``Simulation.run`` drives it, with timing points."""
    t = RoundTimes()
    w0, c0 = _now()
    method.begin_round(r)
    v3 = not hasattr(method, "local_update")
    updates = []
    for k in method.select_clients(r):
        w1, c1 = _now()
        upd = client_update(method, r, k)
        w2, c2 = _now()
        t.local += w2 - w1
        t.local_cpu += c2 - c1
        updates.append(upd) if v3 else method.accumulate(r, upd)
    method.aggregate(r, iter(updates)) if v3 else method.aggregate(r)
    w2, _ = _now()
    method.end_round(r)
    w3, c3 = _now()
    t.end_round, t.round, t.round_cpu = w3 - w2, w3 - w0, c3 - c0
    if evaluate is not None:
        evaluate(method.ctx, method.eval_model())
        t.evaluate = time.perf_counter() - w3
    return t


class EngineLoop:
    """FedAvg rounds on the case's clients; round index r grows with every call."""

    def __init__(self, case: Case, ctx, api: SimpleNamespace):
        self.method = api.METHODS["fedavg"](api.method_from_dict({"name": "fedavg"}), ctx)
        self.samples = case.settings.local_epochs * sum(len(c) for c in ctx.data.clients)
        self.evaluate = api.evaluate
        self.r = 0

    def run(self) -> RoundTimes:
        t = engine_round(self.method, self.r, self.evaluate)
        self.r += 1
        return t


# -- measurement ----------------------------------------------------------------------------------
def _summary(values: list[float]) -> tuple[float, float, float]:
    """(median, lower quartile, upper quartile)."""
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q2, q1, q3


def measure(case: Case, reps: int, warmup: int, apis: list[SimpleNamespace]) -> list[dict]:
    """Bare and engine runs of every code version in ``apis``, interleaved, order alternating."""
    runners = []
    for api in apis:
        ctx = make_context(case, api)
        bare, engine = BareLoop(case, ctx, api), EngineLoop(case, ctx, api)
        assert bare.samples == engine.samples
        runners.append((api, ctx, bare, engine))
    for _ in range(warmup):
        for _, _, bare, engine in runners:
            bare.run()
            engine.run()
    steps = [(i, kind) for i in range(len(runners)) for kind in ("bare", "engine")]
    timed: dict[tuple[int, str], list] = {key: [] for key in steps}
    for rep in range(reps):
        for i, kind in steps if rep % 2 == 0 else steps[::-1]:
            _, _, bare, engine = runners[i]
            timed[i, kind].append(bare.run() if kind == "bare" else engine.run())
    rows, med = [], statistics.median
    for i, (api, ctx, bare, _) in enumerate(runners):
        b, e = timed[i, "bare"], timed[i, "engine"]
        n = bare.samples
        bare_wall, bare_cpu = [x[0] for x in b], [x[1] for x in b]
        local, rnd = [t.local for t in e], [t.round for t in e]
        row = {
            "case": case.name,
            "code": api.label,
            "model": ctx.model_name,
            "samples": n,
            "bs": case.settings.batch_size,
            "K": len(ctx.data.clients),
            "opt": case.settings.optimizer,
            "reps": reps,
            "bare": n / med(bare_wall),
            "local": n / med(local),
            "round": n / med(rnd),
            "ratio_local": _summary([bt / et for et, bt in zip(local, bare_wall)]),
            "ratio_round": _summary([bt / et for et, bt in zip(rnd, bare_wall)]),
            "cpu_local": med([bt / t.local_cpu for t, bt in zip(e, bare_cpu)]),
            "cpu_round": med([bt / t.round_cpu for t, bt in zip(e, bare_cpu)]),
            "eval_ms": 1e3 * med([t.evaluate for t in e]),
            "eval_samples": len(ctx.data.test),
        }
        if i > 0:  # speed-up of this code's engine over the first one's, per repetition
            row["speedup_local"] = _summary([a.local / t.local for a, t in zip(timed[0, "engine"], e)])
        rows.append(row)
    return rows


def print_efficiency(rows: list[dict]) -> None:
    print(f"\nEngine efficiency, torch threads {torch.get_num_threads()}. Ratio = engine samples/s / bare samples/s; "
          "wall: median [quartiles] of the per-repetition ratios of perf_counter times; "
          "cpu: median of the per-repetition ratios of process_time.\n")
    print("| case | code | model | samples/rep x reps | batch | K | opt | bare samples/s | engine local samples/s | "
          "engine round samples/s | ratio local: wall | cpu | ratio round: wall | cpu | eval ms (test n) |")
    print("|---|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        rl, rr = r["ratio_local"], r["ratio_round"]
        print(
            f"| {r['case']} | {r['code']} | {r['model']} | {r['samples']:,} x {r['reps']} | {r['bs']} | {r['K']} | "
            f"{r['opt']} | "
            f"{r['bare']:,.0f} | {r['local']:,.0f} | {r['round']:,.0f} | "
            f"{rl[0]:.3f} [{rl[1]:.2f}, {rl[2]:.2f}] | {r['cpu_local']:.3f} | "
            f"{rr[0]:.3f} [{rr[1]:.2f}, {rr[2]:.2f}] | {r['cpu_round']:.3f} | "
            f"{r['eval_ms']:.1f} ({r['eval_samples']}) |"
        )
    speedups = [r for r in rows if "speedup_local" in r]
    if speedups:
        print("\nEngine local-training speed-up of the working tree over the baseline "
              "(baseline time / working-tree time, median [quartiles] of per-repetition pairs):\n")
        print("| case | speed-up |")
        print("|---|---:|")
        for r in speedups:
            sp = r["speedup_local"]
            print(f"| {r['case']} | {sp[0]:.3f} [{sp[1]:.2f}, {sp[2]:.2f}] |")


# -- FedNoRo ---------------------------------------------------------------------------------------
FEDNORO_STEPS = ("stage 1 round (train + FedAvg)", "detection (end of warm-up)",
                 "stage 2 round (train + KD + DaAgg)", "evaluation (450 test images)",
                 "  detection's 9 GMM fits alone, BLAS threads as found",
                 "  detection's 9 GMM fits alone, BLAS limited to 1 thread (threadpoolctl)")


def fednoro_rounds(runs: int, api: SimpleNamespace, warmup_rounds: int = 3, rounds: int = 6) -> dict[str, list[float]]:
    """Wall seconds of every FedNoRo step over ``runs`` fresh runs (the first round of the first run is warm-up)."""
    import sklearn.mixture  # noqa: F401  (the detection's GMM: import it before timing, not inside the step)
    from threadpoolctl import threadpool_limits

    case = CASES["digits_mlp"]
    _, ytr, *_ = load_images(case)
    rs = np.random.RandomState(0)
    given = ytr.copy()
    clients = np.array_split(np.arange(len(ytr)), case.num_clients)
    for k in (1, 4, 6, 8):  # 60% flipped to another class
        idx = clients[k][rs.rand(len(clients[k])) < 0.6]
        given[idx] = (given[idx] + 1 + rs.randint(0, 9, len(idx))) % 10
    settings = replace(case.settings, rounds=rounds)
    out: dict[str, list[float]] = {s: [] for s in FEDNORO_STEPS}
    for run in range(runs):
        ctx = make_context(case, api, given=given, settings=settings)
        m = api.METHODS["fednoro"](api.method_from_dict({"name": "fednoro", "warmup_rounds": warmup_rounds}), ctx)
        for r in range(rounds):
            t = engine_round(m, r, api.evaluate)
            if run == 0 and r == 0:
                continue
            out[FEDNORO_STEPS[0] if r < warmup_rounds else FEDNORO_STEPS[2]].append(t.round - t.end_round)
            out[FEDNORO_STEPS[3]].append(t.evaluate)
            if r == warmup_rounds - 1:
                out[FEDNORO_STEPS[1]].append(t.end_round)
        if m.noisy is None:
            raise AssertionError("FedNoRo did not run its detection step")
        out[FEDNORO_STEPS[4]].append(_timed(lambda: api.fednoro.detect_noisy_clients(m.loss_matrix, 9)))
        with threadpool_limits(limits=1):
            out[FEDNORO_STEPS[5]].append(_timed(lambda: api.fednoro.detect_noisy_clients(m.loss_matrix, 9)))
    return out


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def print_fednoro(times: dict[str, list[float]], runs: int) -> None:
    s = CASES["digits_mlp"].settings
    print(f"\nFedNoRo on digits (1,280 train images, 10 clients, {s.local_epochs} local epochs, "
          f"batch {s.batch_size}, {s.optimizer}; {runs} runs of 6 rounds, warm-up 3; "
          f"torch threads {torch.get_num_threads()}), wall seconds:\n")
    print("| step | median | min | max | n |")
    print("|---|---:|---:|---:|---:|")
    for name, v in times.items():
        print(f"| {name} | {statistics.median(v):.4f} | {min(v):.4f} | {max(v):.4f} | {len(v)} |")


def breakdown(case: Case, reps: int, warmup: int, api: SimpleNamespace) -> list[tuple[str, float, float]]:
    """Where the engine's time over the bare loop goes: the round built up step by step.

    Every variant trains the same samples; interleaved, order alternating; returns
    (variant, median CPU-time ratio bare/variant, same for wall time).
    """
    train_epochs = api.train_epochs
    ctx = make_context(case, api)
    bare, engine = BareLoop(case, ctx, api), EngineLoop(case, ctx, api)
    m, clients = engine.method, ctx.data.clients
    everything = torch.cat(clients)
    shared_opt = ctx.optimizer(m.worker.parameters(), 0)

    def loss_for(k):
        if api.Batch is not None:  # contract v3: the loss of a Batch
            return lambda model, x, idx, step: m.loss(api.Batch(model, {}, x, idx, {}, step, 0, 0, k, None))
        return lambda model, x, idx, step: m.loss(model, x, idx, step, k, 0)

    variants = {
        "bare loop": bare.run,
        "train_epochs, all samples as 1 client, one optimiser": lambda: train_epochs(
            ctx, m.worker, everything, loss_for(0), 0, optimizer=shared_opt),
        f"train_epochs per client (K={len(clients)}), one optimiser": lambda: [
            train_epochs(ctx, m.worker, idx, loss_for(k), 0, optimizer=shared_opt) for k, idx in enumerate(clients)],
        "+ a fresh optimiser per client (as the engine does)": lambda: [
            train_epochs(ctx, m.worker, idx, loss_for(k), 0) for k, idx in enumerate(clients)],
        "+ load global / snapshot worker (= a client's update)": lambda: [client_update(m, 0, k) for k in range(len(clients))],
        "+ begin_round, aggregate, end_round (= a round)": lambda: engine_round(m, 0),
    }
    names = list(variants)
    cpu: dict[str, list[float]] = {k: [] for k in names}
    wall: dict[str, list[float]] = {k: [] for k in names}
    for rep in range(warmup + reps):
        for name in names if rep % 2 == 0 else names[::-1]:
            w0, c0 = _now()
            variants[name]()
            w1, c1 = _now()
            if rep >= warmup:
                cpu[name].append(c1 - c0)
                wall[name].append(w1 - w0)
    med = statistics.median
    return [(k, med(cpu[names[0]]) / med(cpu[k]), med(wall[names[0]]) / med(wall[k])) for k in names]


def print_breakdown(case: Case, rows, reps: int) -> None:
    print(f"\nBreakdown, {case.name} ({reps} interleaved repetitions; torch threads {torch.get_num_threads()}); "
          "bare time / variant time, medians:\n")
    print("| variant | ratio (cpu) | ratio (wall) |")
    print("|---|---:|---:|")
    for name, c, w in rows:
        print(f"| {name} | {c:.3f} | {w:.3f} |")


def profile_engine(case: Case, api: SimpleNamespace, rounds: int = 5) -> None:
    engine = EngineLoop(case, make_context(case, api), api)
    engine.run()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(rounds):
        engine.run()
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--reps", type=int, default=15, help="timed repetitions per case")
    ap.add_argument("--warmup", type=int, default=2, help="untimed repetitions first")
    ap.add_argument("--clients", type=int, default=None, help="override K (samples stay batch-aligned)")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    ap.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N: where the bare loop and the engine train")
    ap.add_argument("--fednoro", action="store_true", help="also time FedNoRo rounds on digits")
    ap.add_argument("--fednoro-only", action="store_true", help="only time FedNoRo rounds")
    ap.add_argument("--fednoro-runs", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="cProfile engine rounds instead of timing")
    ap.add_argument("--breakdown", action="store_true",
                    help="build the round up step by step (train_epochs, fresh optimisers, state copies, aggregation)")
    ap.add_argument("--baseline", metavar="DIR", default=None,
                    help="also time DIR/fnlcore (an older version) interleaved, for before/after numbers")
    args = ap.parse_args()
    apis = [engine_api()]
    if args.baseline:
        apis.insert(0, load_baseline(args.baseline))
    global DEVICE
    DEVICE = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    cases = [CASES[c] if args.clients is None else replace(CASES[c], num_clients=args.clients) for c in args.cases]
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, cpu capability "
          f"{torch.backends.cpu.get_cpu_capability()}, {os.cpu_count()} cpus, "
          f"loadavg before {os.getloadavg()[0]:.2f}", flush=True)
    if args.profile:
        for case in cases:
            profile_engine(case, apis[-1])
        return
    if args.breakdown:
        for case in cases:
            print_breakdown(case, breakdown(case, args.reps, args.warmup, apis[-1]), args.reps)
        return
    if not args.fednoro_only:
        rows = []
        for case in cases:
            for r in measure(case, args.reps, args.warmup, apis):
                rows.append(r)
                print(f"  {case.name} [{r['code']}]: ratio local wall {r['ratio_local'][0]:.3f}, "
                      f"cpu {r['cpu_local']:.3f}; loadavg {os.getloadavg()[0]:.2f}", flush=True)
        print_efficiency(rows)
    if args.fednoro or args.fednoro_only:
        for api in apis:
            print(f"\n[{api.label}]")
            print_fednoro(fednoro_rounds(args.fednoro_runs, api), args.fednoro_runs)
    print(f"\nloadavg after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
