"""The same random draws on every device, and a checkpoint that resumes on any device.

Every random stream of a run is a CPU generator (fnlcore.fl.context): what a draw yields does not
depend on the device the run trains on, so a GPU run draws exactly what a CPU run draws and a
checkpoint's streams load on either. Without a second device here, the draws are made for a
``meta`` device (a device with no data, standing in for a GPU: a draw made on it would fail) and
compared with the CPU's; a checkpoint as a GPU node writes it (CUDA streams of two GPUs beside the
CPU streams) resumes on this CPU-only machine and finishes equal to an uninterrupted run.
"""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from fnlcore.augment import draw_device
from fnlcore.fl.persist import load_safely, to_safe_form
from fnlcore.fl.pipeline import InputPipeline
from fnlcore.fl.simulation import Simulation
from fnlcore.fl.settings import TrainSettings
from fnlcore.methods import METHODS
from fnlcore.methods.parts import MixupDraw, beta_draw
from fnlcore.randaugment import RandAugmentSpec

from .engine_helpers import make_ctx

META = torch.device("meta")
PIPELINES = {
    "crop_flip": InputPipeline(mean=(0.5,) * 3, std=(0.5,) * 3, augmentation="crop_flip",
                               strong=RandAugmentSpec("fixmatch_uniform", 2), strong_padding="reflect"),
    "affine_flip": InputPipeline(mean=(0.5,) * 3, std=(0.5,) * 3, augmentation="affine_flip",
                                 strong=RandAugmentSpec("fixmatch_mc", 2, 10)),
}


def _leaves(t):
    if isinstance(t, torch.Tensor):
        return [t]
    return [x for item in t for x in _leaves(item)]


@pytest.mark.parametrize("aug", sorted(PIPELINES))
@pytest.mark.parametrize("view", ["weak", "strong"])
def test_a_view_draws_the_same_for_any_device_and_leaves_the_stream_alike(aug, view):
    pipe = PIPELINES[aug]
    draws, states = [], []
    for device in ("cpu", META):
        gen = torch.Generator().manual_seed(7)
        draws.append(pipe.draw_view(view, 33, gen, device, (32, 32)))
        states.append(gen.get_state())
    cpu, meta = (_leaves(d) for d in draws)
    assert len(cpu) == len(meta) > 0
    assert all(a.device.type == b.device.type == "cpu" and torch.equal(a, b) for a, b in zip(cpu, meta))
    assert torch.equal(*states)


def test_a_batch_draw_and_a_mixup_lambda_are_host_values_for_any_device():
    for device in ("cpu", META):
        assert draw_device(torch.Generator(), device).type == "cpu"
    a = MixupDraw(1.0)(16, torch.Generator().manual_seed(3), "cpu")
    b = MixupDraw(1.0)(16, torch.Generator().manual_seed(3), META)
    assert all(x.device.type == "cpu" and torch.equal(x, y) for x, y in zip(a, b))
    assert beta_draw(1.0, torch.Generator().manual_seed(3), META) == beta_draw(1.0, torch.Generator().manual_seed(3), "cpu")


def test_the_run_streams_are_cpu_generators_whatever_the_device():
    ctx = make_ctx(TrainSettings(rounds=1))
    assert ctx.aug_gen.device.type == ctx.shuffle_gen.device.type == "cpu"


def _sim(settings, ckpt=None, stop_after=None, log=None):
    ctx = make_ctx(settings, seed=1)
    method = METHODS["feddiv"](METHODS["feddiv"].Params(warmup_iterations=1), ctx)
    return Simulation(method, ctx, ckpt, log.append if log is not None else (lambda m: None), stop_after=stop_after)


def test_a_checkpoint_written_with_gpus_resumes_on_a_machine_without_one(tmp_path):
    """FedDiv (mixup draws, the train augmentation) stopped after 2 rounds; its checkpoint gets the
    CUDA streams a two-GPU node records; it resumes here and ends equal to an uninterrupted run."""
    s = TrainSettings(rounds=4, local_epochs=1, batch_size=16, lr=0.05, momentum=0.9, checkpoint_every=1,
                      augmentation="crop_flip", model="mlp")
    full = _sim(s).run().drop(columns=["seconds"])
    ckpt = tmp_path / "run.ckpt.pt"
    _sim(s, ckpt, stop_after=2).run()
    payload = load_safely(ckpt)
    payload["rng"]["cuda"] = [torch.zeros(16, dtype=torch.uint8)] * 2  # two GPUs' Philox states
    torch.save(to_safe_form(payload), ckpt)
    log: list[str] = []
    resumed = _sim(s, ckpt, log=log).run().drop(columns=["seconds"])
    assert any(line.startswith("resumed from") for line in log), log
    pd.testing.assert_frame_equal(resumed, full, check_exact=True)


def test_a_checkpoint_with_a_device_generator_state_is_refused_with_the_fix(tmp_path):
    ctx = make_ctx(TrainSettings(rounds=1))
    state = ctx.rng_state()
    state["aug"] = torch.zeros(16, dtype=torch.uint8)  # a CUDA generator's state (older versions)
    with pytest.raises(Exception, match="drew augmentations on the GPU.*delete the checkpoint"):
        ctx.load_rng_state(state)


@pytest.mark.parametrize("precision, tf32", [("fp32", False), ("tf32", True), ("bf16", True)])
def test_the_gpu_math_policy_follows_the_precision(precision, tf32):
    from fnlcore.fl.context import set_math_policy

    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
    try:
        set_math_policy(precision)
        assert torch.backends.cuda.matmul.allow_tf32 is tf32 and torch.backends.cudnn.allow_tf32 is tf32
        assert torch.backends.cudnn.benchmark is False
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = before
