"""Evaluation and detection passes bounded by bytes (fnlcore.fl.local.forward_bounded), and the
device refused up front by ``fnl rehearse`` / ``fnl plan``.

A pass builds its inputs in chunks of ``eval_batch_size`` (the unit of its augmentation draws);
only the model's forward of a chunk is split into sub-batches whose estimated activations fit
the budget (``$FNL_EVAL_MEMORY_MB``, default ``EVAL_MEMORY_MB``)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from fnlcore.errors import ConfigError
from fnlcore.fl import local
from fnlcore.fl.local import (EVAL_MEMORY_ENV, EVAL_MEMORY_MB, activation_bytes, eval_memory_bytes, forward_bounded,
                              predict, sub_batch_size)
from fnlcore.fl.settings import TrainSettings
from fnlcore.models import build_model

from .engine_helpers import make_ctx


def _recording(fn, seen: list):
    def forward(x):
        seen.append(len(x))
        return fn(x)

    forward.__name__ = getattr(fn, "__name__", "forward")
    return forward


def test_activation_bytes_sums_the_leaf_outputs_of_one_sample_and_is_measured_once():
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Sequential(nn.Linear(3, 2))).eval()
    x = torch.randn(10, 4)
    assert activation_bytes(model, x) == (3 + 3 + 2) * 4  # fp32 outputs of the three leaves, one sample
    seen = []
    fn = _recording(model, seen)
    assert activation_bytes(model, torch.randn(7, 4), fn) == 32 and seen == [1]  # a forward of one sample
    assert activation_bytes(model, torch.randn(5, 4), fn) == 32 and seen == [1]  # cached: not again
    assert activation_bytes(model, torch.randn(5, 4, dtype=torch.float64).float(), fn) == 32
    assert activation_bytes(model.double(), torch.randn(5, 4, dtype=torch.float64)) == 64  # per dtype
    assert not any(m._forward_hooks for m in model.modules())  # its hooks are gone


def test_the_split_happens_exactly_when_the_estimate_exceeds_the_budget():
    model = build_model("cnn", 10, 3, (32, 32)).eval()
    x = torch.randn(24, 3, 32, 32)
    per = activation_bytes(model, x)
    for budget, sizes in [
        (24 * per, [24]),  # fits exactly: one forward
        (24 * per + 1, [24]),
        (24 * per - 1, [12, 12]),  # 1 byte over: the fewest equal parts that fit
        (10 * per, [8, 8, 8]),
        (7 * per + per // 2, [6, 6, 6, 6]),
        (per - 1, [1] * 24),  # one sample over the budget: one at a time
    ]:
        seen = []
        fn = _recording(model, seen)
        assert activation_bytes(model, x, fn) == per  # the same estimate (measured once: cached after)
        seen.clear()
        with torch.no_grad():
            out = forward_bounded(model, x, fn, budget=budget)
        assert seen == sizes and out.shape == (24, 10), (budget, seen)
        assert sub_batch_size(24, per, budget) == sizes[0]
        assert max(sizes) * per <= max(budget, per)


def test_split_logits_equal_the_unsplit_ones(capsys):
    torch.manual_seed(0)
    model = build_model("cnn", 10, 3, (32, 32)).eval()
    x = torch.randn(50, 3, 32, 32)
    per = activation_bytes(model, x)
    with torch.no_grad():
        whole = model(x)
        split = forward_bounded(model, x, budget=16 * per)  # 4 sub-batches of 13, 13, 12, 12
        z_whole, f_whole = model.forward_features(x)
        z_split, f_split = forward_bounded(model, x, model.forward_features, budget=16 * per)
    assert split.shape == whole.shape and z_split.shape == z_whole.shape and f_split.shape == f_whole.shape
    torch.testing.assert_close(split, whole, rtol=0, atol=1e-6)
    torch.testing.assert_close(z_split, z_whole, rtol=0, atol=1e-6)
    torch.testing.assert_close(f_split, f_whole, rtol=0, atol=1e-6)
    with capsys.disabled():  # reported, not required: a backend may round a sub-batch differently
        print(f"\n[eval memory] split logits bit-equal to the unsplit ones: {torch.equal(split, whole)}; "
              f"max |diff| {float((split - whole).abs().max()):.3g}")


def test_training_mode_and_single_samples_are_never_split():
    model = build_model("cnn", 10, 3, (32, 32))
    seen = []
    forward_bounded(model.train(), torch.randn(8, 3, 32, 32), _recording(model, seen), budget=1)
    assert seen == [8]  # batch statistics: a split would change the result
    seen.clear()
    with torch.no_grad():
        forward_bounded(model.eval(), torch.randn(1, 3, 32, 32), _recording(model, seen), budget=1)
    assert seen == [1]


def test_the_budget_defaults_and_reads_the_environment(monkeypatch):
    monkeypatch.delenv(EVAL_MEMORY_ENV, raising=False)
    assert eval_memory_bytes() == EVAL_MEMORY_MB * 2**20 == 16 * 2**30
    monkeypatch.setenv(EVAL_MEMORY_ENV, "512")
    assert eval_memory_bytes() == 512 * 2**20
    for bad in ("0", "-3", "1.5", "lots"):
        monkeypatch.setenv(EVAL_MEMORY_ENV, bad)
        with pytest.raises(ConfigError, match=EVAL_MEMORY_ENV):
            eval_memory_bytes()


@pytest.mark.parametrize("name,channels,size", [("mlp", 1, (8, 8)), ("lenet5", 1, (28, 28)), ("cnn", 3, (32, 32)),
                                                ("tiny", 3, (32, 32)), ("vgg16", 3, (32, 32)),
                                                ("resnet18_cifar", 3, (32, 32)), ("resnet34_cifar", 3, (32, 32))])
def test_small_inputs_are_never_split_at_the_default_budget(name, channels, size):
    """Every model of the tests and every 32 x 32 configuration of the papers keeps a chunk of the
    papers' eval_batch_size (1,024) whole, so their numbers do not move by a bit."""
    model = build_model(name, 100, channels, size).eval()
    per = activation_bytes(model, torch.zeros(2, channels, *size))
    assert 1024 * per <= EVAL_MEMORY_MB * 2**20
    assert sub_batch_size(1024, per, EVAL_MEMORY_MB * 2**20) == 1024


