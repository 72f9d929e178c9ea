"""The names of the units a plan is priced with, each naming what it measures (``step/coop/C=500/B=32/R=4/<config
digest>``): the keys :mod:`~atlas_fast.pricing.facts` gives a plan, :mod:`~atlas_fast.pricing.calibrate` measures and
the calibration store keeps."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any


def config_digest(method_config: Any) -> str:
    """A short digest of a method config (a unit is measured per config), of the text it always had: the config's
    repr after ``num_runs=1``, once its first field, so the units a machine keeps stay found."""
    if method_config is None:
        return ""
    fields = [f"{f.name}={getattr(method_config, f.name)!r}" for f in dataclasses.fields(method_config) if f.repr]
    text = f"{type(method_config).__name__}({', '.join(['num_runs=1'] + fields)})"
    return hashlib.blake2b(text.encode(), digest_size=6).hexdigest()


def step_key(method: str, classes: int, batch: int, runs: int, digest: str = "") -> str:
    return f"step/{method}/C={classes}/B={batch}/R={runs}/{digest}"


def eval_key(method: str, classes: int, digest: str = "", runs: int = 1) -> str:
    """The evaluation unit of ``method`` at C = ``classes`` for ``runs`` runs evaluated together in one pass."""
    return f"eval/{method}/C={classes}{f'/R={runs}' if runs > 1 else ''}/{digest}"


def soft_key(kind: str, classes: int, images: int) -> str:
    return f"soft/{kind}/C={classes}/N={images}"


def overhead_key(method: str, classes: int, digest: str = "") -> str:
    return f"overhead/{method}/C={classes}/{digest}"


ENCODE_KEY = "encode"
DECODE_KEY = "decode"


def encode_key(batch: int) -> str:
    """The encode unit timed in encoder batches of ``batch`` views (the cost per view grows with the batch on a CPU:
    201 views of one image cost 1.1-1.25x the view of a batch of 64 on the world CLIP)."""
    return f"{ENCODE_KEY}/B={batch}"


CUT_KEY = "cut"  # the cache build's workers' part of decoding: 8-bit views, not normalised


def cut_key(dataset: str) -> str:
    """The cut unit (:data:`CUT_KEY`) timed on a sample of ``dataset``'s own image files."""
    return f"{CUT_KEY}/{dataset}"


def decode_key(dataset: str) -> str:
    """The decode unit timed on a sample of ``dataset``'s own image files."""
    return f"{DECODE_KEY}/{dataset}"


EXIT_KEY = "process end"
LOADER_KEY = "loader start"
LOAD_KEY = "backbone load"
REPORT_KEY = "report"
ZERO_SHOT = "zsclip"
