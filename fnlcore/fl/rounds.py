"""Which engine trains a round's clients, decided from what the method declares.

The sequential engine (:func:`~fnlcore.fl.client.train_client`) trains clients one after
another; the batched engine (:mod:`fnlcore.fl.batched`) trains them as one stacked
computation. A round runs batched when ``training.engine`` allows it, the run suits it
(:func:`batched_fits`) and the round's stage has a loss over K clients (``Stage.loss``, the one loss form);
nothing is inferred from which methods a class overrides.
"""

from __future__ import annotations

from typing import Iterator

import torch

from ..errors import ConfigError
from .client import ClientUpdate, LocalJob, OneForm, Phase, train_client
from .context import RunContext
from .state import load, snapshot


def batched_support(cls) -> str | None:
    """Why the batched engine can never run method class ``cls``, or None when some stage can."""
    if any(st.batchable for st in cls.stages.values()):
        return None
    return "none of its stages batches (Stage.batches: its jobs are not one stacked step)"


def use_batched_engine(cls, engine: str, where: str = "") -> bool:
    """Whether method class ``cls`` may train with the batched engine under ``training.engine``.

    batched: yes, or a ConfigError naming why it cannot; auto: where it can; sequential: no."""
    if engine == "sequential":
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
    from .stacked import check_stackable, gains_on_cpu

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
        self.batched = use_batched_engine(type(method), ctx.settings.engine) and batched_fits(
            ctx, method.global_model, strict=ctx.settings.engine == "batched"
        )
        self._stacked: dict = {}  # K -> StackedNet, one per chunk size, reused every round
        self._copies: dict = {}  # (client network, K) -> its K stacked copies (fl.copies), reused

    def describe(self) -> str:
        """Which engine trains the run, for its log: where batched, its chunk size."""
        if not self.batched:
            return "sequential"
        chunk = self.method.ctx.settings.batched_clients
        staged = [n for n, st in type(self.method).stages.items() if st.batchable]
        every = len(staged) == len(type(self.method).stages)
        return (f"batched, {f'up to {chunk}' if chunk else 'all'} of a round's clients at once"
                f"{'' if every else ' (stages ' + ', '.join(staged) + '; the others sequential)'}")

    def mode(self, r: int, clients: list[int]) -> tuple[str, int]:
        """How round ``r`` trains ``clients``: ('sequential', 1) or ('batched', clients stacked at once)."""
        if not self.batched or not self.method.current_stage(r).batchable or not clients:
            return "sequential", 1
        return "batched", min(len(clients), self.method.ctx.settings.batched_clients or len(clients))

    def updates(self, r: int, clients: list[int]) -> Iterator[ClientUpdate]:
        """The round's client updates, in client order, produced as they are consumed."""
        stage = self.method.current_stage(r)
        if not self.batched or not stage.batchable or not clients:
            return (train_client(self.method, r, k) for k in clients)
        return iter(self._batched(r, clients, stage))

    def _batched(self, r: int, clients: list[int], stage) -> list[ClientUpdate]:
        """The round's clients as stacked computations, in chunks of ``training.batched_clients``.

        The stage's ``prepare`` runs for every client first, each followed by the draws of that
        client's training (its place in the sequential order): it may act (relabel, read a store,
        an augmented pass with the global model) and return a one-phase job (see
        :func:`client_phase`); its ``upload`` runs after training, on each client's trained network
        (an upload that draws random numbers declares them: ``Stage.reserve`` makes them right after
        the client's training draws). ``Stage.begin``/``end`` run around each chunk,
        ``Stage.before_step``/``after_step`` around each stacked optimiser step."""
        from .batched import ClientDraws, draw_client, draw_fn, train_clients
        from .stacked import StackedNet

        m, ctx = self.method, self.method.ctx
        jobs, shapes, ids, drawn, held = [], [], [], [], []
        for k in clients:
            job = stage.prepare(m, r, k, m.workers) if stage.prepare is not None else None
            # what the prepare left in each client network the stage keeps is this client's copy
            # (fl.copies), held on the host until its chunk trains: a round's clients, not a chunk's
            held.append({n: {key: v.detach().to("cpu", copy=True) for key, v in m.workers[n].state_dict().items()}
                         for n in stage.copies})
            job = LocalJob() if job is None else job
            shape, idx = client_phase(m, r, k, job)
            jobs.append(job)
            shapes.append(shape)
            ids.append(idx)
            # the client's batches and random parameters right after its prepare, where the sequential
            # engine draws them (a prepare that draws too, an augmented pass, keeps its place)
            if shape is None:  # a client that does not train draws nothing (a rider all along)
                drawn.append(ClientDraws([], []))
            else:
                epochs = ctx.settings.local_epochs if shape.epochs is None else shape.epochs
                drawn.append(draw_client(ctx, idx, epochs, shape.batch_size or ctx.settings.batch_size,
                                         draw_fn(ctx, shape)))
            if stage.reserve is not None:  # the upload's draws, at its place in the sequential order
                job.reserved = stage.reserve(m, r, k, job)
        chunk = ctx.settings.batched_clients or len(clients)
        out: list[ClientUpdate] = []
        for at in range(0, len(clients), chunk):  # chunks in client order keep the sequential draw order
            part, part_jobs, part_drawn = clients[at : at + chunk], jobs[at : at + chunk], drawn[at : at + chunk]
            phase, idx = chunk_phase(m, r, shapes[at : at + chunk]), ids[at : at + chunk]
            part_ids = torch.as_tensor(part, dtype=torch.int64)  # on the host; train_clients copies it over
            copies = len(phase.train) * len(part)
            if copies not in self._stacked:
                self._stacked[copies] = StackedNet(m.global_model, copies).to(ctx.device)
            kept = {}
            for n in stage.copies:
                if (n, len(part)) not in self._copies:
                    self._copies[(n, len(part))] = StackedNet(m.workers[n], len(part)).to(ctx.device)
                kept[n] = self._copies[(n, len(part))]
                for i, h in enumerate(held[at : at + chunk]):
                    kept[n].load_client(i, h[n])
                kept[n].train(m.workers[n].training)  # the mode the prepare left, as the sequential copy
            if stage.begin is not None:
                stage.begin(m, r, part, part_jobs)
            form = OneForm.of(m, stage, r)
            states, losses = train_clients(ctx, m.global_model, idx, form.loss, r, self._stacked[copies], part_ids,
                                           phase=phase, jobs=part_jobs, after_step=form.after_step,
                                           models=[m.globals[n] for n in phase.train], drawn=part_drawn, copies=kept,
                                           before_step=form.before_step, epoch_lr=form.epoch_lr)
            if stage.end is not None:
                stage.end(m, r, part, part_jobs)
            for i, (k, job, shape, trained, l) in enumerate(zip(part, part_jobs, shapes[at : at + chunk], states, losses)):
                if shape is not None:  # a client that trains nothing has no loss (as in the sequential engine)
                    job.losses.append(l)
                # the networks a client did not train are sent as loaded (the sequential engine's snapshot)
                nets = {n: trained[phase.train.index(n)] if n in phase.train else snapshot(m.globals[n])
                        for n in m.networks}
                ups = {}
                for n, c in kept.items():  # the client's copies as its training left them, as sequentially
                    load(m.workers[n], c.client_state(i))
                if stage.upload is not None:
                    for n in phase.train:
                        load(m.workers[n], nets[n])
                    ups = stage.upload(m, r, k, job, m.workers)
                out.append(ClientUpdate(k, len(ctx.data.clients[k]), nets, {"train_loss": job.train_loss, **ups}))
        return out