def test_large_inputs_are_split_at_the_default_budget():
    """ResNet-18 at 512 x 512 (ICH, FedNoRo): about 149 MiB a sample summed, so a chunk of 1,024
    runs as sub-batches of about a hundred."""
    model = build_model("resnet18", 5, 3, (512, 512)).eval()
    per = activation_bytes(model, torch.zeros(2, 3, 512, 512))
    size = sub_batch_size(1024, per, EVAL_MEMORY_MB * 2**20)
    assert 64 <= size <= 128 and size * per <= EVAL_MEMORY_MB * 2**20


def _spied(pipeline_cls, calls: list):
    train = pipeline_cls.train

    def spy(self, xb, gen):
        calls.append((len(xb), gen.get_state().clone()))
        return train(self, xb, gen)

    return spy


def test_an_augmented_pass_draws_the_same_whether_or_not_its_forward_is_split(monkeypatch):
    settings = TrainSettings(rounds=2, batch_size=16, optimizer="adam", lr=3e-3, augmentation="crop_flip",
                             eval_batch_size=64)
    ctx = make_ctx(settings)
    model = ctx.new_model().to(ctx.device)
    idx = torch.arange(len(ctx.data.train))
    start = ctx.aug_gen.get_state().clone()
    runs = {}
    for label, budget in [("whole", None), ("split", 3)]:
        ctx.aug_gen.set_state(start)
        forwards = []
        monkeypatch.setattr(type(ctx.pipeline), "train", _spied(type(ctx.pipeline), calls := []))
        forward = model.forward

        def counting(x, _forward=forward, _seen=forwards):
            _seen.append(len(x))
            return _forward(x)

        monkeypatch.setattr(model, "forward", counting)
        if budget is not None:
            per = activation_bytes(model, torch.zeros(2, 1, 8, 8))  # a digits view, as predict's
            monkeypatch.setattr(local, "eval_memory_bytes", lambda per=per: budget * per)
        logits = predict(ctx, model, ctx.data.train, idx, augment=True)
        runs[label] = (logits, calls, ctx.aug_gen.get_state().clone(), forwards)
        monkeypatch.undo()
    (z0, calls0, end0, fw0), (z1, calls1, end1, fw1) = runs["whole"], runs["split"]
    assert [n for n, _ in calls0] == [n for n, _ in calls1] == [64] * 6 + [400 - 6 * 64]  # the same chunks
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(calls0, calls1))  # each drawn from the same state
    assert torch.equal(end0, end1) and not torch.equal(end0, start)  # the generator left the same
    assert max(fw0) == 64 and max(fw1) == 3  # the second pass's forwards did split
    torch.testing.assert_close(z1, z0, rtol=0, atol=1e-6)


