"""MMRL (Guo & Gu, CVPR 2025, "Multi-Modal Representation Learning"): a shared, learnable representation space
projected into tokens of the higher blocks of both towers of a frozen CLIP. Towers, features, loss, test-time
fusion and ATLaS: ``docs/method-zoo.md``, section MMRL (reference yunncheng/MMRL).

Learned tensors (R runs lead every one): ``rep_tokens`` (R, K, r), N(0, 0.02^2); ``text_map_weight`` (R, J, r, d_t),
``text_map_bias`` (R, J, d_t), ``vision_map_weight`` (R, J, r, d_v), ``vision_map_bias`` (R, J, d_v): one
Linear(r -> width) per prompted block and tower, the J maps of a tower copies of one Linear (the reference clones
one layer); ``rep_projection`` (R, d_v, D), N(0, 1 / d_v) (the reference's ``proj_rep``).

    L = alpha * CE(z, y) + (1 - alpha) * CE(z_r, y) + lambda * (1 - mean_b cos(v_b, v0_b))
        + lambda * (1 - mean_c cos(t_c, t0_c))                                  (alpha = 0.7)

z = 100 cos(v, t), z_r = 100 cos(v_r, t) (the reference's fixed scale). At test time the class set it trained on
gets alpha z + (1 - alpha) z_r, any other z alone. With ATLaS both CE terms take the schedule's targets.

MMRL++ (:class:`MMRLpp`, ``mmrl++``) changes three pieces through hooks of :class:`MMRL`: the maps
(:meth:`MMRLpp.mapped_tokens`), the later blocks' tokens (:meth:`MMRLpp.enter_block`) and the representation
projection (:meth:`MMRLpp.representation_projection`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import nn
import torch.nn.functional as F

from atlas_fast.atlas.criterion import Criterion
from atlas_fast.clip.backbones import Backbone, encode_class_prompts
from atlas_fast.data.datasets import find_dataset_spec, zeroshot_template
from atlas_fast.data.templates import check_template, fill_template
from atlas_fast.methods.config import MethodConfig, MissingRecipe, OptimRecipe, check_family, check_scale
from atlas_fast.methods.mmrl_towers import RepresentationTowers
from atlas_fast.methods.registry import register_method

#: The reference's logit scale (``100. * image_features @ text_features.t()``), fixed whatever the weights' own.
LOGIT_SCALE = 100.0

# The reference's per-dataset regulariser weight lambda (trainers/config.py, applied in every setting before the
# scripts' own overrides) and EuroSAT's wider representation space.
REG_WEIGHTS = {"StanfordCars": 7.0, "FGVCAircraft": 6.0, "SUN397": 6.0, "DescribableTextures": 6.0, "Food101": 5.0,
               "OxfordFlowers": 4.0, "UCF101": 3.0, "ImageNet": 0.5, "Caltech101": 0.5, "OxfordPets": 0.2,
               "EuroSAT": 0.01}
REP_DIMS = {"EuroSAT": 2048}


@dataclass(frozen=True)
class MMRLConfig(MethodConfig):
    """MMRL's representation learner (base-to-new defaults of ``configs/trainers/MMRL/vit_b16.yaml``).

    ``n_rep_tokens`` K, ``rep_dim`` r, ``depth`` J: the top J blocks of each tower get the tokens (the reference's
    REP_LAYERS 6..12 of 12); ``alpha`` weighs the class-token branch in the loss and at test time; ``reg_weight``
    lambda; ``template`` the class prompt (CoOp's hand-crafted prompt of the dataset)."""

    n_rep_tokens: int = 5
    rep_dim: int = 512
    depth: int = 7
    alpha: float = 0.7
    reg_weight: float = 1.0
    template: str = "a photo of a {}."

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = type(self).__name__
        for name in ("n_rep_tokens", "rep_dim", "depth"):
            if getattr(self, name) < 1:
                raise ValueError(f"{owner}.{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"{owner}.alpha must be in [0, 1], got {self.alpha}")
        check_scale(self, "reg_weight")
        check_template(self.template, owner)


def registry_name(dataset: str) -> str:
    spec = find_dataset_spec(dataset)
    return spec.name if spec is not None else dataset


def mmrl_recipe(family: str, setting: str, shots: int, dataset: str) -> tuple[MMRLConfig, OptimRecipe]:
    """MMRL's recipe (its ``configs/trainers/MMRL/*.yaml``, ``trainers/config.py`` and ``scripts/mmrl``); both
    families are the same (MMRL learns no text context). Dassl's AdamW (weight decay 5e-4), lr 0.001, one constant
    warmup epoch at 1e-5 and a per-epoch cosine; K = 5, J = 7 (layers 6..12), alpha = 0.7; lambda per dataset
    (:data:`REG_WEIGHTS`, 1.0 elsewhere), r = 512 (EuroSAT 2048); the dataset's CoOp template.

    * base-to-new: 10 epochs, batch 4; ImageNet: 5 epochs, batch 32.
    * few-shot: 50 epochs, batch 32 (lambda 0.5 outside the table); ImageNet: 5 epochs, batch 32.
    * cross-dataset (and domain generalisation; trained on ImageNet): 1 epoch without warmup, batch 32, lambda 0.2.
    """
    check_family("MMRL", family)
    name = registry_name(dataset)
    template = zeroshot_template(dataset)
    rep_dim = REP_DIMS.get(name, 512)
    if setting == "cross_dataset":
        return (MMRLConfig(rep_dim=rep_dim, reg_weight=0.2, template=template),
                OptimRecipe(epochs=1, batch_size=32, lr=0.001, optimizer="adamw", warmup_epochs=0))
    if setting not in ("base2new", "few_shot"):
        raise MissingRecipe("MMRL", setting, MMRLConfig(template=template))
    default = 1.0 if setting == "base2new" else 0.5
    config = MMRLConfig(rep_dim=rep_dim, reg_weight=REG_WEIGHTS.get(name, default), template=template)
    if name == "ImageNet":
        return config, OptimRecipe(epochs=5, batch_size=32, lr=0.001, optimizer="adamw")
    if setting == "base2new":
        return config, OptimRecipe(epochs=10, batch_size=4, lr=0.001, optimizer="adamw")
    return config, OptimRecipe(epochs=50, batch_size=32, lr=0.001, optimizer="adamw")


def cloned_linear_maps(runs: int, layers: int, rep_dim: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(R, J, r, width) weights (transposed) and (R, J, width) biases: per run, J copies of one fresh Linear."""
    weights, biases = [], []
    for _ in range(runs):
        layer = nn.Linear(rep_dim, width)
        maps = [copy.deepcopy(layer) for _ in range(layers)]
        weights.append(torch.stack([m.weight.detach().t() for m in maps]))
        biases.append(torch.stack([m.bias.detach() for m in maps]))
    return torch.stack(weights), torch.stack(biases)


class MMRL(RepresentationTowers):
    """Multi-modal representation learning; reads pixels and the frozen CLIP's cached features of the same views."""

    name = "mmrl"
    printed_name = "MMRL"
    recipe_function = staticmethod(mmrl_recipe)
    config_class = MMRLConfig
    reads_frozen_features = True
    # every learned tensor leads with R; the loss takes one batch per run and returns each run's loss
    supports_batched_runs = True
    depth_options = ("depth",)

    def __init__(self, backbone: Backbone, classnames: Sequence[str], config: MethodConfig, runs: int = 1) -> None:
        super().__init__(backbone, classnames, config, runs)
        self.create_tensors()
        self.fixed_classnames = tuple(classnames)  # the classes it trains on (its frozen text targets, its fusion)
        self._fixed_text: torch.Tensor | None = None
        self.set_classnames(classnames)

    # --- the learned tensors -----------------------------------------------------------------------------------
    def create_tensors(self) -> None:
        """The learned tensors (module docstring), in the reference's order of drawing."""
        config, device = self.config, self.backbone.device
        runs, k, r, depth = self.num_runs, config.n_rep_tokens, config.rep_dim, config.depth
        text_width, vision_width = self.text_encoder.width, self.image_encoder.width
        self.rep_projection = nn.Parameter(
            (vision_width ** -0.5 * torch.randn(runs, vision_width, self.backbone.embed_dim)).to(device))
        self.rep_tokens = nn.Parameter(nn.init.normal_(torch.empty(runs, k, r), std=0.02).to(device))
        weight, bias = cloned_linear_maps(runs, depth, r, vision_width)
        self.vision_map_weight, self.vision_map_bias = nn.Parameter(weight.to(device)), nn.Parameter(bias.to(device))
        weight, bias = cloned_linear_maps(runs, depth, r, text_width)
        self.text_map_weight, self.text_map_bias = nn.Parameter(weight.to(device)), nn.Parameter(bias.to(device))

    def representation_projection(self) -> torch.Tensor:
        """(R, d_v, D): the projection of the representation tokens' pooled output."""
        return self.rep_projection

    def mapped_tokens(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(text (R, J, K, d_t), vision (R, J, K, d_v)): the shared tokens through each block's two maps."""
        rep = self.rep_tokens.unsqueeze(1)
        text = torch.matmul(rep, self.text_map_weight) + self.text_map_bias.unsqueeze(2)
        vision = torch.matmul(rep, self.vision_map_weight) + self.vision_map_bias.unsqueeze(2)
        return text, vision

    # --- logits ------------------------------------------------------------------------------------------------
    @staticmethod
    def scaled_cosine(image: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        """s cos(image, text): image (R, B, D) and text (R, C, D), normalised here, -> (R, B, C)."""
        text = F.normalize(text, dim=-1)
        return LOGIT_SCALE * torch.einsum("rbd,rcd->rbc", F.normalize(image.to(text.dtype), dim=-1), text)

    def fuses(self) -> bool:
        """Whether the current class set is the one it trained on (then the test logits are the fusion)."""
        return self.classnames == self.fixed_classnames

    def classify(self, image: torch.Tensor, rep: torch.Tensor, text: torch.Tensor, fuse: bool) -> torch.Tensor:
        logits = self.scaled_cosine(image, text)
        if not fuse:
            return logits
        alpha = self.config.alpha
        return alpha * logits + (1.0 - alpha) * self.scaled_cosine(rep, text)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Test-time logits (R, B, C) of preprocessed pixels (see the module docstring)."""
        text_tokens, vision_tokens = self.mapped_tokens()
        image, rep = self.image_pair(images, vision_tokens)
        return self.classify(image, rep, self.raw_text_features(text_tokens), self.fuses())

    def eval_pixel_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """(R, B, 2D): the class-token and representation features side by side."""
        return torch.cat(self.image_pair(pixels), dim=-1)

    def pixel_classifier(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """The current class set's test logits: the fusion on the training classes, z alone on any other."""
        text, fuse = self.text_features(), self.fuses()
        return lambda features: self.classify(*features.chunk(2, dim=-1), text, fuse)

    # --- training ----------------------------------------------------------------------------------------------
    def frozen_text_features(self) -> torch.Tensor:
        """(C, D) normalised: the frozen CLIP's features of the template for the training classes (fp32)."""
        if self._fixed_text is None or self._fixed_text.device != self.rep_tokens.device:
            with torch.no_grad(), torch.autocast(self.backbone.device.type, enabled=False):
                features = encode_class_prompts(self.backbone, fill_template(self.config.template,
                                                                             self.fixed_classnames))
            self._fixed_text = F.normalize(features.float(), dim=-1).to(self.rep_tokens.device)
        return self._fixed_text

    @torch.no_grad()
    def frozen_image_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """The unprompted CLIP's image features (B, D) or (R, B, D): what the cache holds for these views."""
        if pixels.dim() == 5:
            return self.backbone.encode_image(pixels.flatten(0, 1)).view(*pixels.shape[:2], -1)
        return self.backbone.encode_image(pixels)

    def loss_terms(self, pixels: torch.Tensor, frozen: torch.Tensor | None = None
                   ) -> dict[str, torch.Tensor]:
        """The pieces of the loss: ``logits`` z and ``rep_logits`` z_r (R, B, C), ``image_cos`` (R, B) cos(v, v0)
        and ``text_cos`` (R, C) cos(t, t0)."""
        if tuple(self.classnames) != self.fixed_classnames:
            raise RuntimeError("MMRL trains on the class set it was built for (its frozen text targets)")
        if frozen is None:
            frozen = self.frozen_image_features(pixels)
        text_tokens, vision_tokens = self.mapped_tokens()
        image, rep = self.image_pair(pixels, vision_tokens)
        text = F.normalize(self.raw_text_features(text_tokens), dim=-1)
        image_n = F.normalize(image, dim=-1)
        fixed_image = F.normalize(frozen.float().to(image.device), dim=-1)
        if fixed_image.dim() == 2:
            fixed_image = fixed_image.unsqueeze(0)
        fixed_text = self.frozen_text_features()
        return {"logits": self.scaled_cosine(image, text), "rep_logits": self.scaled_cosine(rep, text),
                "image_cos": F.cosine_similarity(image_n.float(), fixed_image.expand_as(image_n), dim=-1),
                "text_cos": F.cosine_similarity(text.float(), fixed_text.expand_as(text), dim=-1)}

    def training_loss(self, inputs, labels: torch.Tensor, criterion: Criterion) -> torch.Tensor:
        """alpha criterion(z) + (1 - alpha) criterion(z_r) + lambda (1 - mean cos(v, v0)) + lambda (1 - mean
        cos(t, t0)), each run's (R,) when R runs train together. ``inputs``: pixels, or (pixels, cached frozen
        features) (an :class:`atlas_fast.engine.feed.PixelBatch`)."""
        pixels, frozen = inputs if isinstance(inputs, tuple) else (inputs, None)
        terms = self.loss_terms(pixels, frozen)
        alpha, weight = self.config.alpha, self.config.reg_weight
        text_reg = 1.0 - terms["text_cos"].mean(dim=1)
        per_run = labels.dim() == 2
        image_cos = terms["image_cos"]
        mask = criterion.padding_mask(image_cos.shape[1]) if per_run else None
        if mask is None:
            image_reg = 1.0 - image_cos.mean(dim=1)
        else:  # only the first sizes[r] rows of run r are its own (a run that sits out the step gets 0)
            rows = criterion.rows  # the sizes on the device: no upload
            image_reg = torch.where(rows > 0, 1.0 - (image_cos * mask).sum(dim=1) / rows.clamp(min=1), 0.0)
            text_reg = torch.where(rows > 0, text_reg, 0.0)
        regular = weight * image_reg + weight * text_reg
        loss_of = criterion.per_run if per_run else criterion
        # only z is the method's class prediction (what a schedule such as OLS learns from)
        ce = alpha * loss_of(terms["logits"]) + (1.0 - alpha) * loss_of(terms["rep_logits"], observe=False)
        return ce + (regular if per_run else regular.sum())


register_method(MMRL)


# MMRL++'s per-dataset (beta, lambda) (trainers/config.py): base-to-new and few-shot, and cross-dataset training
# (ImageNet; its other entries are the target datasets' beta at test time, see docs/deviations.md#mmrl).
PP_TABLE = {"ImageNet": (0.9, 0.2), "FGVCAircraft": (0.9, 2.0), "UCF101": (0.9, 3.0),
            "DescribableTextures": (0.9, 7.0), "OxfordPets": (0.7, 0.01), "StanfordCars": (0.7, 6.0),
            "Caltech101": (0.6, 3.0), "SUN397": (0.5, 3.0), "OxfordFlowers": (0.4, 7.0), "EuroSAT": (0.2, 0.01),
            "Food101": (0.1, 1.0)}
PP_CROSS_DATASET = {"ImageNet": (0.9, 0.1)}


@dataclass(frozen=True)
class MMRLppConfig(MMRLConfig):
    """MMRL++: MMRL's fields plus ``beta`` (the weight of a block's new tokens against the tokens the previous block
    output), ``res_lora_dim`` (rank of each block's residual on the shared map) and ``proj_lora_dim`` (rank of the
    update of CLIP's ``proj`` that projects the representation tokens)."""

    beta: float = 0.9
    res_lora_dim: int = 4
    proj_lora_dim: int = 64

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = type(self).__name__
        if not 0.0 <= self.beta <= 1.0:
            raise ValueError(f"{owner}.beta must be in [0, 1], got {self.beta}")
        for name in ("res_lora_dim", "proj_lora_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{owner}.{name} must be >= 1, got {getattr(self, name)}")


def mmrlpp_recipe(family: str, setting: str, shots: int, dataset: str) -> tuple[MMRLppConfig, OptimRecipe]:
    """MMRL++'s recipe (``configs/trainers/MMRLpp/*.yaml``, ``trainers/config.py``, ``scripts/mmrlpp``); both
    families the same. Dassl's AdamW, one constant warmup epoch at 1e-5, per-epoch cosine; K = 5, r = 512, J = 7,
    alpha = 0.7, residual rank 4, projection rank 64; (beta, lambda) per dataset (:data:`PP_TABLE`; 0.9, 1.0
    elsewhere); the dataset's CoOp template.

    * base-to-new: 10 epochs, batch 4, lr 0.001; ImageNet: 5 epochs, batch 32.
    * few-shot: 100 epochs, batch 32, lr 0.002; ImageNet: 5 epochs, batch 32, lr 0.001.
    * cross-dataset (trained on ImageNet): 1 epoch without warmup, batch 32, lr 0.001, beta 0.9, lambda 0.1.
    """
    check_family("MMRL++", family)
    name = registry_name(dataset)
    template = zeroshot_template(dataset)
    if setting == "cross_dataset":
        beta, weight = PP_CROSS_DATASET.get(name, (0.9, 0.2))
        return (MMRLppConfig(beta=beta, reg_weight=weight, template=template),
                OptimRecipe(epochs=1, batch_size=32, lr=0.001, optimizer="adamw", warmup_epochs=0))
    if setting not in ("base2new", "few_shot"):
        raise MissingRecipe("MMRL++", setting, MMRLppConfig(template=template))
    beta, weight = PP_TABLE.get(name, (0.9, 1.0))
    config = MMRLppConfig(beta=beta, reg_weight=weight, template=template)
    if name == "ImageNet":
        return config, OptimRecipe(epochs=5, batch_size=32, lr=0.001, optimizer="adamw")
    if setting == "base2new":
        return config, OptimRecipe(epochs=10, batch_size=4, lr=0.001, optimizer="adamw")
    return config, OptimRecipe(epochs=100, batch_size=32, lr=0.002, optimizer="adamw")


def kaiming_uniform(shape: tuple[int, ...]) -> torch.Tensor:
    """``nn.init.kaiming_uniform_(a=sqrt(5))`` of each trailing (out, rank) matrix: U(-1/sqrt(rank), 1/sqrt(rank))."""
    bound = shape[-1] ** -0.5
    return torch.empty(shape).uniform_(-bound, bound)


class MMRLpp(MMRL):
    """MMRL++: one shared map per tower with a low-rank residual per block, the tokens of each later block blended
    with the previous block's (beta), and the representation tokens projected by CLIP's ``proj`` plus a low-rank
    update (``docs/method-zoo.md``, section MMRL++)."""

    name = "mmrl++"
    printed_name = "MMRL++"
    recipe_function = staticmethod(mmrlpp_recipe)
    config_class = MMRLppConfig

    def create_tensors(self) -> None:
        """Per tower: the shared map ``*_map_weight`` (R, r, width) (transposed, from one fresh Linear), the biases
        ``*_map_bias`` (R, J, width) (that Linear's bias, per block), the residual factors ``*_residual_a``
        (R, J, width, rank) (kaiming-uniform) and ``*_residual_b`` (R, J, rank, r) (zeros); the projection's
        ``proj_lora_a`` (R, d_v, rank) (kaiming-uniform) and ``proj_lora_b`` (R, rank, D) (zeros)."""
        config, device = self.config, self.backbone.device
        runs, k, r, depth = self.num_runs, config.n_rep_tokens, config.rep_dim, config.depth
        text_width, vision_width = self.text_encoder.width, self.image_encoder.width
        embed_dim, rank = self.backbone.embed_dim, config.res_lora_dim
        self.proj_lora_a = nn.Parameter(kaiming_uniform((runs, vision_width, config.proj_lora_dim)).to(device))
        self.proj_lora_b = nn.Parameter(torch.zeros(runs, config.proj_lora_dim, embed_dim, device=device))
        self.rep_tokens = nn.Parameter(nn.init.normal_(torch.empty(runs, k, r), std=0.02).to(device))
        for tower, width in (("vision", vision_width), ("text", text_width)):
            layers = [nn.Linear(r, width) for _ in range(runs)]
            weight = torch.stack([layer.weight.detach().t() for layer in layers])
            bias = torch.stack([layer.bias.detach() for layer in layers]).unsqueeze(1).repeat(1, depth, 1)
            setattr(self, f"{tower}_map_weight", nn.Parameter(weight.to(device)))
            setattr(self, f"{tower}_map_bias", nn.Parameter(bias.to(device)))
            setattr(self, f"{tower}_residual_a", nn.Parameter(kaiming_uniform((runs, depth, width, rank)).to(device)))
            setattr(self, f"{tower}_residual_b", nn.Parameter(torch.zeros(runs, depth, rank, r, device=device)))

    def mapped_tokens(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Block j's tokens: rep (W + A_j B_j)^T + b_j, per tower."""
        rep = self.rep_tokens.unsqueeze(1)  # (R, 1, K, r)
        mapped = []
        for tower in ("text", "vision"):
            weight = getattr(self, f"{tower}_map_weight").unsqueeze(1)  # (R, 1, r, w)
            residual = torch.matmul(getattr(self, f"{tower}_residual_a"),
                                    getattr(self, f"{tower}_residual_b")).transpose(-1, -2)  # (R, J, r, w)
            mapped.append(torch.matmul(rep, weight + residual) + getattr(self, f"{tower}_map_bias").unsqueeze(2))
        return mapped[0], mapped[1]

    def representation_projection(self) -> torch.Tensor:
        """CLIP's frozen ``proj`` + A B."""
        proj = self.image_encoder.visual.proj.detach()
        return proj.to(self.proj_lora_a.dtype) + torch.matmul(self.proj_lora_a, self.proj_lora_b)

    def enter_block(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Positions 1..K become beta * the block's tokens + (1 - beta) * the previous block's output there."""
        k, beta = tokens.shape[1], self.config.beta
        blended = beta * tokens.to(x.dtype) + (1.0 - beta) * x[:, 1:1 + k]
        return torch.cat([x[:, :1], blended, x[:, 1 + k:]], dim=1)


register_method(MMRLpp)