def client_phase(m, r: int, k: int, job: LocalJob):
    """The shape of the one phase client k's prepared job trains (None: it trains nothing and rides
    along), and its sample ids.

    A batched stage's job has at most one phase, which trains the method's first network (or
    several of its networks together) with the stage's loss on one stream (by default the
    client's samples) and has no hook of its own: per-step work is the stage's ``after_step``,
    which both engines run."""
    from .batched import ChunkPhase

    where = f"{type(m).__name__}: stage {m.stage(r)!r} has a loss over K clients (Stage.loss), but"
    phases = job.phases if job.phases is not None else [Phase()]
    if isinstance(phases, (list, tuple)) and not phases:
        return None, torch.zeros(0, dtype=torch.int64)
    if not isinstance(phases, (list, tuple)) or len(phases) != 1:
        raise ConfigError(f"{where} its prepare returned a job of several phases (client {k})")
    ph = phases[0]
    if ph.loss is not None or ph.on_epoch is not None or ph.after_step is not None:
        raise ConfigError(f"{where} its job has a phase loss/on_epoch/after_step (client {k}); "
                          "a batchable stage declares them as Stage.loss / Stage.after_step")
    train = tuple(ph.train or (m.networks[0],))
    if any(n not in m.networks for n in train) or job.lr:
        raise ConfigError(f"{where} its job trains working networks or sets per-network learning rates (client "
                          f"{k}); batched: the method's networks at the run's learning rate")
    streams = ph.streams if ph.streams is not None else {"data": (m.ctx.data.clients[k], None)}
    if len(streams) != 1:
        raise ConfigError(f"{where} its job reads {len(streams)} streams (client {k}); batched: one")
    ids, bs = next(iter(streams.values()))
    shape = ChunkPhase(ph.augment, tuple(ph.views), ph.draws, ph.epochs, None if bs is None else int(bs),
                       job.lr_round, train)
    return shape, torch.as_tensor(ids, dtype=torch.int64)


def chunk_phase(m, r: int, shapes: list):
    """The one phase a chunk's clients train together: their shapes (:func:`client_phase`; None
    for a client that trains nothing) agree on augmentation, views, draws, epochs, batch size,
    learning-rate round and networks."""
    from .batched import ChunkPhase

    real = [sh for sh in shapes if sh is not None]
    if any(sh != real[0] for sh in real[1:]):
        raise ConfigError(f"{type(m).__name__}: stage {m.stage(r)!r} has a loss over K clients (Stage.loss), but its clients' "
                          "jobs differ in shape (augmentation, views, draws, epochs, batch size or learning-rate "
                          "round) within one batched chunk")
    return real[0] if real else ChunkPhase(train=(m.networks[0],))
