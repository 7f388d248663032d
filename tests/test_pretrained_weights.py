"""Pretrained ImageNet weights: loaded through torchvision's weight enum; offline, the error names the file and folder."""

from __future__ import annotations

import math
import urllib.error
import pytest
import torch
from fnlcore.errors import ConfigError


def test_pretrained_weights_without_network_name_the_file_and_folder(monkeypatch, tmp_path):
    from fnlcore.models import build_model

    def no_network(url, dst, *a, **k):
        raise urllib.error.URLError("no network")

    old_dir = torch.hub.get_dir()
    torch.hub.set_dir(str(tmp_path))  # an empty cache: the weights must be downloaded
    try:
        monkeypatch.setattr(torch.hub, "download_url_to_file", no_network)
        with pytest.raises(ConfigError) as e:
            build_model("resnet50", 14, 3, (224, 224), pretrained=True)
    finally:
        torch.hub.set_dir(old_dir)
    msg = str(e.value)
    assert "resnet50-0676ba61.pth" in msg and str(tmp_path / "checkpoints") in msg, msg


def test_pretrained_weights_are_read_from_the_hub_cache(tmp_path, monkeypatch):
    """A file put where the error says is loaded without any download (here a fabricated file,
    so the published hash it is checked against is the fabricated file's own)."""
    import hashlib

    from fnlcore.models import build_model, builder
    from fnlcore.models.builder import imagenet_state_dict
    from fnlcore.tv_compat import import_torchvision

    tv = import_torchvision()
    weights = tv.models.ResNet18_Weights.IMAGENET1K_V1
    src = tv.models.resnet18(weights=None)
    with torch.no_grad():
        src.fc.bias.fill_(0.5)
    name = weights.url.rsplit("/", 1)[1]
    (tmp_path / "checkpoints").mkdir()
    torch.save(src.state_dict(), tmp_path / "checkpoints" / name)
    digest = hashlib.sha256((tmp_path / "checkpoints" / name).read_bytes()).hexdigest()
    monkeypatch.setattr(builder, "_published_hash", lambda url: digest[:8])
    old_dir = torch.hub.get_dir()
    torch.hub.set_dir(str(tmp_path))
    try:
        state = imagenet_state_dict(weights)
        model = build_model("resnet18", 5, 3, (64, 64), pretrained=True)
    finally:
        torch.hub.set_dir(old_dir)
    assert math.isclose(float(state["fc.bias"][0]), 0.5)
    assert torch.equal(model.backbone.conv1.weight, src.conv1.weight)


def test_a_tensors_only_file_of_other_contents_in_the_hub_cache_is_refused(tmp_path):
    """Issue 46, item 5: torch.hub checks the hash only of what it downloads; a cached file of the
    published name but other contents loaded unchecked."""
    from fnlcore.models import build_model
    from fnlcore.tv_compat import import_torchvision

    tv = import_torchvision()
    name = tv.models.ResNet18_Weights.IMAGENET1K_V1.url.rsplit("/", 1)[1]  # resnet18-f37072fd.pth
    (tmp_path / "checkpoints").mkdir()
    path = tmp_path / "checkpoints" / name
    torch.save(tv.models.resnet18(weights=None).state_dict(), path)  # tensors only, random weights
    old_dir = torch.hub.get_dir()
    torch.hub.set_dir(str(tmp_path))
    try:
        with pytest.raises(ConfigError) as e:
            build_model("resnet18", 5, 3, (64, 64), pretrained=True)
    finally:
        torch.hub.set_dir(old_dir)
    msg = str(e.value)
    assert str(path) in msg and "does not match its published hash" in msg and "published f37072fd" in msg, msg
    assert "delete it and download it again" in msg


class _Payload:
    """Unpickling this touches a marker file: what a crafted cache file could do instead."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        import pathlib

        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


def test_a_crafted_file_in_the_hub_cache_is_refused_and_runs_nothing(tmp_path, monkeypatch):
    """Even a crafted file that matched its published hash would be read with weights_only (the hash
    is monkeypatched to the crafted file's own, so the load itself is what refuses it)."""
    import hashlib

    from fnlcore.models import builder
    from fnlcore.models.builder import imagenet_state_dict
    from fnlcore.tv_compat import import_torchvision

    tv = import_torchvision()
    weights = tv.models.ResNet18_Weights.IMAGENET1K_V1
    marker = tmp_path / "ran"
    (tmp_path / "checkpoints").mkdir()
    crafted = tmp_path / "checkpoints" / weights.url.rsplit("/", 1)[1]
    torch.save({"fc.bias": _Payload(marker)}, crafted)
    monkeypatch.setattr(builder, "_published_hash", lambda url: hashlib.sha256(crafted.read_bytes()).hexdigest()[:8])
    old_dir = torch.hub.get_dir()
    torch.hub.set_dir(str(tmp_path))
    try:
        with pytest.raises(ConfigError, match="holds more than tensors") as e:
            imagenet_state_dict(weights)
    finally:
        torch.hub.set_dir(old_dir)
    assert not marker.exists()
    # one line naming what was refused, not torch's page (issue 46, item 5)
    msg = str(e.value)
    assert "\n" not in msg and "GLOBAL" in msg and "two options" not in msg and len(msg) < 600, msg
