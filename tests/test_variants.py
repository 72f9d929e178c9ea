"""The ATLaS package's variants (atlas_fast.atlas.variants): each preset's schedule, soft labels and labels, and the
record names they give, pinned to the names the same runs had before the variants moved there (a finished record
must stay findable: its name is its identity)."""

import pytest
import torch

from atlas_fast.atlas.schedules import Alternating, Joint, OneHot, OnlineLabelSmoothing, TeacherFreeKD
from atlas_fast.atlas.softlabels import soft_label_preset
from atlas_fast.atlas.variants import (ablation_row_name, alternation_period, label_variant, paper_variants, row_name,
                                       run_variant_name)
from atlas_fast.engine.config import TrainConfig
from atlas_fast.engine.spec import config_key, describe_run, record_stem, resolve_recipe

# (setting, label_variant arguments) -> (record stem, train line name, table row, curve row, ablation row); the
# stems were computed from the hand-assembled schedules and presets before label_variant existed.
PINNED = [
    (("base2new", "none"), {}, "coop-onehot-base2new-16shot-seed1-d625a52e4ee8", "coop", "", "", ""),
    (("base2new", "ls"), {}, "coop-atlas2-ls-base2new-16shot-seed1-afd712d074f8", "coop+ATLaS (K=2)", "+ ATLaS",
     "+ ATLaS", "+ ATLaS"),
    (("base2new", "csl"), {}, "coop-atlas2-csl-base2new-16shot-seed1-c696cd85ab66", "coop+ATLaS-CSL (K=2)",
     "+ ATLaS-CSL", "+ ATLaS-CSL", "+ ATLaS-CSL"),
    (("base2new", "isl"), {}, "coop-atlas2-isl-base2new-16shot-seed1-9079f7dee2e8", "coop+ATLaS-ISL (K=2)",
     "+ ATLaS-ISL", "+ ATLaS-ISL", "+ ATLaS-ISL"),
    (("base2new", "mix"), {}, "coop-atlas2-mix-base2new-16shot-seed1-5e1cc3a4e2f3", "coop+ATLaS-mix (K=2)",
     "+ ATLaS-Mix", "+ ATLaS-Mix", "+ ATLaS-Mix"),
    (("few_shot", "isl"), {}, "coop-atlas3-isl-few_shot-16shot-seed1-2951f9a73e3e", "coop+ATLaS-ISL (K=3)",
     "+ ATLaS-ISL", "+ ATLaS-ISL", "+ ATLaS-ISL"),
    (("cross_dataset", "csl"), {}, "coop-atlas3-csl-cross_dataset-16shot-seed1-ae8dbed1486a",
     "coop+ATLaS-CSL (K=3)", "+ ATLaS-CSL", "+ ATLaS-CSL", "+ ATLaS-CSL"),
    (("base2new", "ls"), {"period": 1}, "coop-atlas1-ls-base2new-16shot-seed1-b2f35fb581bf", "coop+LS", "+ ATLaS",
     "+ LS", "+ vanilla LS"),
    (("base2new", "isl", "joint"), {}, "coop-joint-isl-base2new-16shot-seed1-7b38bfe248d8", "coop+ISL+y",
     "+ soft + y (ISL)", "+ soft + y (ISL)", "+ ISL + y"),
    (("base2new", "none", "ols"), {}, "coop-ols-base2new-16shot-seed1-4e4f885ec0b9", "coop+OLS", "+ OLS", "+ OLS",
     None),
    (("base2new", "none", "tfkd"), {}, "coop-tfkd-base2new-16shot-seed1-b6bb98d6e604", "coop+TFKD", "+ TF-KD",
     "+ TF-KD", None),
    (("base2new", "isl"), {"alpha": 0.3}, "coop-atlas2-isl-base2new-16shot-seed1-e8eb723fc4ea",
     "coop+ATLaS-ISL (K=2)", "+ ATLaS-ISL", "+ ATLaS-ISL", "+ ATLaS-ISL"),
]


def _stem(setting, variant):
    config = TrainConfig(dataset="OxfordPets", data_root="data", method="coop", setting=setting, shots=16, seed=1,
                         schedule=variant.schedule, soft_labels=variant.soft_labels)
    method_config, recipe = resolve_recipe(config, "OxfordPets")
    described = describe_run(config, "OxfordPets", method_config, recipe, torch.device("cpu"))
    return record_stem(config, config_key(described, "fixed-fingerprint"))


@pytest.mark.parametrize("args,kwargs,stem,line,row,curve,ablation", PINNED, ids=[str(p[0] + tuple(p[1])) for p in PINNED])
def test_a_variant_keeps_its_record_name_and_labels(args, kwargs, stem, line, row, curve, ablation):
    variant = label_variant(*args, **kwargs)
    assert _stem(args[0], variant) == stem
    described, kind = variant.schedule.describe(), variant.soft_labels.kind if variant.soft_labels else None
    assert run_variant_name("coop", described, kind) == line
    assert row_name(described, kind) == row and row_name(described, kind, every_epoch_names=True) == curve
    assert variant.name == (curve or "baseline")
    if ablation is not None:
        assert ablation_row_name(described, kind) == ablation


def test_a_method_name_ending_in_plus_is_set_apart_from_its_label_schedule():
    """MMRL++'s runs printed 'mmrl+++ATLaS-ISL (K=2)' (which plus is whose?); the others keep their names."""
    described = label_variant("base2new", "isl").schedule.describe()
    assert run_variant_name("mmrl++", described, "isl") == "mmrl++ + ATLaS-ISL (K=2)"
    assert run_variant_name("mmrl++", label_variant("base2new", "none", "ols").schedule.describe(), None) == "mmrl++ + OLS"
    assert run_variant_name("mmrl++", OneHot().describe(), None) == "mmrl++"
    assert run_variant_name("mmrl", described, "isl") == "mmrl+ATLaS-ISL (K=2)"


def test_presets_are_the_papers():
    assert [alternation_period(s) for s in ("base2new", "few_shot", "cross_dataset")] == [2, 3, 3]
    few_shot = label_variant("few_shot", "isl")
    assert few_shot.schedule == Alternating(3) and few_shot.soft_labels == soft_label_preset("few_shot", "isl")
    assert label_variant("base2new", "none").schedule == OneHot()
    assert label_variant("base2new", "csl", "joint").schedule == Joint()
    assert label_variant("base2new", "none", "ols", schedule_options={"alpha": 0.3}).schedule == \
        OnlineLabelSmoothing(0.3)
    assert label_variant("base2new", "none", "tfkd").schedule == TeacherFreeKD()
    assert label_variant("base2new", "mix", w=0.5).soft_labels.w == 0.5
    assert [v.name for v in paper_variants("base2new")] == ["baseline", "+ ATLaS", "+ ATLaS-CSL", "+ ATLaS-ISL"]


@pytest.mark.parametrize("args,kwargs,message", [
    (("base2new", "none", "atlas"), {}, "trains on soft labels"),
    (("base2new", "csl", "ols"), {}, "uses no offline soft labels"),
    (("base2new", "csl", "joint"), {"period": 3}, "period K applies to the 'atlas' schedule only"),
    (("base2new", "soft"), {}, "Unknown soft-label kind"),
    (("base2new", "csl", "mixup"), {}, "Unknown label schedule"),
    (("zero_shot", "csl"), {}, "No ATLaS preset for setting 'zero_shot'"),
])
def test_impossible_variants_are_refused(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        label_variant(*args, **kwargs)
