"""The words a run is described with, each spelled once: settings, recipe families, class sets, metrics, precisions,
soft-label kinds, label schedules, executors and the search's choices.

Everything that checks or offers one of these values imports it from here. The module imports nothing (no torch),
so the command line can use it while it parses. A tuple is derived from its ``Literal`` type, so adding a value is
one line in the ``Literal`` (plus the code that acts on it); everything that only lists, checks or offers it follows.
"""

from __future__ import annotations

from typing import Literal, get_args

# The protocols of the paper (docs/protocol.md): which classes a run trains and is tested on, and which presets apply.
Setting = Literal["base2new", "few_shot", "cross_dataset"]
SETTINGS: tuple[Setting, ...] = get_args(Setting)

# A family of training recipes: the ATLaS paper's, or each method repository's own (TrainConfig.recipe_family,
# ``--recipe``). The optimisation recipe a family gives a run is an OptimRecipe (atlas_fast.methods.config).
RecipeFamily = Literal["paper", "original"]
RECIPE_FAMILIES: tuple[RecipeFamily, ...] = get_args(RecipeFamily)

# The order in which a K-shot subset is drawn from one seed: CoOp's and Dassl's (the training subset, then the
# validation subset; the default) or CLIP-LoRA's dataset readers' (validation first, classes short of K repeated).
FewShotOrder = Literal["coop", "clip-lora"]
FEWSHOT_ORDERS: tuple[FewShotOrder, ...] = get_args(FewShotOrder)

# The class sets a run trains on (``subsample``) and is evaluated on, in the order a record lists them.
ClassSet = Literal["base", "new", "all"]
CLASS_SETS: tuple[ClassSet, ...] = get_args(ClassSet)
# The numbers a record holds: the accuracy on each class set, and H (the harmonic mean of base and new) beside the
# two it is the mean of, as tables order them.
HARMONIC_MEAN = "H"
METRICS: tuple[str, ...] = CLASS_SETS[:2] + (HARMONIC_MEAN,) + CLASS_SETS[2:]

# How a run computes: auto = fp16 autocast (amp) on a GPU, fp32 on the CPU.
Precision = Literal["auto", "fp32", "amp"]
PRECISIONS: tuple[Precision, ...] = get_args(Precision)
# How the feature cache encodes images (auto = fp16 on a GPU, fp32 on the CPU) and stores features.
CachePrecision = Literal["auto", "fp32", "fp16", "bf16"]
CACHE_PRECISIONS: tuple[CachePrecision, ...] = get_args(CachePrecision)
StorageDtype = Literal["float16", "float32"]
STORAGE_DTYPES: tuple[StorageDtype, ...] = get_args(StorageDtype)

# ATLaS's soft labels (atlas_fast.atlas.softlabels): LS, CSL, ISL and their mix; the paper's tables compare the
# first three. ``none`` is the plain method (``--atlas none``). When ISL rectifies towards the label.
SoftLabelKind = Literal["ls", "csl", "isl", "mix"]
SOFT_LABEL_KINDS: tuple[SoftLabelKind, ...] = get_args(SoftLabelKind)
PAPER_SOFT_LABEL_KINDS: tuple[SoftLabelKind, ...] = ("ls", "csl", "isl")
NO_SOFT_LABELS = "none"
SOFT_LABEL_CHOICES = (NO_SOFT_LABELS,) + SOFT_LABEL_KINDS
Delta = Literal["wrong_only", "always"]
DELTAS: tuple[Delta, ...] = get_args(Delta)

# Label schedules (atlas_fast.atlas.schedules), in the order tables list their rows; ``auto`` (a choice, not a
# schedule) is ATLaS with soft labels and one-hot without.
ScheduleName = Literal["onehot", "atlas", "joint", "ols", "tfkd"]
SCHEDULES: tuple[ScheduleName, ...] = get_args(ScheduleName)
SCHEDULE_CHOICES = ("auto",) + tuple(name for name in SCHEDULES if name != "onehot")

# The optimisers a method's recipe may name (OptimRecipe.optimizer): Dassl's SGD, Dassl's Adam (TCP), AdamW
# (CLIP-LoRA).
Optimizer = Literal["sgd", "adam", "adamw"]
OPTIMIZERS: tuple[Optimizer, ...] = get_args(Optimizer)

# CUDA-graph replay of training steps (``--graph-steps`` of every command that trains, or for scripts the environment
# variable GRAPH_STEPS_VARIABLE, which the flag overrides) -> TrainConfig.graph_steps: auto = wherever a CUDA device
# can replay a method's step (every method), on = refuse runs where none can, off = eager steps.
GRAPH_STEPS = {"auto": None, "on": True, "off": False}
GRAPH_STEPS_VARIABLE = "ATLAS_FAST_GRAPH_STEPS"


def environment_graph_steps(environ: "dict[str, str] | None" = None) -> bool | None:
    """The ``TrainConfig.graph_steps`` that :data:`GRAPH_STEPS_VARIABLE` asks for (unset or empty: auto, None); a
    value other than auto/on/off is refused naming the variable (a ValueError, which commands report as a user
    error)."""
    import os

    given = (os.environ if environ is None else environ).get(GRAPH_STEPS_VARIABLE, "")
    value = given.strip().lower()
    if not value:
        return None
    if value not in GRAPH_STEPS:
        raise ValueError(f"environment variable {GRAPH_STEPS_VARIABLE}={given!r} is not a --graph-steps choice; "
                         f"valid: {', '.join(GRAPH_STEPS)} (or unset, which is auto).")
    return GRAPH_STEPS[value]

# Where a sweep's groups run (atlas_fast.sweep.executors).
Executor = Literal["local", "ray", "slurm"]
EXECUTORS: tuple[Executor, ...] = get_args(Executor)

# The hyper-parameter search (atlas_fast.search): the validation metric it maximises (accuracy = the class set the
# run trains on), its samplers and pruners.
OBJECTIVES: tuple[str, ...] = ("accuracy",) + METRICS
Sampler = Literal["tpe", "random", "grid"]
SAMPLERS: tuple[Sampler, ...] = get_args(Sampler)
Pruner = Literal["hyperband", "halving", "median", "none"]
PRUNERS: tuple[Pruner, ...] = get_args(Pruner)

