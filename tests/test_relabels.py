"""The relabel log: labels change only through it, every change is recorded, and it survives a resume."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from fnlcore.fl.relabels import COLUMNS, RelabelLog
from fnlcore.fl.settings import TrainSettings
from fnlcore.fl.simulation import Simulation
from fnlcore.methods.base import FLMethod, MethodParams

from .engine_helpers import make_ctx


def test_apply_writes_labels_and_records_only_changes():
    given = torch.tensor([0, 1, 2, 3, 4])
    log = RelabelLog()
    n = log.apply(given, torch.tensor([1, 3, 4]), torch.tensor([1, 0, 9]), round_index=7, stage="stage1", client=2)
    assert n == 2 and given.tolist() == [0, 1, 2, 0, 9]
    f = log.frame()
    assert list(f.columns) == list(COLUMNS)
    assert f.to_dict("records") == [
        {"sample": 3, "client": 2, "round": 7, "stage": "stage1", "from_label": 3, "to_label": 0},
        {"sample": 4, "client": 2, "round": 7, "stage": "stage1", "from_label": 4, "to_label": 9},
    ]
    log.apply(given, torch.tensor([3]), torch.tensor([5]), 8, "stage2")
    assert log.frame()["from_label"].tolist() == [3, 4, 0] and len(log) == 3  # a second change chains


def test_empty_log_has_typed_columns_and_bad_input_is_rejected():
    f = RelabelLog().frame()
    assert f.empty and dict(f.dtypes.astype(str)) == COLUMNS
    with pytest.raises(ValueError, match="2 indices but 1 labels"):
        RelabelLog().apply(torch.zeros(4, dtype=torch.int64), torch.tensor([0, 1]), torch.tensor([1]), 0, "s")
    with pytest.raises(ValueError, match="single-label"):
        RelabelLog().apply(torch.zeros(4, 3), torch.tensor([0]), torch.tensor([1]), 0, "s")


class _Relabeller(FLMethod):
    """Relabels client r's first sample to class r after round r (a deterministic test method)."""

    Params = MethodParams

    def end_round(self, r):
        k = r % self.ctx.data.num_clients
        self.ctx.data.relabel(self.ctx.data.clients[k][:1], torch.tensor([r % 10]), r, "main", k)


def test_relabels_survive_kill_and_resume(tmp_path):
    settings = TrainSettings(rounds=4, local_epochs=1, batch_size=32, optimizer="adam", lr=1e-3, checkpoint_every=1)

    def run(**kw):
        ctx = make_ctx(settings)
        return Simulation(_Relabeller(MethodParams(), ctx), ctx, progress=lambda m: None, **kw), ctx

    full, full_ctx = run()
    full.run()
    ckpt = tmp_path / "c.pt"
    run(checkpoint_path=ckpt, stop_after=2)[0].run()
    resumed, ctx = run(checkpoint_path=ckpt)
    resumed.run()
    pd.testing.assert_frame_equal(ctx.data.relabels.frame(), full_ctx.data.relabels.frame())
    assert torch.equal(ctx.data.given, full_ctx.data.given)
    assert full_ctx.data.relabels.frame()["round"].tolist() == sorted(full_ctx.data.relabels.frame()["round"])
