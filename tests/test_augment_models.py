"""Batched augmentation and the model registry."""

import pytest
import torch
import torch.nn.functional as F

from fnlcore import augment
from fnlcore.errors import ConfigError
from fnlcore.models import MODELS, build_model


def _batch(n=6, c=3, h=8, w=8):
    return torch.arange(n * c * h * w, dtype=torch.float32).reshape(n, c, h, w)


def test_random_crop_is_a_window_of_the_padded_image():
    x = _batch()
    g = torch.Generator().manual_seed(3)
    out = augment.random_crop(x, 2, g)
    xp = F.pad(x, (2, 2, 2, 2))
    for i in range(x.shape[0]):
        found = any(
            torch.equal(out[i], xp[i, :, dy : dy + 8, dx : dx + 8]) for dy in range(5) for dx in range(5)
        )
        assert found
    assert torch.equal(augment.random_crop(x, 0, g), x)


def test_random_crop_uses_several_offsets():
    x = _batch(n=64)
    out = augment.random_crop(x, 4, torch.Generator().manual_seed(0))
    assert len({tuple(o.flatten()[:3].tolist()) for o in out - x}) > 5


def test_hflip_all_or_nothing():
    x = _batch()
    assert torch.equal(augment.random_hflip(x, 1.0), x.flip(-1))
    assert torch.equal(augment.random_hflip(x, 0.0), x)


def test_affine_identity_and_determinism():
    x = _batch()
    assert torch.equal(augment.random_affine(x, 0.0, (0.0, 0.0)), x)
    a = augment.random_affine(x, 10, (0.1, 0.1), torch.Generator().manual_seed(1))
    b = augment.random_affine(x, 10, (0.1, 0.1), torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and not torch.equal(a, x)


def test_random_crop_reflect_pads_like_torchvision():
    x = _batch()
    out = augment.random_crop(x, 3, torch.Generator().manual_seed(1), padding_mode="reflect")
    xp = F.pad(x, (3, 3, 3, 3), mode="reflect")  # torchvision's padding_mode='reflect'
    for i in range(x.shape[0]):
        assert any(torch.equal(out[i], xp[i, :, dy : dy + 8, dx : dx + 8]) for dy in range(7) for dx in range(7))
    with pytest.raises(ValueError, match="padding_mode='edge'"):
        augment.random_crop(x, 3, None, padding_mode="edge")


def test_affine_keeps_uint8():
    x = torch.randint(0, 255, (4, 3, 16, 16), dtype=torch.uint8)
    assert augment.random_affine(x, 10, (0.02, 0.02)).dtype == torch.uint8


@pytest.mark.parametrize(
    "name,c,size",
    [("mlp", 1, (8, 8)), ("lenet5", 1, (28, 28)), ("lenet5_linear_head", 3, (32, 32)), ("cnn", 3, (32, 32)), ("vgg16", 3, (32, 32)),
     ("resnet18_cifar", 3, (32, 32)), ("resnet34_cifar", 3, (32, 32)), ("resnet18", 3, (64, 64))],
)
def test_models_shapes_and_features(name, c, size):
    m = build_model(name, 7, c, size).eval()
    x = torch.randn(2, c, *size, generator=torch.Generator().manual_seed(0))
    assert m(x).shape == (2, 7)
    assert m.features(x).shape == (2, m.feature_dim)
    logits, feats = m.forward_features(x)  # one pass gives both (prototype methods)
    assert torch.allclose(logits, m(x), atol=1e-5) and torch.allclose(feats, m.features(x), atol=1e-5)
    assert torch.allclose(m.head(feats), logits, atol=1e-5)


def test_fedncl_lenet_parameter_count():
    # conv 1->6 (156) + conv 6->16 (2416) + 256x120 + 120x84 + 84x10 = 44,426 (fedncl.md §4)
    assert sum(p.numel() for p in build_model("lenet5", 10, 1, (28, 28)).parameters()) == 44426


def test_lenet_heads_fedncl_relu_on_the_logits_fedcorr_linear():
    ncl, corr = build_model("lenet5", 10, 3, (32, 32)), build_model("lenet5_linear_head", 10, 3, (32, 32))
    assert [type(m) for m in ncl.head] == [torch.nn.Linear, torch.nn.ReLU]
    assert type(corr.head) is torch.nn.Linear  # FedCorr's model/lenet.py: fc3 is the output
    assert str(ncl.backbone) == str(corr.backbone)
    # FedCorr's LeNet on CIFAR: conv 3->6 (456) + conv 6->16 (2416) + 400x120 + 120x84 + 84x10 = 62,006
    assert sum(p.numel() for p in corr.parameters()) == sum(p.numel() for p in ncl.parameters()) == 62006
    x = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    assert (ncl(x) >= 0).all() and (corr(x) < 0).any()


@pytest.mark.parametrize("name", ["lenet5", "lenet5_linear_head"])
def test_lenets_train_a_step(name):
    torch.manual_seed(0)
    m = build_model(name, 10, 1, (28, 28))
    x, y = torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    before = [p.detach().clone() for p in m.parameters()]
    loss = F.cross_entropy(m(x), y)
    loss.backward()
    opt.step()
    assert torch.isfinite(loss)
    assert all(not torch.equal(a, p) for a, p in zip(before, m.parameters()))


def test_unknown_model_lists_valid_names():
    with pytest.raises(ConfigError) as e:
        build_model("resnet19", 10, 3, (32, 32))
    assert "resnet19" in str(e.value) and all(n in str(e.value) for n in MODELS)
