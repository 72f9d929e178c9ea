"""Backbone loading: random configs, local OpenAI/open_clip files, fingerprints and the errors users meet."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import save_file

import open_clip
from atlas_fast.clip import backbones, open_clip_names, weights_files
from atlas_fast.clip.backbones import BackboneConfig, load_backbone, shared_backbone
from atlas_fast.clip.checkpoints import CheckpointError
from atlas_fast.clip.open_clip_names import WeightsUnavailableError
from atlas_fast.clip.transforms import OPENAI_MEAN
from atlas_fast.cli import main

TINY = BackboneConfig("atlas-tiny", None)


def test_random_init_is_seeded_and_fingerprinted(tiny):
    again = load_backbone(TINY)
    other = load_backbone(BackboneConfig("atlas-tiny", None, init_seed=1))
    assert tiny.fingerprint == again.fingerprint
    assert tiny.fingerprint != other.fingerprint
    assert tiny.architecture["activation"] == "QuickGELU"
    assert tiny.preprocessing.image_size == 32
    assert not any(p.requires_grad for p in tiny.model.parameters())


def test_openai_state_dict_file_runs_like_openai_clip(tiny, tmp_path):
    """A ``.pt`` with OpenAI's keys goes through open_clip's OpenAI loader: QuickGELU, architecture from the weights."""
    path = tmp_path / "ViT-tiny.pt"
    torch.save(tiny.model.state_dict(), path)
    loaded = load_backbone(BackboneConfig("atlas-tiny", str(path)))
    assert loaded.architecture["activation"] == "QuickGELU"
    assert loaded.preprocessing.mean == OPENAI_MEAN
    pixels = torch.randn(2, 3, 32, 32)
    # OpenAI's loader stores weights in fp16 (as the released files are), hence the tolerance.
    torch.testing.assert_close(loaded.encode_image(pixels), tiny.encode_image(pixels), atol=5e-3, rtol=5e-3)
    torch.testing.assert_close(loaded.encode_text(["a photo of a cat."]), tiny.encode_text(["a photo of a cat."]),
                               atol=5e-3, rtol=5e-3)
    assert loaded.fingerprint != tiny.fingerprint  # fp16-rounded weights are other weights


def test_an_openai_layout_file_of_another_architecture_than_the_model_is_refused(tiny, tmp_path):
    """An OpenAI-layout ``.pt`` whose shapes are no known OpenAI model and not ``--model``'s: refused, naming the
    file and both architectures (it was loaded as the file's own CLIP and recorded under the asked name,
    ``ViT-B-16`` with a 64-wide embedding; for KDPL a teacher of another architecture trained unannounced)."""
    path = tmp_path / "tiny.pt"
    torch.save(tiny.model.state_dict(), path)
    for asked in ("ViT-B-16", "atlas-tiny-teacher"):
        with pytest.raises(CheckpointError) as caught:
            load_backbone(BackboneConfig(asked, str(path)))
        message = str(caught.value)
        assert message.startswith(f"Cannot load checkpoint {path} as model '{asked}' (embed ")
        assert ("it holds a CLIP of another architecture (embed 64; vision width 64, 2 layers, patch 8, 32 px; "
                "text width 64, 2 layers)") in message and "the --model it was trained as" in message
    assert load_backbone(BackboneConfig("atlas-tiny", str(path))).architecture["embed_dim"] == 64  # its own: loads


def test_open_clip_safetensors_file_loads_exactly(tiny, tmp_path):
    path = tmp_path / "tiny.safetensors"
    save_file({k: v.contiguous() for k, v in tiny.model.state_dict().items()}, str(path))
    loaded = load_backbone(BackboneConfig("atlas-tiny", str(path)))
    assert loaded.fingerprint == tiny.fingerprint
    pixels = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(loaded.encode_image(pixels), tiny.encode_image(pixels))


def test_missing_local_file_says_where_such_files_come_from(tmp_path):
    """The message names the file once and then says where such files come from (its folder's weights files when it
    has some), never the path again."""
    (tmp_path / "ViT-B-32.pt").write_bytes(b"")
    with pytest.raises(FileNotFoundError) as caught:
        load_backbone(BackboneConfig("ViT-B-16", str(tmp_path / "nope.pt")))
    message = str(caught.value)
    assert message.count(str(tmp_path / "nope.pt")) == 1 and "its folder holds ViT-B-32.pt" in message
    assert "come from" in message and "clip.load" in message


def test_none_means_random_weights_in_python_as_on_the_command_line():
    """``BackboneConfig("atlas-tiny", "none")`` is the CLI's ``--pretrained none``: random weights (it was refused
    as an unknown pretrained tag whose known tags were 'none')."""
    for spelling in ("none", "None", "random", ""):
        assert BackboneConfig("atlas-tiny", spelling) == BackboneConfig("atlas-tiny", None)
    assert load_backbone(BackboneConfig("atlas-tiny", "none")).fingerprint == \
        load_backbone(BackboneConfig("atlas-tiny", None)).fingerprint


def test_unknown_tag_lists_known_ones():
    with pytest.raises(ValueError, match="openai"):
        load_backbone(BackboneConfig("ViT-B-16", "not-a-tag"))


def test_download_failure_says_how_to_pass_a_local_file(monkeypatch):
    def offline(*args, **kwargs):
        raise OSError("Name or service not known")

    monkeypatch.setenv(weights_files.DOWNLOAD_VARIABLE, "1")
    monkeypatch.setattr(backbones, "cached_weights", lambda name, tag: None)
    monkeypatch.setattr(open_clip, "create_model", offline)
    with pytest.raises(WeightsUnavailableError, match="local checkpoint file"):
        load_backbone(BackboneConfig("ViT-B-16", "openai"))


def test_offline_tag_is_a_one_line_cli_error_after_the_data_checks(monkeypatch, tmp_path, capsys):
    """A dataset typo is reported before any weights are looked for; then a tag whose weights are not here is one
    line that names --download and the local-file alternative, with no attempt to fetch them."""
    from layouts import make_oxford_pets

    monkeypatch.delenv(weights_files.DOWNLOAD_VARIABLE, raising=False)
    monkeypatch.setattr(backbones, "cached_weights", lambda name, tag: None)
    monkeypatch.setattr(open_clip, "create_model", lambda *a, **k: pytest.fail("a download was attempted"))
    args = ["train", "--dataset", "OxfordPets", "--data-root", str(tmp_path / "data"), "--model", "ViT-B/16",
            "--pretrained", "openai", "--shots", "2", "--cache-root", str(tmp_path / "cache"), "--results-dir",
            str(tmp_path / "results"), "--no-progress"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "oxford_pets" in err and "--download" not in err  # the data, first
    make_oxford_pets(tmp_path / "data", n_classes=2, n_train=2, n_val=1, n_test=1, size=32)
    assert main(args) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "not on this machine" in err[0] and "--download" in err[0]
    assert "--pretrained ~/.cache/clip/ViT-B-16.pt" in err[0]


def test_shared_backbone_loads_once_and_reloads_an_edited_file(tiny, tmp_path):
    path = tmp_path / "tiny.safetensors"
    save_file({k: v.contiguous() for k, v in tiny.model.state_dict().items()}, str(path))
    config = BackboneConfig("atlas-tiny", str(path))
    first = shared_backbone(config)
    assert shared_backbone(config) is first
    other = load_backbone(BackboneConfig("atlas-tiny", None, init_seed=3))
    save_file({k: v.contiguous() for k, v in other.model.state_dict().items()}, str(path))
    later = path.stat().st_mtime_ns + 10**9  # a later modification time, even on coarse-grained file systems
    os.utime(path, ns=(later, later))
    reloaded = shared_backbone(config)
    assert reloaded is not first and reloaded.fingerprint == other.fingerprint != first.fingerprint


def test_a_home_relative_checkpoint_path_is_expanded(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    save_file({k: v.contiguous() for k, v in tiny.model.state_dict().items()}, str(tmp_path / "tiny.safetensors"))
    assert load_backbone(BackboneConfig("atlas-tiny", "~/tiny.safetensors")).fingerprint == tiny.fingerprint


def test_a_pretrained_tag_that_is_not_cached_fails_at_once_without_the_network(monkeypatch):
    """No silent network default: weights that are not on the machine are an immediate one-line error naming
    --download, and nothing tries to fetch them."""
    monkeypatch.delenv(weights_files.DOWNLOAD_VARIABLE, raising=False)
    monkeypatch.setattr(backbones, "cached_weights", lambda name, tag: None)
    monkeypatch.setattr(backbones.open_clip, "create_model",
                        lambda *a, **k: pytest.fail("a download was attempted"))
    with pytest.raises(WeightsUnavailableError, match="not on this machine.*--download"):
        backbones.load_backbone(BackboneConfig("ViT-B-16", "openai"))
    monkeypatch.setenv(weights_files.DOWNLOAD_VARIABLE, "1")  # asked for: open_clip is called with the tag
    calls = []
    monkeypatch.setattr(backbones.open_clip, "create_model", lambda *a, **k: calls.append(k) or 1 / 0)
    with pytest.raises(WeightsUnavailableError, match="Could not obtain"):
        backbones.load_backbone(BackboneConfig("ViT-B-16", "openai"))
    assert calls and calls[0]["pretrained"] == "openai"


def test_cached_weights_are_found_in_the_hub_cache_then_the_url_cache(tmp_path):
    hub, urls = tmp_path / "hub", tmp_path / "clip"
    assert open_clip_names.cached_weights("ViT-B-16", "openai", str(hub), str(urls)) is None
    urls.mkdir()
    (urls / "ViT-B-16.pt").write_bytes(b"x")  # where open_clip's URL download puts OpenAI's file
    assert open_clip_names.cached_weights("ViT-B-16", "openai", str(hub), str(urls)) == urls / "ViT-B-16.pt"
    snapshot = hub / "models--timm--vit_base_patch16_clip_224.openai" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "open_clip_model.safetensors").write_bytes(b"y")
    (hub / "models--timm--vit_base_patch16_clip_224.openai" / "refs").mkdir()
    (hub / "models--timm--vit_base_patch16_clip_224.openai" / "refs" / "main").write_text("abc123")
    assert open_clip_names.cached_weights("ViT-B-16", "openai", str(hub), str(urls)) == \
        snapshot / "open_clip_model.safetensors"
