"""H-IDN annotator networks: trained on clean labels, probabilities per sample, deterministic."""

import numpy as np
from sklearn.datasets import load_digits

from fnlcore.app.annotate import AnnotatorSettings, save_annotator, train_annotator
from fnlcore.noise.hidn import assemble_soft_labels


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


def test_annotator_defaults_come_from_the_noise_spec():
    from fnlcore.noise import noise_spec_from_dict

    spec = noise_spec_from_dict({"name": "fednoro_hidn", "rho": 0.4, "eta_l": 0.3, "eta_u": 0.5})
    assert AnnotatorSettings.from_noise_spec(spec) == AnnotatorSettings()
