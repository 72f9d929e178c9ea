"""Record names, keys, metrics, losses and learned tensors of a fixed set of tiny runs, pinned to the values they had
before the vocabulary clean-up (issue 33): renaming and moving code must change none of them. Every label schedule,
a soft-label kind of each sort, a method of each path (cached features, pixels, a head, an image-conditioned prompt)
and a batched group; about a second on the tiny random CLIP. Tensors are pinned by their sum and norm at 5
significant digits (bit-exact values differ between CPUs' vector units); names and keys are exact (content hashes)."""

import pytest
import torch

from atlas_fast.atlas.variants import label_variant
from atlas_fast.engine import run_group
from helpers import eight_class_pets, tiny_pets_config

pytestmark = pytest.mark.usefixtures("one_thread")


def variant(setting, kind, schedule="auto"):
    chosen = label_variant(setting, kind, schedule)
    return dict(schedule=chosen.schedule, soft_labels=chosen.soft_labels)


CASES = [
    [dict(**variant("base2new", "csl"))],
    [dict(method="kgcoop", setting="few_shot", **variant("few_shot", "isl"))],
    [dict(method="dept-coop", **variant("base2new", "none", "tfkd"))],
    [dict(method="cocoop", **variant("base2new", "none", "ols"))],
    [dict(method="ivlp", method_options={"depth_text": 2, "depth_vision": 2})],
    [dict(seed=seed, **variant("base2new", "mix")) for seed in (1, 2)],  # one batched group
]

# stem -> (record key, config key, metrics, per-epoch losses, learned tensor -> (sum, norm))
PINNED = {
    "coop-atlas2-csl-base2new-4shot-seed1-f34cf3420674": (
        "f34cf34206743d5a3489ffcb8613565c", "99afe8cccc7ef1eb0497f9e57dcba7a7",
        {"base": 25.0, "new": 25.0, "all": 12.5, "H": 25.0}, [1.6959, 1.7066],
        {"ctx": (-0.68492, 40.746)}),
    "kgcoop-atlas3-isl-few_shot-4shot-seed1-578b0e675fa2": (
        "578b0e675fa2cf581cd0213e347a5a9f", "ff3a42a96bb6e51002a20ea0db441911",
        {"all": 12.5}, [2.6806, 3.2735],
        {"ctx": (-0.68403, 37.717)}),
    "dept-coop-tfkd-base2new-4shot-seed1-4cb9dfa3e5b0": (
        "4cb9dfa3e5b06ad99baeaece89e5257a", "9a595318cd6518329fa73aa4de561895",
        {"base": 25.0, "new": 25.0, "all": 4.1666669845581055, "H": 25.0}, [1.4467, 3.7491],
        {"base.ctx": (-0.68492, 13.97), "film_image_bias": (-2.5612, 2.3723), "film_image_scale": (50.554, 6.8771), "film_text_bias": (0.37245, 0.73983), "film_text_scale": (60.899, 7.6739), "linear_bias": (0.12553, 1.0332), "linear_weight": (1.0251, 9.6879)}),
    "cocoop-ols-base2new-4shot-seed1-267588567308": (
        "2675885673089b4ce5818a1ba01b50e7", "84d1561360bbfc0ccceb153c9fba6720",
        {"base": 25.0, "new": 25.0, "all": 12.5, "H": 25.0}, [0.72115, 0.91596],
        {"ctx": (-0.68493, 0.64885), "meta_bias1": (0.33171, 0.21426), "meta_bias2": (-5.265, 2.4069), "meta_weight1": (1.2416, 1.1863), "meta_weight2": (-1.2425, 4.5862)}),
    "ivlp-onehot-base2new-4shot-seed1-bb0f04604f99": (
        "bb0f04604f99556f40ea4365ab5ec00c", "4a8512dc45c8d2ba2b2a0f9fae677c49",
        {"base": 33.333335876464844, "new": 33.333335876464844, "all": 4.1666669845581055, "H": 33.333335876464844}, [1.7741, 1.6277],
        {"ctx": (-0.68493, 54.328), "deep_text": (0.26449, 20.569), "deep_vision": (0.47602, 1.2252), "vision_ctx": (-0.29232, 1.4724)}),
    "coop-atlas2-mix-base2new-4shot-seed1-84236944f602": (
        "84236944f60232a9ce0f6afb96aa9c5a", "037e1a57be40b0871f38d9526057941e",
        {"base": 25.0, "new": 25.0, "all": 4.1666669845581055, "H": 25.0}, [1.6959, 1.5719],
        {"ctx": (-0.68493, 30.565)}),
    "coop-atlas2-mix-base2new-4shot-seed2-14c78324e785": (
        "14c78324e78581ef68e132c647531c5f", "5cca1fe41870030776a98683c9612ec3",
        {"base": 25.0, "new": 25.0, "all": 12.5, "H": 25.0}, [1.6957, 1.4834],
        {"ctx": (-0.68493, 20.39)}),
}


def five_digits(value: float) -> float:
    return float(f"{value:.5g}")


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    root = eight_class_pets(tmp_path_factory, "pinned")
    return [record for changes in CASES
            for record in run_group([tiny_pets_config(root, content_hash=True, **c) for c in changes])]


def test_the_pinned_runs_keep_their_names_keys_metrics_and_tensors(records):
    from pathlib import Path

    assert sorted(Path(r["path"]).stem for r in records) == sorted(PINNED)
    for record in records:
        stem = Path(record["path"]).stem
        key, config_key, metrics, losses, tensors = PINNED[stem]
        assert (record["key"], record["config_key"]) == (key, config_key), stem
        assert {k: v for k, v in record["metrics"].items() if k not in ("zero_shot", "calibration")} == pytest.approx(metrics), stem
        assert [e["loss"] for e in record["epochs"]] == pytest.approx(losses, rel=1e-4), stem
        learned = torch.load(Path(record["path"]).with_suffix(".pt"), weights_only=True)
        assert sorted(learned) == sorted(tensors), stem
        for name, (total, norm) in tensors.items():
            value = learned[name].double()
            assert (float(value.sum()), float(value.norm())) == pytest.approx((total, norm), rel=1e-4, abs=1e-4), (
                stem, name)
