"""H-IDN annotator networks: trained on clean labels, probabilities per sample, deterministic."""

import dataclasses
import re

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from fnlcore.app.annotate import AnnotatorSettings, annotator_context, save_annotator, train_annotator
from fnlcore.errors import ConfigError, DataError
from fnlcore.fl.pipeline import IMAGENET
from fnlcore.noise.hidn import assemble_soft_labels
from fnlcore.noise.specs import FedNoRoHIDN


def _client():
    d = load_digits()
    x = np.round(d.images[:200] * 255 / 16).astype(np.uint8)[..., None]
    return x, d.target[:200].astype(np.int64)


def test_annotator_learns_and_returns_probabilities():
    x, y = _client()
    s = AnnotatorSettings(epochs=15, batch_size=16, lr=3e-3)
    state, probs, name = train_annotator(y, 10, s, (8, 8), 1, images=x, device="cpu")
    assert name == "mlp" and probs.shape == (200, 10)
    np.testing.assert_allclose(probs.sum(1), 1.0, rtol=1e-9)
    assert (probs.argmax(1) == y).mean() > 0.9


def test_annotator_is_deterministic():
    x, y = _client()
    s = AnnotatorSettings(epochs=2, seed=5)
    _, p1, _ = train_annotator(y, 10, s, (8, 8), 1, images=x, device="cpu")
    _, p2, _ = train_annotator(y, 10, s, (8, 8), 1, images=x, device="cpu")
    np.testing.assert_array_equal(p1, p2)
    _, p3, _ = train_annotator(y, 10, AnnotatorSettings(epochs=2, seed=6), (8, 8), 1, images=x, device="cpu")
    assert not np.array_equal(p1, p3)


def test_soft_labels_assembled_by_sample_id(tmp_path):
    x, y = _client()
    s = AnnotatorSettings(epochs=1)
    files = []
    for k, ids in enumerate([np.arange(0, 50), np.arange(120, 200)]):
        state, probs, name = train_annotator(y[ids], 10, s, (8, 8), 1, images=x[ids], device="cpu")
        ck, pr = tmp_path / f"c{k}.pt", tmp_path / f"c{k}.probs.npz"
        save_annotator(ck, pr, state, probs, ids, s, name, k)
        files.append(str(pr))
        saved = torch.load(ck, weights_only=True)  # the artifact format the workflow caches
        assert saved["settings"] == dataclasses.asdict(s) and (saved["model"], saved["client"]) == (name, k)
        assert saved["state_dict"].keys() == state.keys()
        with np.load(pr) as z:
            assert sorted(z.files) == ["probs", "sample_id"] and z["sample_id"].tolist() == ids.tolist()
    soft = assemble_soft_labels(files, 200, 10)
    assert np.isnan(soft[50:120]).all()
    np.testing.assert_allclose(soft[:50].sum(1), 1.0)
    np.testing.assert_allclose(soft[120:].sum(1), 1.0)


def test_annotator_streams_images_from_disk(tmp_path):
    from PIL import Image

    x, y = _client()
    paths = []
    for i in range(40):
        p = tmp_path / f"{i}.png"
        Image.fromarray(np.repeat(x[i], 4, 0).repeat(4, 1)[..., 0]).save(p)  # 32x32 grey
        paths.append(str(p))
    s = AnnotatorSettings(model="tiny", epochs=1, batch_size=8)
    state, probs, name = train_annotator(y[:40], 10, s, (32, 32), 1, paths=paths, device="cpu")
    assert name == "tiny" and probs.shape == (40, 10)
    np.testing.assert_allclose(probs.sum(1), 1.0, rtol=1e-9)
    # Streamed with augmentation (32 px: affine+flip) and still one result per seed.
    _, again, _ = train_annotator(y[:40], 10, s, (32, 32), 1, paths=paths, device=torch.device("cpu"))
    np.testing.assert_array_equal(probs, again)


def test_annotator_defaults_come_from_the_noise_spec():
    from fnlcore.noise import noise_spec_from_dict

    spec = noise_spec_from_dict({"name": "fednoro_hidn", "rho": 0.4, "eta_l": 0.3, "eta_u": 0.5})
    assert AnnotatorSettings.from_noise_spec(spec) == AnnotatorSettings()
    spec_keys = {f.name for f in dataclasses.fields(FedNoRoHIDN) if f.name.startswith("annotator_")}
    assert {"annotator_" + f.name for f in dataclasses.fields(AnnotatorSettings)} == spec_keys
    tuned = noise_spec_from_dict({"name": "fednoro_hidn", "rho": 0.4, "eta_l": 0.3, "eta_u": 0.5,
                                  "annotator_epochs": 7, "annotator_lr": 1, "annotator_model": "tiny"})
    assert AnnotatorSettings.from_noise_spec(tuned) == AnnotatorSettings(model="tiny", epochs=7, lr=1.0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"epochs": 0}, "annotator_epochs=0 must be >= 1"),
        ({"lr": 0.0}, "annotator_lr=0.0 must be > 0"),
        ({"weight_decay": -1e-4}, "annotator_weight_decay=-0.0001 must be >= 0"),
        ({"batch_size": 2.5}, "annotator_batch_size=2.5 must be an integer"),
        ({"seed": -1}, "annotator_seed=-1 must be >= 0"),
    ],
)
def test_annotator_settings_run_the_noise_spec_checks(kwargs, message):
    with pytest.raises(ConfigError, match="noise model 'fednoro_hidn': " + re.escape(message)):
        AnnotatorSettings(**kwargs)
    assert isinstance(AnnotatorSettings(lr=1).lr, float)  # the declared type, as in the spec


