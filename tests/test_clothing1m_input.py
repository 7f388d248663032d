"""Clothing1M's input pipeline (issue 24): the papers' codes read training images at 256 x 256 and
crop 224 at random on the device, test images at 224 x 224 (FedCorr/FedDiv) or Resize(256) +
CenterCrop(224) (FedGR); FedGR's strong view is RandomResizedCrop(224) + flip + RandAugment."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fnlcore import augment
from fnlcore.errors import ConfigError
from fnlcore.fl.pipeline import InputPipeline, make_pipeline
from fnlcore.image_transforms import ImageLoading, image_loading
from fnlcore.fl.settings import TrainSettings
from fnlcore.imagefiles import ImageFiles, short_side_size
from fnlcore.methods import METHODS
from fnlcore.methods.fedgr import FedGRParams
from fnlcore.randaugment import RandAugmentSpec, rand_augment

from .engine_helpers import make_ctx

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _images(n: int, size: int = 256, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, size, size), generator=g, dtype=torch.uint8)


def _norm(x: torch.Tensor) -> torch.Tensor:
    m, s = torch.tensor(MEAN)[:, None, None], torch.tensor(STD)[:, None, None]
    return (x.float() / 255.0 - m) / s


def _clothing_pipeline(transform: str = "resize_crop") -> InputPipeline:
    return make_pipeline("imagenet", "crop_flip", 3, "clothing1m", loading=image_loading(transform, (224, 224)))


# -- loading sizes -------------------------------------------------------------------------------


def test_image_loading_sizes_of_each_transform():
    assert image_loading("resize", (224, 224)) == ImageLoading((224, 224), (224, 224), None)
    assert image_loading("resize_crop", (224, 224)) == ImageLoading((256, 256), (224, 224), None)
    assert image_loading("resize_crop_center", (224, 224)) == ImageLoading((256, 256), (224, 224), 256)
    assert not image_loading("resize", (224, 224)).crops and image_loading("resize_crop", (224, 224)).crops
    with pytest.raises(ConfigError, match="image_transform"):
        image_loading("bogus", (224, 224))


def test_train_settings_validate_image_transform_and_default_is_todays():
    assert TrainSettings().image_transform == "resize"
    assert TrainSettings(image_transform="resize_crop_center").image_transform == "resize_crop_center"
    with pytest.raises(ConfigError, match="image_transform"):
        TrainSettings(image_transform="crop256")


# -- crops on the device -------------------------------------------------------------------------


def test_train_crop_is_a_224_window_of_the_256_resize_then_a_flip():
    x = _images(16)
    p = _clothing_pipeline()
    assert p.crop_size == (224, 224) and p.input_size == (256, 256) and p.crop_padding == 0
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    out = p.train(x, g1)
    assert out.shape == (16, 3, 224, 224)
    # the same draws by hand: row then column offsets uniform in 0..32, then the flips
    oy = torch.randint(0, 33, (16,), generator=g2)
    ox = torch.randint(0, 33, (16,), generator=g2)
    flip = torch.rand(16, generator=g2) < 0.5
    for i in range(16):
        win = x[i, :, oy[i] : oy[i] + 224, ox[i] : ox[i] + 224]
        win = win.flip(-1) if flip[i] else win
        torch.testing.assert_close(out[i], _norm(win), rtol=0, atol=1e-6)
    assert int(oy.max()) <= 32 and int(ox.max()) <= 32
    # the batched engine's split draw gives the same views
    g3, g4 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert torch.equal(p.apply_train(x, p.draw_train(16, g3, x.device)), p.train(x, g4))


def test_crop_offsets_cover_the_whole_slack():
    oy, ox = augment.draw_crop(4000, 0, torch.Generator().manual_seed(0), "cpu", (32, 32))
    assert int(oy.min()) == 0 and int(oy.max()) == 32 and int(ox.min()) == 0 and int(ox.max()) == 32


def test_eval_view_centre_crops_training_images_and_keeps_test_images():
    p = _clothing_pipeline()
    train, test = _images(3, 256), _images(3, 224, seed=1)
    torch.testing.assert_close(p.eval(train), _norm(train[:, :, 16:240, 16:240]), rtol=0, atol=1e-6)
    torch.testing.assert_close(p.eval(test), _norm(test), rtol=0, atol=1e-6)


def test_center_crop_rounds_like_torchvision():
    x = torch.arange(5 * 7, dtype=torch.float32).view(1, 1, 5, 7)
    # top = round(3 / 2) = 2 (half to even), left = round(4 / 2) = 2
    assert torch.equal(augment.center_crop(x, (2, 3)), x[..., 2:4, 2:5])
    assert torch.equal(augment.center_crop(x, (4, 6)), x[..., 0:4, 0:6])  # round(0.5) = 0


def test_other_datasets_keep_the_padded_crop():
    p = make_pipeline("imagenet", "crop_flip", 3, "cifar10")
    assert p.crop_size is None and p.crop_padding == 4 and p.strong_crop == "train"
    x = _images(8, 32)
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    oy, ox = augment.draw_crop(8, 4, g2, "cpu")
    flip = augment.draw_flip(8, 0.5, g2, "cpu")
    ref = augment.flip_where(augment.crop_at(x, 4, (oy, ox)), flip)
    assert torch.equal(p.train(x, g1), _norm(ref))
    assert torch.equal(p.eval(x), _norm(x))
    # "resize" loading is today's pipeline too
    assert make_pipeline("imagenet", "crop_flip", 3, "clothing1m", loading=image_loading("resize", (224, 224))) == \
        make_pipeline("imagenet", "crop_flip", 3, "clothing1m")


def test_in_memory_contexts_ignore_image_transform():
    s = TrainSettings(rounds=4, local_epochs=1, batch_size=16, optimizer="adam", lr=3e-3, image_transform="resize_crop")
    ctx = make_ctx(s)
    assert ctx.pipeline.crop_size is None


# -- RandomResizedCrop ---------------------------------------------------------------------------


def test_resized_crop_matches_interpolate_on_each_crop():
    x = _images(6)
    box = augment.draw_resized_crop(6, (256, 256), torch.Generator().manual_seed(2), "cpu")
    out = augment.resized_crop_at(x, box, (224, 224))
    assert out.shape == (6, 3, 224, 224) and out.dtype == torch.uint8
    for i, (t, l, h, w) in enumerate(zip(*(b.tolist() for b in box))):
        assert 0 <= t and t + h <= 256 and 0 <= l and l + w <= 256
        assert 0.08 * 256 * 256 * 0.9 <= h * w <= 256 * 256
        ref = F.interpolate(x[i : i + 1, :, t : t + h, l : l + w].float(), size=(224, 224), mode="bilinear",
                            align_corners=False)
        diff = (out[i].float() - ref[0].round().clamp(0, 255)).abs()
        assert float(diff.max()) <= 1.0 and float((diff > 0).float().mean()) < 0.01  # float rounding only


def test_resized_crop_hand_cases():
    g = torch.Generator().manual_seed(0)
    # scale 1, ratio 1: the whole image
    t, l, h, w = augment.draw_resized_crop(4, (256, 256), g, "cpu", scale=(1.0, 1.0), ratio=(1.0, 1.0))
    assert t.tolist() == [0] * 4 and l.tolist() == [0] * 4 and h.tolist() == [256] * 4 and w.tolist() == [256] * 4
    # a ratio that never fits a square image: torchvision's fallback, the central 256 x 128 box
    t, l, h, w = augment.draw_resized_crop(3, (256, 256), g, "cpu", scale=(1.0, 1.0), ratio=(2.0, 2.0))
    assert h.tolist() == [128] * 3 and w.tolist() == [256] * 3 and t.tolist() == [64] * 3 and l.tolist() == [0] * 3
    # an identity box at the same size gives the image back
    x = _images(2, 16)
    box = (torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.long), torch.full((2,), 16), torch.full((2,), 16))
    assert torch.equal(augment.resized_crop_at(x, box, (16, 16)), x)


# -- FedGR's strong view -------------------------------------------------------------------------


def test_strong_view_is_resized_crop_flip_randaugment():
    spec = RandAugmentSpec(kind="fixmatch_uniform", n=3)
    p = dataclasses.replace(_clothing_pipeline("resize_crop_center"), strong=spec, strong_padding="reflect",
                            strong_crop="resized")
    x = _images(4)
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    out = p.view("strong", x, g1)
    assert out.shape == (4, 3, 224, 224)
    ref = augment.random_hflip(augment.random_resized_crop(x, (224, 224), g2), 0.5, g2)
    ref = rand_augment(ref, spec, g2)
    assert torch.equal(out, _norm(ref))


def _fedgr(pipeline: InputPipeline):
    ctx = make_ctx()
    ctx.pipeline = pipeline
    return METHODS["fedgr"](FedGRParams(warmup_rounds=1), ctx)


def test_fedgr_builds_the_resized_strong_view_when_training_images_are_cropped():
    crop = _fedgr(InputPipeline(mean=(0.5,), std=(0.25,), augmentation="crop_flip", crop_padding=0,
                                crop_size=(6, 6), input_size=(8, 8)))
    assert crop.pipeline.strong_crop == "resized"
    assert crop.pipeline.strong == RandAugmentSpec(kind="fixmatch_uniform", n=3)
    x = torch.randint(0, 256, (5, 1, 8, 8), dtype=torch.uint8)
    assert crop.pipeline.view("strong", x, torch.Generator().manual_seed(0)).shape == (5, 1, 6, 6)
    assert crop.pipeline.view("weak", x, torch.Generator().manual_seed(0)).shape == (5, 1, 6, 6)
    # CIFAR-style pipelines keep the reflect-padded weak crop
    plain = _fedgr(InputPipeline(mean=(0.5,), std=(0.25,), augmentation="crop_flip"))
    assert plain.pipeline.strong_crop == "train" and plain.pipeline.strong_padding == "reflect"


# -- reading files -------------------------------------------------------------------------------


def test_short_side_size_truncates_like_torchvision():
    assert short_side_size(300, 400, 256) == (256, 341)
    assert short_side_size(500, 375, 256) == (341, 256)
    assert short_side_size(256, 256, 256) == (256, 256)


def test_image_files_resize_then_centre_crop(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    arr = rng.integers(0, 256, (400, 300, 3), dtype=np.uint8)  # H 400, W 300
    path = tmp_path / "a.png"
    Image.fromarray(arr).save(path)
    x, _ = ImageFiles([str(path)], (224, 224), 3, short_side=256)[0]
    ref = np.asarray(Image.fromarray(arr).resize((256, 341), Image.BILINEAR))
    top, left = int(round((341 - 224) / 2.0)), 16
    assert x.shape == (3, 224, 224)
    assert np.array_equal(x.permute(1, 2, 0).numpy(), ref[top : top + 224, left : left + 224])
    y, _ = ImageFiles([str(path)], (256, 256), 3)[0]  # the train split: Resize((256, 256))
    assert np.array_equal(y.permute(1, 2, 0).numpy(), np.asarray(Image.fromarray(arr).resize((256, 256), Image.BILINEAR)))


# -- the tables ----------------------------------------------------------------------------------


def test_clothing1m_tables_use_the_papers_pipelines():
    from fnlcore.app.papers import Scale, load_paper

    scale = Scale.load("paper")
    feddiv = {t.table: t for t in load_paper("feddiv", scale)}["5"]
    fedgr = {t.table: t for t in load_paper("fedgr", scale)}
    for table, want in ((feddiv, "resize_crop"), (fedgr["3"], "resize_crop_center"), (fedgr["16"], "resize_crop_center")):
        assert {r.run.training.image_transform for r in table.runs} == {want}
