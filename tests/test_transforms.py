"""Views of the feature cache: CLIP's test transform and seeded, order-independent train augmentations."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms as T
from torchvision.transforms import functional as TF

from atlas_fast.clip.transforms import OPENAI_MEAN, OPENAI_STD
from atlas_fast.clip.transforms import (ImageReadError, TransformSpec, load_views, normalize_pixels,
                                        random_resized_crop_params, read_image, view_pixels, view_seed)
from tests.layouts import write_image


def image_view(image: Image.Image, spec: TransformSpec, key: str, view: int) -> torch.Tensor:
    """One view of a decoded image as the cache encodes it, (3, S, S): view 0 the test transform, views >= 1
    seeded augmentations."""
    return normalize_pixels(view_pixels(image, spec, key, view)[None], spec)[0]


@pytest.fixture()
def spec() -> TransformSpec:
    return TransformSpec(image_size=32, mean=OPENAI_MEAN, std=OPENAI_STD)


@pytest.fixture()
def photo(tmp_path) -> tuple[str, Image.Image]:
    path = tmp_path / "a" / "photo.jpg"
    write_image(path, seed=3, size=45)  # 53 x 45: not square, so resize and crop both matter
    return str(path), read_image(path)


def test_view0_is_clip_preprocessing(spec, photo):
    _, image = photo
    clip = T.Compose([T.Resize(32, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(32), T.ToTensor(),
                      T.Normalize(OPENAI_MEAN, OPENAI_STD)])
    assert torch.equal(image_view(image, spec, "a/photo.jpg", 0), clip(image))


def test_crop_sampling_matches_torchvision(spec):
    """Same draws as torchvision's RandomResizedCrop.get_params would make from a generator in the same state."""
    image = Image.new("RGB", (53, 45))
    for seed in range(20):
        torch.manual_seed(seed)
        expected = T.RandomResizedCrop.get_params(image, [0.08, 1.0], [3 / 4, 4 / 3])
        ours = random_resized_crop_params(53, 45, (0.08, 1.0), (3 / 4, 4 / 3), torch.Generator().manual_seed(seed))
        assert tuple(ours) == tuple(expected)


def test_crop_fallback_is_a_centre_crop_within_ratio():
    """A 1000x10 strip cannot fit any sampled box: the fallback centre crop clamps the aspect ratio to 4/3."""
    top, left, h, w = random_resized_crop_params(1000, 10, (0.9, 1.0), (3 / 4, 4 / 3), torch.Generator().manual_seed(0))
    assert (top, h) == (0, 10) and w == round(10 * 4 / 3) and left == (1000 - w) // 2


def test_view_seed_is_stable_across_processes_and_machines():
    # Fixed values: a salted hash() or a process-dependent seed would change them between runs.
    assert view_seed(0, "images/a.jpg", 1) == view_seed(0, "images/a.jpg", 1)
    assert view_seed(0, "images/a.jpg", 1) == 4373089496463823493
    assert len({view_seed(s, k, v) for s in (0, 1) for k in ("a", "b") for v in (1, 2)}) == 8


def test_augmented_views_are_deterministic_in_any_order(spec, photo):
    path, image = photo
    forward = [image_view(image, spec, "a/photo.jpg", v) for v in (1, 2, 3)]
    torch.manual_seed(123)  # global RNG state must not matter
    backward = [image_view(image, spec, "a/photo.jpg", v) for v in (3, 2, 1)][::-1]
    for a, b in zip(forward, backward):
        assert torch.equal(a, b)
    stacked = load_views(path, "a/photo.jpg", [2, 0, 1], spec)
    assert stacked.shape == (3, 3, 32, 32)
    assert torch.equal(stacked[0], forward[1]) and torch.equal(stacked[2], forward[0])


def test_views_differ_by_view_key_and_seed(spec, photo):
    _, image = photo
    base = image_view(image, spec, "a/photo.jpg", 1)
    assert not torch.equal(base, image_view(image, spec, "a/photo.jpg", 2))
    assert not torch.equal(base, image_view(image, spec, "a/other.jpg", 1))
    reseeded = TransformSpec(image_size=32, mean=OPENAI_MEAN, std=OPENAI_STD, aug_seed=1)
    assert not torch.equal(base, image_view(image, reseeded, "a/photo.jpg", 1))
    assert not torch.equal(base, image_view(image, spec, "a/photo.jpg", 0))