def test_annotator_input_pipeline_by_image_size():
    cpu = torch.device("cpu")
    x, y = _client()
    digits = annotator_context(y, 10, AnnotatorSettings(), (8, 8), 1, x, None, cpu)
    assert digits.model_name == "mlp" and not digits.settings.pretrained
    assert digits.pipeline.augmentation == "none" and digits.pipeline.mean == (0.5,)
    assert (digits.settings.optimizer, digits.settings.lr, digits.settings.batch_size) == ("adam", 3e-4, 16)
    rgb = np.zeros((4, 64, 64, 3), np.uint8)
    large = annotator_context(np.arange(4), 4, AnnotatorSettings(), (64, 64), 3, rgb, None, cpu)
    assert large.model_name == "resnet18" and large.settings.pretrained  # fednoro.md A3
    assert large.pipeline.augmentation == "affine_flip" and large.pipeline.mean == IMAGENET[0]
    named = annotator_context(np.arange(4), 4, AnnotatorSettings(model="resnet18"), (64, 64), 3, rgb, None, cpu)
    assert not named.settings.pretrained and named.pipeline.mean == (0.5, 0.5, 0.5)
    grey = annotator_context(np.arange(4), 4, AnnotatorSettings(), (64, 64), 1, rgb[..., :1], None, cpu)
    assert grey.model_name == "resnet18" and not grey.settings.pretrained and grey.pipeline.mean == (0.5,)


def test_an_annotators_and_its_noise_sets_identity_follow_a_changed_training_default(monkeypatch):
    """Issue 46, item 2: annotators train with TrainSettings' defaults (beta1, momentum, ...), so a
    changed default must change the annotator's identity (the param Snakemake tracks) and the H-IDN
    noise set's, and leave a noise set that trains no annotator alone."""
    from fnlcore.app import annotate, identity
    from fnlcore.fl.settings import TrainSettings
    from fnlcore.noise.specs import SymmetricNoise

    hidn, sym = FedNoRoHIDN(rho=0.6, eta_l=0.3, eta_u=0.5), SymmetricNoise(rate=0.2)
    settings = AnnotatorSettings.from_noise_spec(hidn)
    before = {d: (identity.annotator_identity(settings, d), identity.noise_identity(hidn, d))
              for d in ("digits", "ich_fednoro")}
    plain = identity.noise_identity(sym, "digits")
    assert plain == identity.settings_identity(sym)  # unchanged for a noise without annotators
    # the digest covers the resolved training settings as a run's identity does
    training = annotate.annotator_training(settings, (8, 8), 1)
    assert identity.annotator_identity(settings, "digits") == identity.settings_identity(settings, training)

    @dataclasses.dataclass(frozen=True)
    class Moved(TrainSettings):  # TrainSettings.beta1's default changed in the code
        beta1: float = 0.5

    monkeypatch.setattr(annotate, "TrainSettings", Moved)
    for d, (ann, noise) in before.items():
        assert identity.annotator_identity(settings, d) != ann
        assert identity.noise_identity(hidn, d) != noise
    assert identity.noise_identity(sym, "digits") == plain
    # the annotator trains with what its identity digests
    x, y = _client()
    ctx = annotator_context(y, 10, settings, (8, 8), 1, x, None, torch.device("cpu"))
    assert ctx.settings.beta1 == 0.5 and ctx.settings == annotate.annotator_training(settings, (8, 8), 1)


@pytest.mark.parametrize("content", [b"", b"PK\x03\x04 cut short", None])
def test_a_broken_probabilities_file_names_itself_and_the_fix(tmp_path, content):
    """Issue 46, item 5: a zero-byte annotator .probs.npz gave `EOFError: No data left in file`."""
    path = tmp_path / "client0.probs.npz"
    if content is None:  # readable, but not an annotator's file
        np.savez(path, other=np.zeros(3))
    else:
        path.write_bytes(content)
    with pytest.raises(DataError, match=re.escape(str(path)) + ".*(not a readable|lacks).*--forcerun"):
        assemble_soft_labels([str(path)], 10, 3)
