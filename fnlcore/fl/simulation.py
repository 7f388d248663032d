"""The server loop: rounds, evaluation, per-round metrics, and when to checkpoint; which engine
trains each round's clients, and how many of them at once.

The loop (:class:`Simulation`)
------------------------------
A run checkpoints every ``checkpoint_every`` rounds to a file that is not a
declared workflow output. Rerun after a kill (SIGKILL, pre-emption, scancel),
it resumes from the last checkpoint; since the checkpoint holds the method's
full state, the working labels and every random stream, the resumed run
produces exactly the numbers of an uninterrupted one (on the CPU; cuDNN
kernels may not be bit-deterministic on a GPU).

A checkpoint records what made it (:class:`~fnlcore.provenance.Provenance`: the code's
version and a digest of the run's settings). A checkpoint of other code or other settings
is never resumed: the run restarts from round 0 and the log says so, naming both. Reading a
checkpoint never runs code (``torch.load(weights_only=True)`` of tensors and plain data). An
unreadable checkpoint (truncated by a full disk or a kill during a copy, written by an older
version in the pickle format, crafted, or not of a checkpoint's shape) is moved aside to
``<checkpoint>.corrupt`` (``.corrupt.1``, ... when that exists: nothing is overwritten) and the
run restarts, saying so. Before each checkpoint the free space is checked against the state's
size, so a full disk stops the run with the folder, the needed and the free bytes instead of a
library message. How a checkpoint is written and read is
:class:`~fnlcore.fl.persist.RunCheckpoint`'s; this loop says when.

Given a time budget (:class:`~fnlcore.fl.time_budget.TimeBudget`: the seconds its job may
still run), the loop stops before the job's time limit instead of being killed at it: after
a round, when one more round and a checkpoint would not fit, it checkpoints (unless that
round was just checkpointed) and raises :class:`~fnlcore.errors.RunIncomplete`; the next job
resumes there. Every job runs at least one round, so a run always advances. The checkpoint
cadence counts rounds from the start of the run (``round % checkpoint_every``), so an extra
checkpoint at a stop shifts no later one, and the numbers equal an uninterrupted run's.

Which engine trains a round's clients (:class:`RoundEngine`)
------------------------------------------------------------
The sequential engine (:func:`~fnlcore.fl.sequential.train_client`) trains clients one after
another; the batched engine (:mod:`fnlcore.fl.batched`) trains them as one stacked
computation. A round runs batched when ``training.engine`` allows it, the run suits it
(:func:`batched_fits`) and the round's stage has a loss over K clients (``Stage.loss``, the one loss form);
nothing is inferred from which methods a class overrides.

How many clients at once (:func:`clients_in_memory`)
----------------------------------------------------
The batched engine stacks a round's clients into one computation; on a GPU their number is bounded
by the device's memory, not a constant (``training.batched_clients`` 0). A client's share is
estimated from what a step of it holds (:func:`client_bytes`): its networks' weights, gradients,
optimiser state and stacked copy, and its batch's activations twice (forward outputs and their
gradients), with the activations counted as the bytes every op of a forward pass writes
(:class:`OpCounter`; an upper bound: temporaries freed early count too). ``fnl plan`` counts
the same on the CPU (fnlcore/app/counts.py), so the plan's clients at once are the run's.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import pandas as pd
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ..errors import ConfigError, RunIncomplete
from ..progress import round_line
from .context import RunContext
from . import batched  # train_clients is called through its module: tests replace it there
from .batched import ChunkPhase, ClientDraws, draw_client, draw_fn
from .contract import ClientUpdate, LocalJob, OneForm, Phase
from .local import evaluate
from .persist import RunCheckpoint
from .sequential import train_client
from .stacked import StackedNet, check_stackable, gains_on_cpu
from .state import load, snapshot
from .time_budget import TimeBudget


# -- how many clients at once ----------------------------------------------------------------

# Of a device's memory, what the stacked clients may fill; the rest: the method's global networks,
# the data held on the device, evaluation and the allocator's slack.
MEMORY_SHARE = 0.6
_NO_KERNEL = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "lift_fresh"}


class OpCounter:
    """Counts the kernel-launching ATen ops dispatched inside it (views and empty allocations launch
    none), and the bytes of their outputs."""

    def __init__(self):
        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if not (func.is_view or func._opname in _NO_KERNEL):
                    counter.ops += 1
                    counter.bytes += sum(t.numel() * t.element_size() for t in tree_leaves(out)
                                         if isinstance(t, torch.Tensor))
                return out

        self.ops = 0
        self.bytes = 0
        self.mode = Mode()

    def __enter__(self):
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self.mode.__exit__(*exc)


def client_bytes(param_bytes: float, activation_bytes: float, batch_size: int, optimizer: str,
                 networks: int = 1) -> float:
    """Device bytes one client of a batched step takes: per network trained, its weights, gradients,
    optimiser state (Adam two tensors a parameter, SGD's momentum one) and stacked copy, and its
    batch's activations (``activation_bytes`` a sample) twice."""
    states = 2 if optimizer == "adam" else 1
    return networks * (param_bytes * (3 + states) + 2 * activation_bytes * batch_size)


def clients_at_once(batched_clients: int, clients: int, memory_bytes: float | None, per_client: float | None) -> int:
    """Clients the batched engine stacks at once: ``training.batched_clients`` where set, else as many
    of the round's as :data:`MEMORY_SHARE` of the device's memory holds (all where it is unknown)."""
    if batched_clients:
        return max(1, min(clients, batched_clients))
    if not memory_bytes or not per_client:
        return max(1, clients)
    return max(1, min(clients, int(MEMORY_SHARE * memory_bytes // per_client)))


def clients_in_memory(model: torch.nn.Module, sample: torch.Tensor, batch_size: int, optimizer: str,
                      networks: int, memory_bytes: float) -> int:
    """How many clients ``memory_bytes`` holds for ``model`` (its forward pass on ``sample``, a batch
    of normalised inputs on the model's device, counted; the model's mode and state unchanged)."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), OpCounter() as forward:
            model(sample)
    finally:
        model.train(was_training)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    per_client = client_bytes(params, forward.bytes / sample.shape[0], batch_size, optimizer, networks)
    return clients_at_once(0, 1 << 30, memory_bytes, per_client)


# -- which engine trains a round's clients -----------------------------------------------------

def batched_support(cls) -> str | None:
    """Why the batched engine can never run method class ``cls``, or None when some stage can."""
    if any(st.batchable for st in cls.stages.values()):
        return None
    return "none of its stages batches (Stage.batches: its jobs are not one stacked step)"


def effective_engine(engine: str, device_type: str) -> str:
    """The engine ``training.engine`` means on a device: ``default`` is ``auto`` on a GPU, where the
    batched engine is measured 3.4-7.7x faster and the contract (tests/test_batched_contract.py)
    holds it equal to the sequential one for every method, and ``sequential`` on a CPU, the reference
    (and where batching is mostly slower). Any other value is the user's switch, kept."""
    if engine == "default":
        return "auto" if device_type == "cuda" else "sequential"
    return engine


def use_batched_engine(cls, engine: str, where: str = "") -> bool:
    """Whether method class ``cls`` may train with the batched engine under ``training.engine``
    (resolved for the device first: :func:`effective_engine`).

    batched: yes, or a ConfigError naming why it cannot; auto: where it can; sequential: no."""
    if engine in ("sequential", "default"):  # default: unresolved, the CPU's meaning
        return False
    why = batched_support(cls)
    if why is not None and engine == "batched":
        prefix = f"{where}: " if where else ""
        raise ConfigError(
            f"{prefix}training.engine: batched cannot run method {cls.Params.name!r}: {why}; use engine: auto "
            "(batched where possible) or sequential"
        )
    return why is None


def batched_fits(ctx: RunContext, model: torch.nn.Module, strict: bool) -> bool:
    """Whether the run's data and model suit the batched engine (in-memory images, a stackable model).

    ``strict`` (engine: batched) raises the ConfigError that says why not; otherwise (auto) False,
    also where batching is measured slower: on a CPU for models with BatchNorm or wide convolutions."""
    if not strict and ctx.device.type == "cpu" and not gains_on_cpu(model):
        return False
    try:
        if not ctx.data.train.in_memory:
            raise ConfigError(
                "training.engine: batched needs the training images in memory (this dataset streams from files); "
                "use engine: auto or sequential"
            )
        check_stackable(model)
    except ConfigError:
        if strict:
            raise
        return False
    return True


class RoundEngine:
    """Trains a round's clients for one method: sequentially, or batched where declared and allowed."""

    def __init__(self, method):
        self.method = method
        ctx = method.ctx
        engine = effective_engine(ctx.settings.engine, ctx.device.type)
        self.batched = use_batched_engine(type(method), engine) and batched_fits(
            ctx, method.global_model, strict=engine == "batched"
        )
        self._in_memory: int | None = None  # clients the device's memory holds at once (counted once)
        self._stacked: dict = {}  # K -> StackedNet, one per chunk size, reused every round
        self._copies: dict = {}  # (client network, K) -> its K stacked copies (fl.copies), reused

    def chunk(self, clients: int) -> int:
        """Clients stacked at once out of a round's ``clients``: ``training.batched_clients`` where set;
        else on a GPU as many as its memory holds (:func:`clients_in_memory`, what `fnl plan` prices), on a
        CPU all of them."""
        ctx = self.method.ctx
        if ctx.settings.batched_clients or ctx.device.type != "cuda":
            return max(1, min(clients, ctx.settings.batched_clients or clients))
        if self._in_memory is None:
            sample = ctx.pipeline.eval(torch.zeros((2, ctx.channels, *ctx.image_size), dtype=torch.uint8,
                                                   device=ctx.device))
            self._in_memory = clients_in_memory(
                self.method.global_model, sample, ctx.settings.batch_size, ctx.settings.optimizer,
                len(type(self.method).networks), torch.cuda.get_device_properties(ctx.device).total_memory)
            ctx.log(f"batched engine: up to {self._in_memory} clients at once in the device's memory")
        return max(1, min(clients, self._in_memory))

    def describe(self) -> str:
        """Which engine trains the run, for its log: where batched, its chunk size."""
        if not self.batched:
            return "sequential"
        chunk = self.method.ctx.settings.batched_clients
        if not chunk and self.method.ctx.device.type == "cuda":
            chunk = self.chunk(1 << 30)  # sized by the device's memory
        staged = [n for n, st in type(self.method).stages.items() if st.batchable]
        every = len(staged) == len(type(self.method).stages)
        return (f"batched, {f'up to {chunk}' if chunk else 'all'} of a round's clients at once"
                f"{'' if every else ' (stages ' + ', '.join(staged) + '; the others sequential)'}")

    def mode(self, r: int, clients: list[int]) -> tuple[str, int]:
        """How round ``r`` trains ``clients``: ('sequential', 1) or ('batched', clients stacked at once)."""
        if not self.batched or not self.method.current_stage(r).batchable or not clients:
            return "sequential", 1
        return "batched", self.chunk(len(clients))

    def updates(self, r: int, clients: list[int]) -> Iterator[ClientUpdate]:
        """The round's client updates, in client order, produced as they are consumed."""
        stage = self.method.current_stage(r)
        if not self.batched or not stage.batchable or not clients:
            return (train_client(self.method, r, k) for k in clients)
        return iter(self._batched(r, clients, stage))

    def _batched(self, r: int, clients: list[int], stage) -> list[ClientUpdate]:
        """The round's clients as stacked computations, in chunks of ``training.batched_clients``.

        The stage's ``prepare`` runs for every client first, each followed by the draws of that
        client's training, phase after phase (its place in the sequential order): it may act
        (relabel, read a store, an augmented pass with the global model) and return a job of
        phases on distinct networks (see :func:`client_phases`; DivideMix's warm-up: net1's
        epochs, then net2's); a chunk trains each phase in turn. Its ``upload`` runs after
        training, on each client's trained networks (an upload that draws random numbers declares
        them: ``Stage.reserve`` makes them right after the client's training draws).
        ``Stage.begin``/``end`` run around each chunk, ``Stage.before_step``/``after_step`` around
        each stacked optimiser step."""
        m, ctx = self.method, self.method.ctx
        jobs, shapes, ids, drawn, held = [], [], [], [], []
        for k in clients:
            job = stage.prepare(m, r, k, m.workers) if stage.prepare is not None else None
            # what the prepare left in each client network the stage keeps is this client's copy
            # (fl.copies), held on the host until its chunk trains: a round's clients, not a chunk's
            held.append({n: {key: v.detach().to("cpu", copy=True) for key, v in m.workers[n].state_dict().items()}
                         for n in stage.copies})
            job = LocalJob() if job is None else job
            phases = client_phases(m, r, k, job, copies=bool(stage.copies))
            jobs.append(job)
            shapes.append([sh for sh, _ in phases])
            ids.append([i for _, i in phases])
            # the client's batches and random parameters right after its prepare, where the sequential
            # engine draws them (a prepare that draws too, an augmented pass, keeps its place)
            drawn.append([draw_client(ctx, idx, ctx.settings.local_epochs if sh.epochs is None else sh.epochs,
                                      sh.batch_size or ctx.settings.batch_size, draw_fn(ctx, sh))
                          for sh, idx in phases])
            if stage.reserve is not None:  # the upload's draws, at its place in the sequential order
                job.reserved = stage.reserve(m, r, k, job)
        chunk = self.chunk(len(clients))
        form = OneForm.of(m, stage, r)  # the stage's loss and hooks, bound once for the round
        out: list[ClientUpdate] = []
        for at in range(0, len(clients), chunk):  # chunks in client order keep the sequential draw order
            part, part_jobs = clients[at : at + chunk], jobs[at : at + chunk]
            part_shapes, part_ids, part_drawn = shapes[at : at + chunk], ids[at : at + chunk], drawn[at : at + chunk]
            count = max(len(sh) for sh in part_shapes)
            if any(sh and len(sh) != count for sh in part_shapes):
                raise ConfigError(f"{type(m).__name__}: stage {m.stage_name(r)!r}: its clients' jobs differ in their number "
                                  "of phases within one batched chunk")
            kept = self._kept(stage, len(part), held[at : at + chunk])
            if stage.begin is not None:
                stage.begin(m, r, part, part_jobs)
            trained: list[dict] = [{} for _ in part]
            # a client without phases rides along in each (no batch, no loss); a chunk of such clients
            # still passes through one phase of riders: their trained networks are the loaded ones
            for p in range(max(count, 1)):
                phase = chunk_phase(m, r, [sh[p] if sh else None for sh in part_shapes])
                states, losses = self._train_phase(
                    r, form, part, part_jobs, phase, [i[p] if i else torch.zeros(0, dtype=torch.int64) for i in part_ids],
                    [d[p] if d else ClientDraws([], []) for d in part_drawn], kept)
                for i, (sh, job, st, loss) in enumerate(zip(part_shapes, part_jobs, states, losses)):
                    if sh:
                        job.losses.append(loss)
                    trained[i].update(zip(phase.train, st))
            if stage.end is not None:
                stage.end(m, r, part, part_jobs)
            for i, (k, job) in enumerate(zip(part, part_jobs)):
                # the networks a client did not train are sent as loaded (the sequential engine's snapshot)
                nets = {n: trained[i][n] if n in trained[i] else snapshot(m.globals[n]) for n in m.networks}
                ups = {}
                for n, c in kept.items():  # the client's copies as its training left them, as sequentially
                    load(m.workers[n], c.client_state(i))
                if stage.upload is not None:
                    for n in trained[i]:
                        load(m.workers[n], nets[n])
                    ups = stage.upload(m, r, k, job, m.workers)
                out.append(ClientUpdate(k, len(ctx.data.clients[k]), nets, {"train_loss": job.train_loss, **ups}))
        return out

    def _kept(self, stage, k: int, held: list[dict]) -> dict:
        """The stage's client copies for a chunk of ``k`` clients, loaded from what each prepare left."""
        m, kept = self.method, {}
        for n in stage.copies:
            if (n, k) not in self._copies:
                self._copies[(n, k)] = StackedNet(m.workers[n], k).to(m.ctx.device)
            kept[n] = self._copies[(n, k)]
            for i, h in enumerate(held):
                kept[n].load_client(i, h[n])
            kept[n].train(m.workers[n].training)  # the mode the prepare left, as the sequential copy
        return kept

    def _train_phase(self, r, form: OneForm, part, jobs, phase, idx, drawn, kept):
        """One phase of a chunk's clients on the stacked network: each client's states (one per trained
        network, from the global ones) and mean loss."""
        m, ctx = self.method, self.method.ctx
        copies = len(phase.train) * len(part)
        if copies not in self._stacked:
            self._stacked[copies] = StackedNet(m.global_model, copies).to(ctx.device)
        return batched.train_clients(ctx, m.global_model, idx, form.loss, r, self._stacked[copies],
                             torch.as_tensor(part, dtype=torch.int64), phase=phase, jobs=jobs,
                             after_step=form.after_step, models=[m.globals[n] for n in phase.train], drawn=drawn,
                             copies=kept, before_step=form.before_step, epoch_lr=form.epoch_lr)


def client_phases(m, r: int, k: int, job: LocalJob, copies: bool = False) -> list:
    """The (shape, sample ids) of each phase client k's prepared job trains (none: it trains nothing
    and rides along).

    A batched stage's job has phases on distinct networks, each trained from the global one (the
    method's first network, or several of its networks together) with the stage's loss on one
    stream (by default the client's samples), with no hook of its own: per-step work is the
    stage's ``after_step``, which both engines run. A stage that keeps client copies trains one phase."""
    where = f"{type(m).__name__}: stage {m.stage_name(r)!r} has a loss over K clients (Stage.loss), but"
    phases = job.phases if job.phases is not None else [Phase()]
    if not isinstance(phases, (list, tuple)):
        raise ConfigError(f"{where} its prepare returned phases decided one after another (a generator, client {k}); "
                          "batched: a list")
    if copies and len(phases) > 1:
        raise ConfigError(f"{where} it keeps client copies and its prepare returned several phases (client {k})")
    out, seen = [], set()
    for ph in phases:
        if ph.loss is not None or ph.on_epoch is not None or ph.after_step is not None:
            raise ConfigError(f"{where} its job has a phase loss/on_epoch/after_step (client {k}); "
                              "a batchable stage declares them as Stage.loss / Stage.after_step")
        train = tuple(ph.train or (m.networks[0],))
        if any(n not in m.networks for n in train) or job.lr:
            raise ConfigError(f"{where} its job trains working networks or sets per-network learning rates (client "
                              f"{k}); batched: the method's networks at the run's learning rate")
        if seen & set(train):
            raise ConfigError(f"{where} two phases of its job train {sorted(seen & set(train))} (client {k}); batched: "
                              "each network in one phase (a later phase would start from an earlier one's result)")
        seen |= set(train)
        streams = ph.streams if ph.streams is not None else {"data": (m.ctx.data.clients[k], None)}
        if len(streams) != 1:
            raise ConfigError(f"{where} its job reads {len(streams)} streams (client {k}); batched: one")
        ids, bs = next(iter(streams.values()))
        out.append((ChunkPhase(ph.augment, tuple(ph.views), ph.draws, ph.epochs, None if bs is None else int(bs),
                               job.lr_round, train), torch.as_tensor(ids, dtype=torch.int64)))
    return out


def chunk_phase(m, r: int, shapes: list):
    """The phase a chunk's clients train together: their shapes (:func:`client_phases`; None
    for a client that trains nothing) agree on augmentation, views, draws, epochs, batch size,
    learning-rate round and networks."""
    real = [sh for sh in shapes if sh is not None]
    if any(sh != real[0] for sh in real[1:]):
        raise ConfigError(f"{type(m).__name__}: stage {m.stage_name(r)!r} has a loss over K clients (Stage.loss), but its clients' "
                          "jobs differ in shape (augmentation, views, draws, epochs, batch size or learning-rate "
                          "round) within one batched chunk")
    return real[0] if real else ChunkPhase(train=(m.networks[0],))


# -- the loop ---------------------------------------------------------------------------------

class Simulation:
    def __init__(
        self,
        method,
        ctx: RunContext,
        checkpoint_path: str | Path | None = None,
        progress: Callable[[str], None] | None = None,
        stop_after: int | None = None,
        identity: Mapping[str, Any] | None = None,
        time_budget: TimeBudget | None = None,
    ):
        """``identity``: what, besides the engine's settings, makes this run (see :func:`~fnlcore.fl.persist.run_identity`).
        ``time_budget``: stop before it runs out, with a checkpoint (the module's docstring)."""
        if time_budget is not None and not checkpoint_path:
            raise ConfigError("a time budget needs a checkpoint path: a run stopped at its budget continues "
                              "from its checkpoint; give checkpoint_path or no budget")
        self.method = method
        self.ctx = ctx
        self.progress = progress or (lambda s: print(s, file=sys.stderr, flush=True))
        self.stop_after = stop_after  # for tests: stop (as if killed) after this many rounds
        self.time_budget = time_budget
        self.rows: list[dict] = []
        self.engine = RoundEngine(method)
        # its lines go to whatever self.progress is when it writes them
        self.checkpoint = RunCheckpoint(checkpoint_path, method, ctx, identity, lambda line: self.progress(line))

    def _save(self, next_round: int) -> None:
        started = self.time_budget.clock() if self.time_budget is not None else 0.0  # the stores' writes count
        self.checkpoint.save_round(next_round, self.rows)
        if self.time_budget is not None:
            self.time_budget.checkpoint_took(self.time_budget.clock() - started)

    def _restore(self) -> int:
        """The round to start from: the checkpoint's next round when one is resumed, else 0."""
        started = self.time_budget.clock() if self.time_budget is not None else 0.0
        resumed = self.checkpoint.resume()
        if resumed is None:
            return 0
        start, self.rows = resumed
        if self.time_budget is not None:  # until this job writes one, reading is the estimate of a write
            self.time_budget.checkpoint_took(self.time_budget.clock() - started)
        return start

    # -- the loop ----------------------------------------------------------------------------
    def run(self) -> pd.DataFrame:
        m, ctx = self.method, self.ctx
        total = m.num_rounds()
        start = self._restore()
        every = ctx.settings.checkpoint_every
        budget = self.time_budget
        for r in range(start, total):
            t0 = time.perf_counter()
            round_started = budget.clock() if budget is not None else 0.0
            self.checkpoint.begin_round(r)
            m.begin_round(r)
            clients = m.select_clients(r)
            engine, at_once = self.engine.mode(r, clients)
            m.aggregate(r, self.engine.updates(r, clients))
            m.end_round(r)
            self.checkpoint.end_round()
            row = {"round": r, "stage": m.stage_name(r), "clients": len(clients)}
            if m.should_evaluate(r):
                row.update(evaluate(ctx, m.eval_model()))
            row.update(m.round_info)
            # how the round ran (execution, like its seconds: no part of the results)
            row["engine"], row["clients_at_once"] = engine, at_once
            row["seconds"] = time.perf_counter() - t0
            self.rows.append(row)
            main = "bacc" if "bacc" in row else "acc"
            score = f"{main}={row[main]:.4f}" if main in row else "not evaluated"
            how = f"{engine}, {at_once} at once" if engine == "batched" else engine
            self.progress(round_line(r, total, f"[{row['stage']}] {score} ({row['seconds']:.1f}s, {how})"))
            done = r + 1
            if budget is not None:
                budget.round_took(budget.clock() - round_started)
            saved = done % every == 0 or done == total
            if saved:
                self._save(done)
            if self.stop_after is not None and done >= self.stop_after:
                break
            if budget is not None and done < total and not budget.another_round_fits():
                self._stop_for_time(done, total, saved)
        return self.metrics()

    def _stop_for_time(self, done: int, total: int, saved: bool) -> None:
        """Checkpoint (unless this round just did) and end the job: its time would run out in the next round."""
        if not saved:
            self._save(done)
        assert self.time_budget is not None
        raise RunIncomplete(
            f"stopped after round {done - 1} of 0..{total - 1} before the job's time limit "
            f"({self.time_budget.describe()}); checkpoint {self.checkpoint.path}: the next job continues from it",
            next_round=done, total_rounds=total)

    def metrics(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)

    def remove_checkpoint(self) -> None:
        self.checkpoint.remove()
