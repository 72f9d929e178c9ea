"""Fixtures shared by the test modules."""

import pytest
import torch

from atlas_fast.clip.backbones import BackboneConfig, load_backbone


@pytest.fixture(scope="module")
def tiny():
    """The 3.4M-parameter random CLIP from ``atlas_fast/model_configs/atlas-tiny.json`` (32x32 images)."""
    return load_backbone(BackboneConfig("atlas-tiny", None))


@pytest.fixture(scope="module")
def one_thread():
    """The tiny model's steps are far too small for intra-op threads; on a shared 2-core machine they only contend.
    Use with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
