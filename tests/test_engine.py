"""FL engine: aggregation arithmetic, client sampling, determinism and resume."""

import numpy as np
import pandas as pd
import pytest
import torch

from fnlcore.fl import sampling
from fnlcore.fl.settings import TrainSettings
from fnlcore.fl.simulation import Simulation
from fnlcore.fl.state import RunningAverage, per_tensor_distance, weighted_average
from fnlcore.methods import METHODS, method_from_dict
from fnlcore.errors import ConfigError

from .engine_helpers import make_ctx


def test_fedavg_weighting_hand_case():
    # baselines.md §1: w1=[1,2], w2=[3,6], n=[1,3] -> [2.5, 5.0]; integer buffers from the first client
    s1 = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(7)}
    s2 = {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(9)}
    out = weighted_average([s1, s2], [1, 3])
    assert torch.allclose(out["w"], torch.tensor([2.5, 5.0])) and int(out["n"]) == 7
    ra = RunningAverage()
    ra.add(s1, 1)
    ra.add(s2, 3)
    res = ra.result(s1)
    assert torch.allclose(res["w"], torch.tensor([2.5, 5.0])) and res["w"].dtype == torch.float32 and int(res["n"]) == 7


def test_single_client_average_is_identity():
    s = {"w": torch.randn(5)}
    assert torch.equal(weighted_average([s], [3])["w"], s["w"])


def test_per_tensor_distance_sums_norms():
    a = {"x": torch.tensor([3.0, 4.0]), "y": torch.tensor([1.0]), "n": torch.tensor(1)}
    b = {"x": torch.zeros(2), "y": torch.zeros(1), "n": torch.tensor(5)}
    assert per_tensor_distance(a, b) == pytest.approx(6.0)


def test_sampling_rules():
    rng = np.random.RandomState(0)
    assert sampling.uniform_fraction(rng, 7, 1.0) == list(range(7))
    picked = sampling.uniform_fraction(rng, 100, 0.1)
    assert len(picked) == 10 and len(set(picked)) == 10
    cyc = sampling.CyclicSampler(10, 0.2)
    seen = [k for _ in range(5) for k in cyc.next(rng)]
    assert sorted(seen) == list(range(10))  # every client once per cycle


def test_train_settings_reject_bad_values():
    with pytest.raises(ConfigError, match="optimizer"):
        TrainSettings(optimizer="rmsprop")
    with pytest.raises(ConfigError, match="client_fraction"):
        TrainSettings(client_fraction=0)
    with pytest.raises(ConfigError, match="lrr"):
        TrainSettings.from_dict({"lrr": 0.1})


def _run(name, params=None, rounds=4, seed=0, **kw):
    ctx = make_ctx(TrainSettings(rounds=rounds, local_epochs=1, batch_size=16, optimizer="adam", lr=3e-3, checkpoint_every=1), seed=seed)
    p = method_from_dict({"name": name, **(params or {})})
    m = METHODS[name](p, ctx)
    return Simulation(m, ctx, progress=lambda s: None, **kw), m


def _values(df):
    return df.drop(columns=["seconds"])


def _same(a, b):
    pd.testing.assert_frame_equal(_values(a), _values(b), check_exact=True)


def test_same_seed_same_numbers_and_different_seed_differs():
    a = _run("fedavg")[0].run()
    b = _run("fedavg")[0].run()
    c = _run("fedavg", seed=1)[0].run()
    _same(a, b)
    assert not _values(a).equals(_values(c))


@pytest.mark.parametrize("name,params", [("fedavg", {}), ("fednoro", {"warmup_rounds": 2})])
def test_resume_after_kill_gives_identical_numbers(tmp_path, name, params):
    full = _run(name, params, rounds=5)[0].run()
    ck = tmp_path / "run.ckpt.pt"
    first, _ = _run(name, params, rounds=5, checkpoint_path=ck, stop_after=3)
    first.run()  # "killed" after round 3 (checkpoint written every round)
    assert ck.exists()
    resumed, _ = _run(name, params, rounds=5, checkpoint_path=ck)
    out = resumed.run()
    _same(out, full)


def test_metrics_have_every_round_and_stage():
    df = _run("fednoro", {"warmup_rounds": 2}, rounds=4)[0].run()
    assert df["round"].tolist() == [0, 1, 2, 3]
    assert df["stage"].tolist() == ["warmup", "warmup", "stage2", "stage2"]
    assert {"acc", "bacc"} <= set(df.columns)


def test_disk_streaming_yields_images_with_their_sample_ids(tmp_path):
    from PIL import Image

    from fnlcore.fl.data import ImageSource

    paths = []
    for i in range(12):
        p = tmp_path / f"{i}.png"
        Image.fromarray(np.full((4, 4), i * 10, np.uint8)).save(p)
        paths.append(str(p))
    src = ImageSource(torch.device("cpu"), paths=paths, image_size=(4, 4), channels=1, workers=0)
    got = [(ids.tolist(), (x[:, 0, 0, 0] // 10).tolist()) for x, ids in src.batches(torch.tensor([7, 2, 9]), 2)]
    assert got == [([7, 2], [7, 2]), ([9], [9])]