def test_global_rng_is_untouched(spec, photo):
    _, image = photo
    state = torch.get_rng_state()
    image_view(image, spec, "a/photo.jpg", 5)
    assert torch.equal(state, torch.get_rng_state())


def test_flip_rate_is_about_half(spec):
    """Each augmented view is the seeded crop, mirrored or not; about half of them are mirrored (p = 0.5)."""
    image = Image.linear_gradient("L").rotate(90).convert("RGB").resize((40, 40))  # left-right asymmetric
    flips = 0
    for i in range(100):
        key = f"k{i}"
        g = torch.Generator().manual_seed(view_seed(0, key, 1))
        top, left, h, w = random_resized_crop_params(40, 40, spec.crop_scale, spec.crop_ratio, g)
        crop = TF.resized_crop(image, top, left, h, w, [32, 32], interpolation=T.InterpolationMode.BICUBIC)
        plain = TF.normalize(TF.to_tensor(crop), OPENAI_MEAN, OPENAI_STD)
        view = image_view(image, spec, key, 1)
        if not torch.equal(view, plain):
            assert torch.equal(view, TF.hflip(plain))
            flips += 1
    assert 30 < flips < 70


def test_fingerprint_tracks_everything_that_changes_pixels(spec):
    same = TransformSpec(image_size=32, mean=OPENAI_MEAN, std=OPENAI_STD)
    assert spec.fingerprint() == same.fingerprint()
    others = [TransformSpec(image_size=33, mean=OPENAI_MEAN, std=OPENAI_STD),
              TransformSpec(image_size=32, mean=(0.5, 0.5, 0.5), std=OPENAI_STD),
              TransformSpec(image_size=32, mean=OPENAI_MEAN, std=OPENAI_STD, aug_seed=7),
              TransformSpec(image_size=32, mean=OPENAI_MEAN, std=OPENAI_STD, crop_scale=(0.5, 1.0)),
              TransformSpec(image_size=32, mean=OPENAI_MEAN, std=OPENAI_STD, interpolation="bilinear")]
    assert len({spec.fingerprint()} | {o.fingerprint() for o in others}) == 1 + len(others)
    description = spec.describe()
    assert description["version"] >= 1 and description["aug_seed"] == 0


def test_unreadable_images_name_the_file(tmp_path, spec):
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not a jpeg at all")
    with pytest.raises(ImageReadError, match="broken.jpg"):
        load_views(broken, "broken.jpg", [0], spec)
    with pytest.raises(ImageReadError, match="missing.jpg"):
        read_image(tmp_path / "missing.jpg")


def test_grey_and_rgba_images_become_rgb(tmp_path, spec):
    Image.new("L", (40, 36), 128).save(tmp_path / "grey.png")
    Image.new("RGBA", (40, 36), (10, 20, 30, 40)).save(tmp_path / "rgba.png")
    for name in ("grey.png", "rgba.png"):
        assert load_views(tmp_path / name, name, [0, 1], spec).shape == (2, 3, 32, 32)


def test_8_bit_views_normalise_bit_for_bit_as_torchvision(spec, photo):
    """A view's 8-bit pixels, normalised as one batch (CPU) or looked up in the table (any other device), give
    exactly torchvision's ToTensor + Normalize of that view, for every 8-bit value."""
    from atlas_fast.clip.transforms import load_view_pixels, look_up_pixels, normalize_pixels

    path, image = photo
    pixels = load_view_pixels(path, "a/photo.jpg", [0, 1, 2, 3], spec)
    assert pixels.dtype == np.uint8 and pixels.shape == (4, 32, 32, 3)
    expected = torch.stack([TF.normalize(TF.to_tensor(Image.fromarray(p)), OPENAI_MEAN, OPENAI_STD) for p in pixels])
    assert torch.equal(normalize_pixels(pixels, spec), expected)
    every = np.random.default_rng(0).permutation(np.repeat(np.arange(256, dtype=np.uint8), 81)).reshape(3, 48, 48, 3)
    looked_up = look_up_pixels(every, spec, torch.device("cpu"))  # what a GPU runs
    by_torchvision = torch.stack([TF.normalize(TF.to_tensor(Image.fromarray(p)), OPENAI_MEAN, OPENAI_STD)
                                  for p in every])
    assert torch.equal(normalize_pixels(every, spec), by_torchvision) and torch.equal(looked_up, by_torchvision)