def test_the_budget_is_no_part_of_a_runs_identity_or_slug(monkeypatch):
    from fnlcore.app.identity import settings_identity
    from fnlcore.app.runs import train_slug

    assert not any("memory" in f.name for f in dataclasses.fields(TrainSettings))
    settings = [TrainSettings(), TrainSettings(model="resnet18", eval_batch_size=256, precision="bf16")]
    monkeypatch.delenv(EVAL_MEMORY_ENV, raising=False)
    before = [(settings_identity(s), train_slug(s)) for s in settings]
    monkeypatch.setenv(EVAL_MEMORY_ENV, "1")
    assert [(settings_identity(s), train_slug(s)) for s in settings] == before


def test_rehearse_and_plan_refuse_cuda_up_front_where_there_is_none(tmp_path, capsys, monkeypatch):
    from fnlcore import cli
    import fnlcore.app.rehearse as rh

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    monkeypatch.setattr(rh, "rehearse_one", lambda *a, **k: pytest.fail("a configuration ran"))
    out = tmp_path / "out"
    assert cli.main(["rehearse", "--tables", "demo", "--device", "cuda", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--device: 'cuda': no CUDA device" in err and "cpu" in err
    assert not out.exists()  # nothing started
    assert cli.main(["rehearse", "--tables", "demo", "--device", "gpu", "--out", str(out)]) == 2
    assert "not a device" in capsys.readouterr().err
    cal = tmp_path / "c.json"
    assert cli.main(["plan", "--scale", "smoke", "--tables", "demo", "--device", "cuda:0",
                     "--calibration", str(cal)]) == 2
    assert "--device: 'cuda:0': no CUDA device" in capsys.readouterr().err and not cal.exists()
    with pytest.raises(ConfigError, match="no CUDA device"):
        rh.rehearse(None, rh.Options(device="cuda"), out)
    assert not out.exists()


def test_rehearse_on_the_cpu_goes_on_as_before(tmp_path, capsys, monkeypatch):
    from fnlcore import cli
    import fnlcore.app.rehearse as rh
    from fnlcore.app.measurements import CSV_COLUMNS

    ran = []
    monkeypatch.setattr(rh, "rehearse_one", lambda r, opts, *a: ran.append(opts.device) or
                        {**dict.fromkeys(CSV_COLUMNS, ""), "config": r.config.key, "status": "pass"})
    key = next(iter(rh.distinct_configs(_demo_plan())))
    assert cli.main(["rehearse", "--tables", "demo", "--device", "cpu", "--only", key,
                     "--out", str(tmp_path)]) == 0
    assert ran == ["cpu"] and (tmp_path / "rehearsal.csv").exists()
    assert cli.main(["rehearse", "--tables", "demo", "--device", "cuda", "--list"]) == 0  # trains nothing


def _demo_plan():
    from fnlcore.app.plan import build_plan, validate_schema

    return build_plan(validate_schema({"tables": ["demo"], "scale": "paper", "data_grid": []}))
