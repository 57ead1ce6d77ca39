"""Training configs: loading (``get_config()`` of a Python file plus ``key=value`` overrides) into a
typed, frozen ``TrainConfig``, the ``DrafterConfig`` a config asks for, and a run's identity (what a
resumed run must share with the checkpoint it resumes).

Config files are Python files returning an ``ml_collections.ConfigDict`` (``configs/``), as in
big_vision; ``configs/smollm2_135m.py`` sets and documents every field. ``load_config`` turns one
into a ``TrainConfig`` once: its sections are frozen dataclasses (``DrafterSpec``, ``TrainSettings``,
``EvalSettings``, ``CkptSettings``) whose fields are typed and defaulted here and nowhere else, and
whose ``__post_init__`` checks every value (one ``ConfigError`` line naming the field and the fix).
Everything downstream reads attributes and trusts them.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ml_collections import ConfigDict

from dflash_jax import dflash_format
from dflash_jax.drafter import BLOCK_INPUTS, DrafterConfig, check_fits
from dflash_jax.errors import ConfigError
from dflash_jax.loss import OBJECTIVES, POSITION_WEIGHTS, SELECTOR_OBJECTIVES
from dflash_jax.target import TargetConfig
from dflash_jax.tokens import mask_token_id
from dflash_jax.utils import json_sha256

# eval.best_by: what makes a run's best/: the objective trained ("loss", lowest), or a validation tau (highest)
BEST_BY = {"loss": None, "tau_blocks": "val_tau_blocks", "decode_tau": "val_decode_tau"}
COMPUTE_DTYPES = ("float32", "bfloat16")


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise ConfigError(f"config: {what}")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _as_tuple(obj, name: str) -> None:
    """A list where a tuple field belongs (a config written as JSON, or by hand) becomes the tuple."""
    value = getattr(obj, name)
    if isinstance(value, list):
        object.__setattr__(obj, name, tuple(value))


_DRAFTER = {f.name: f.default for f in dataclasses.fields(DrafterConfig)}  # the drafter's own defaults


@dataclass(frozen=True, kw_only=True)
class DrafterSpec:
    """Section ``drafter``: the drafter a run trains (``drafter_config`` makes its ``DrafterConfig``
    for the target).

    Fields:
      num_layers: drafter decoder layers (>= 1).
      block_size: tokens per block, the anchor included (>= 2).
      mask_token_id: the mask token; None: an unused special token of the target's tokenizer.
      target_layer_ids: the target layers whose hidden states feed the drafter; (): SPEC's default
        for ``num_layers``.
      layer_types: each drafter layer's attention (``full_attention`` / ``sliding_attention``);
        (): all full attention.
      sliding_window: the sliding layers' window in tokens (None without sliding layers).
      block_input: what fills a block after its anchor: ``mask`` (DFlash) or ``ngram`` (the
        prompt-lookup continuation of the committed tokens, mask tokens where it ends).
      ngram_max, ngram_min: with ``ngram``: the n-gram lengths matched, longest first.
      ngram_periodic: with ``ngram``: a continuation that reaches the anchor goes on with the
        match's period (a loop continued) instead of mask tokens.
      copy_bias: with ``ngram``: the starting value of a learned logit bonus for the proposed
        token per matched length and offset (logit units); None: no bonus.
      conv_kernel_size: DFlash 2's grouped dynamic causal convolutions (0: DFlash, none).
      conv_group_size: DFlash 2's channels per convolution group.
      selector_rank: DFlash 2's candidate selector rank (>= 1 with DFlash 2, else 0).
      selector_top_k: DFlash 2's candidates per offset (the head's top k).

    Raises (on construction):
      ConfigError: a field out of range, or a DFlash 2 field without the others.
    """

    num_layers: int
    block_size: int
    mask_token_id: int | None = None
    target_layer_ids: tuple[int, ...] = ()
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    block_input: str = _DRAFTER["block_input"]
    ngram_max: int = _DRAFTER["ngram_max"]
    ngram_min: int = _DRAFTER["ngram_min"]
    ngram_periodic: bool = _DRAFTER["ngram_periodic"]
    copy_bias: float | None = _DRAFTER["copy_bias"]
    conv_kernel_size: int = _DRAFTER["conv_kernel_size"]
    conv_group_size: int = _DRAFTER["conv_group_size"]
    selector_rank: int = _DRAFTER["selector_rank"]
    selector_top_k: int = _DRAFTER["selector_top_k"]

    def __post_init__(self) -> None:
        _as_tuple(self, "target_layer_ids")
        _as_tuple(self, "layer_types")
        _need(_is_int(self.num_layers) and self.num_layers >= 1, "drafter.num_layers must be an integer >= 1")
        _need(_is_int(self.block_size) and self.block_size >= 2, "drafter.block_size must be an integer >= 2")
        _need(
            self.mask_token_id is None or _is_int(self.mask_token_id),
            "drafter.mask_token_id must be an integer or None",
        )
        _need(
            isinstance(self.target_layer_ids, tuple) and all(_is_int(x) for x in self.target_layer_ids),
            "drafter.target_layer_ids must be a tuple of integers (() = the SPEC default for num_layers)",
        )
        _need(
            isinstance(self.layer_types, tuple) and all(isinstance(x, str) for x in self.layer_types),
            "drafter.layer_types must be a tuple of attention kinds (() = all full_attention)",
        )
        _need(
            self.sliding_window is None or (_is_int(self.sliding_window) and self.sliding_window >= 1),
            "drafter.sliding_window must be a positive integer or None",
        )
        _need(self.block_input in BLOCK_INPUTS, f"drafter.block_input must be one of {', '.join(BLOCK_INPUTS)}")
        _need(
            _is_int(self.ngram_max) and _is_int(self.ngram_min) and 1 <= self.ngram_min <= self.ngram_max,
            "drafter.ngram_min/ngram_max need 1 <= min <= max",
        )
        _need(
            isinstance(self.ngram_periodic, bool) and (not self.ngram_periodic or self.block_input == "ngram"),
            'drafter.ngram_periodic must be True or False, True only with drafter.block_input="ngram"',
        )
        _need(
            self.copy_bias is None or (_is_number(self.copy_bias) and self.block_input == "ngram"),
            'drafter.copy_bias must be None or a number, with drafter.block_input="ngram"',
        )
        conv, rank = self.conv_kernel_size, self.selector_rank
        _need(_is_int(conv) and conv >= 0, "drafter.conv_kernel_size must be an integer >= 0 (0: DFlash, no DFlash 2)")
        if conv:
            _need(
                _is_int(rank) and rank >= 1 and _is_int(self.selector_top_k) and self.selector_top_k >= 1,
                "a DFlash 2 drafter (drafter.conv_kernel_size > 0) needs drafter.selector_rank >= 1 and "
                "drafter.selector_top_k >= 1",
            )
            _need(_is_int(self.conv_group_size) and self.conv_group_size >= 1, "drafter.conv_group_size must be >= 1")
        else:
            _need(
                not rank,
                "drafter.selector_rank is DFlash 2's: set drafter.conv_kernel_size (2) too, or selector_rank 0",
            )

    @property
    def dflash2(self) -> bool:
        """A DFlash 2 drafter (convolutions and a candidate selector)."""
        return bool(self.conv_kernel_size)


@dataclass(frozen=True, kw_only=True)
class TrainSettings:
    """Section ``train``: the optimisation (``train_step.make_optimizer`` / ``make_schedule`` read it).

    Fields:
      steps: optimiser steps (the schedule's length).
      batch_size: sequences per optimiser step, all ``grad_accum`` micro-batches together.
      grad_accum: micro-batches per step.
      max_len: tokens per sequence (longer ones are cut; >= 2).
      num_anchors: blocks per sequence; anchor_chunk: blocks processed together (activation memory).
      remat: recompute each chunk in the backward pass (less memory, slower).
      stored_features: read the target's features stored by ``dflash-jax prepare-features``.
      gamma: the loss decay ``w_k = exp(-(k-1)/gamma)`` over block offsets (> 0).
      loss_offsets: supervise block offsets ``1..N`` only (0: all ``block_size - 1``).
      length_buckets: increasing padded lengths, each batch padded to the smallest that holds it
        (``max_len`` is always the last); (): every batch at ``max_len``.
      lr: the peak learning rate (> 0); copy_bias_lr: the copy-bias table's (0: ``lr``).
      objective: what each supervised block offset is trained toward (``loss.OBJECTIVES``):
        ``ce`` the answer's token (hard labels, the paper's); ``kl`` the target's next-token
        distribution there (forward KL); ``kl_tv`` that KL mixed with the total variation distance,
        ``(1 - tv_weight) KL + tv_weight TV`` (1 - TV is a sampled draft token's acceptance rate).
        ``kl`` and ``kl_tv`` run the target's LM head on the blocks' positions (not with
        ``stored_features``).
      tv_weight: ``kl_tv``'s share of TV, in [0, 1].
      position_weights: ``decay`` (the fixed ``gamma`` decay) or ``reach`` (the decay times each
        block's chance of reaching the offset under the drafter as it is: ``loss.block_loss``).
      selector_alpha: DFlash 2: the selector loss's weight beside the block loss (>= 0).
      selector_stop_grad: DFlash 2: the selector loss trains the selector only.
      selector_objective: DFlash 2: ``ce`` the selector picks the answer's token among its
        candidates (the paper's); ``kl`` its softmax learns the target's distribution over them,
        renormalised (what a sampled draft's acceptance rewards, ``loss.selector_loss``; runs the
        target's LM head, not with ``stored_features``).
      warmup_frac: the linear warmup's share of ``steps``; then cosine decay to 0.
      weight_decay, b1, b2: AdamW's (each in [0, 1]); grad_clip: the global-norm clip (> 0).
      compute_dtype: ``float32`` (faster on CPU) or ``bfloat16`` (GPU/TPU); master weights stay float32.

    Raises (on construction):
      ConfigError: a field of the wrong type or out of range.
    """

    steps: int
    batch_size: int
    grad_accum: int
    max_len: int
    num_anchors: int
    anchor_chunk: int
    remat: bool = True
    stored_features: bool = False
    gamma: float
    loss_offsets: int = 0
    length_buckets: tuple[int, ...] = ()
    lr: float
    copy_bias_lr: float = 0.0
    objective: str = "ce"
    tv_weight: float = 0.5
    position_weights: str = "decay"
    selector_alpha: float = 1.0
    selector_stop_grad: bool = False
    selector_objective: str = "ce"
    warmup_frac: float
    weight_decay: float
    b1: float
    b2: float
    grad_clip: float
    compute_dtype: str

    def __post_init__(self) -> None:
        _as_tuple(self, "length_buckets")
        for key in ("steps", "batch_size", "grad_accum", "max_len", "num_anchors", "anchor_chunk"):
            value = getattr(self, key)
            _need(_is_int(value) and value >= 1, f"train.{key} must be an integer >= 1")
        _need(self.max_len >= 2, "train.max_len must be >= 2")
        _need(isinstance(self.remat, bool), "train.remat must be True or False")
        _need(isinstance(self.stored_features, bool), "train.stored_features must be True or False")
        _need(_is_int(self.loss_offsets) and self.loss_offsets >= 0, "train.loss_offsets must be an integer >= 0")
        lb = self.length_buckets
        _need(
            isinstance(lb, tuple)
            and all(_is_int(x) and 1 <= x <= self.max_len for x in lb)
            and list(lb) == sorted(set(lb)),
            f"train.length_buckets must be increasing integers in [1, train.max_len = {self.max_len}] "
            "(() = no bucketing)",
        )
        for key in ("gamma", "lr"):
            value = getattr(self, key)
            _need(_is_number(value) and value > 0, f"train.{key} must be a positive number")
        _need(
            _is_number(self.copy_bias_lr) and self.copy_bias_lr >= 0,
            "train.copy_bias_lr must be a number >= 0 (0: train.lr)",
        )
        _need(
            _is_number(self.selector_alpha) and self.selector_alpha >= 0, "train.selector_alpha must be a number >= 0"
        )
        _need(isinstance(self.selector_stop_grad, bool), "train.selector_stop_grad must be True or False")
        _need(self.objective in OBJECTIVES, f"train.objective must be one of {', '.join(OBJECTIVES)}")
        _need(_is_number(self.tv_weight) and 0 <= self.tv_weight <= 1, "train.tv_weight must be in [0, 1]")
        _need(
            self.position_weights in POSITION_WEIGHTS,
            f"train.position_weights must be one of {', '.join(POSITION_WEIGHTS)}",
        )
        _need(
            self.selector_objective in SELECTOR_OBJECTIVES,
            f"train.selector_objective must be one of {', '.join(SELECTOR_OBJECTIVES)}",
        )
        _need(
            self.objective == "ce" or not self.stored_features,
            f"train.objective {self.objective!r} reads the target's distribution, which stored features do not "
            "hold: set train.stored_features=False",
        )
        for key in ("warmup_frac", "weight_decay", "b1", "b2"):
            value = getattr(self, key)
            _need(_is_number(value) and 0 <= value <= 1, f"train.{key} must be in [0, 1]")
        _need(_is_number(self.grad_clip) and self.grad_clip > 0, "train.grad_clip must be a positive number")
        _need(
            self.compute_dtype in COMPUTE_DTYPES,
            f"train.compute_dtype must be {' or '.join(map(repr, COMPUTE_DTYPES))}",
        )


@dataclass(frozen=True, kw_only=True)
class EvalSettings:
    """Section ``eval``: validation (``Trainer.validate``) and what makes ``best/``.

    Fields:
      every: steps between validations (and at the last step).
      val_size: held-out sequences (never trained on).
      val_within_shards: N: draw them from the first N shards only (an earlier stage's split;
        carry the same N, seed and val_size to every later stage); 0: from all. With several ``data``
        folders the shards count in the order the folders are named (the first folder's first).
      decode_prompts: held-out prompts decoded for a real tau at each validation (0: none).
      decode_max_new_tokens: tokens decoded per such prompt.
      best_by: what makes ``best/`` (``BEST_BY``): ``loss`` (the objective trained, lowest),
        ``tau_blocks`` (the held-out blocks' tau, highest) or ``decode_tau`` (the decoded
        prompts' tau, highest; needs ``decode_prompts >= 1``).

    Raises (on construction):
      ConfigError: a field out of range, or ``decode_tau`` without decoded prompts.
    """

    every: int
    val_size: int = 0
    val_within_shards: int = 0
    decode_prompts: int = 0
    decode_max_new_tokens: int
    best_by: str = "loss"

    def __post_init__(self) -> None:
        _need(_is_int(self.every) and self.every >= 1, "eval.every must be an integer >= 1")
        for key in ("val_size", "decode_prompts", "val_within_shards"):
            value = getattr(self, key)
            _need(_is_int(value) and value >= 0, f"eval.{key} must be an integer >= 0")
        _need(
            _is_int(self.decode_max_new_tokens) and self.decode_max_new_tokens >= 1,
            "eval.decode_max_new_tokens must be >= 1",
        )
        _need(
            isinstance(self.best_by, str) and self.best_by in BEST_BY,
            f"eval.best_by must be one of {', '.join(BEST_BY)}, got {self.best_by!r}",
        )
        _need(
            self.best_by != "decode_tau" or self.decode_prompts >= 1,
            'eval.best_by="decode_tau" needs eval.decode_prompts >= 1 (prompts decoded at each validation)',
        )


@dataclass(frozen=True, kw_only=True)
class CkptSettings:
    """Section ``ckpt``: checkpoints (orbax, in ``out_dir/ckpt``).

    Fields:
      every: steps between checkpoints (and at the last step).
      keep: the newest checkpoints kept.

    Raises (on construction):
      ConfigError: a field that is not an integer >= 1.
    """

    every: int
    keep: int

    def __post_init__(self) -> None:
        for key in ("every", "keep"):
            value = getattr(self, key)
            _need(_is_int(value) and value >= 1, f"ckpt.{key} must be an integer >= 1")


SECTIONS = {"drafter": DrafterSpec, "train": TrainSettings, "eval": EvalSettings, "ckpt": CkptSettings}


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """A training run's config, as ``load_config`` makes it from a config file (frozen: read it,
    never change it; ``dataclasses.replace`` makes a changed copy, checked again).

    Fields:
      target: a converted target checkpoint folder or a known name (``smollm2-135m-instruct``).
      data: the token dataset folder (``dflash-jax prepare-data``), or a tuple of them read as one
        (``data.DatasetMix``: e.g. single-turn answers beside multi-turn chats; the run draws its order,
        anchors and held-out answers over all of them).
      out_dir: the run's folder (checkpoints, metrics, ``best/``, ``drafter/``).
      seed: seeds the drafter's initialisation, the held-out split, the data order and the anchors.
      data_shards: N: train on the first N shards only (a dataset still being extended); 0: all. With
        several ``data`` folders: 0 (all of each) or a tuple, one count per folder.
      data_repeats: with several ``data`` folders, how many times each folder's training answers appear
        in an epoch (a tuple of integers >= 1, one per folder; 1: all once): a small folder of answers in
        a benchmark's domain keeps its share beside a large one (``pipeline.repeat_parts``).
      init_from: a drafter folder whose weights start a fresh run (its config must match
        ``drafter``; what fills its blocks may differ: a copy bias it lacks, or the rows of matches
        longer than its ``ngram_max``, start at ``drafter.copy_bias``); '': random initialisation.
      init_grow: ``init_from``'s drafter may have fewer layers than ``drafter.num_layers``: its layers
        come first and each added layer starts as the identity (its attention and MLP output projections
        zero), so the run starts from exactly ``init_from``'s predictions (function-preserving growth, as
        Net2Net, Chen et al. 2016, "Net2DeeperNet").
      mesh: device counts ``(data, fsdp, tensor[, expert])``; their product is the devices used.
      drafter, train, eval, ckpt: the sections (``DrafterSpec``, ``TrainSettings``, ``EvalSettings``,
        ``CkptSettings``).

    Raises (on construction):
      ConfigError: a field of the wrong type or out of range, or two fields that do not go together
        (``train.loss_offsets`` beyond the block, ``train.copy_bias_lr`` without ``drafter.copy_bias``,
        a DFlash 2 selector's ``kl`` objective with stored features).
    """

    target: str
    data: str | tuple[str, ...]
    out_dir: str
    seed: int = 0
    data_shards: int | tuple[int, ...] = 0
    data_repeats: int | tuple[int, ...] = 1
    init_from: str = ""
    init_grow: bool = False
    mesh: tuple[int, ...] = (1, 1, 1)
    drafter: DrafterSpec
    train: TrainSettings
    eval: EvalSettings
    ckpt: CkptSettings

    def __post_init__(self) -> None:
        for key in ("mesh", "data", "data_shards", "data_repeats"):
            _as_tuple(self, key)
        for key in ("target", "out_dir"):
            value = getattr(self, key)
            _need(isinstance(value, str) and value, f"{key} must be a non-empty string")
        folders = self.folders
        _need(
            bool(folders) and all(isinstance(x, str) and x for x in folders),
            "data must be a dataset folder or a tuple of them (non-empty strings)",
        )
        _need(len(set(folders)) == len(folders), f"data names a folder twice: {self.data}; name it once")
        _need(_is_int(self.seed), "seed must be an integer")
        mesh = self.mesh
        _need(
            isinstance(mesh, tuple) and len(mesh) in (3, 4) and all(_is_int(x) and x >= 1 for x in mesh),
            "mesh must be three or four positive integers (data, fsdp, tensor[, expert])",
        )
        shards = self.data_shards
        if isinstance(shards, tuple):
            _need(
                len(shards) == len(folders) and all(_is_int(x) and x >= 0 for x in shards),
                f"data_shards must be one integer >= 0 per data folder ({len(folders)}), got {shards}",
            )
        else:
            _need(_is_int(shards) and shards >= 0, "data_shards must be an integer >= 0")
            _need(
                len(folders) == 1 or shards == 0,
                f"data_shards={shards} with {len(folders)} data folders: give one count per folder "
                f"(e.g. {(shards,) + (0,) * (len(folders) - 1)}; 0 = all) or 0",
            )
        repeats = self.data_repeats
        if isinstance(repeats, tuple):
            _need(
                len(repeats) == len(folders) and all(_is_int(x) and x >= 1 for x in repeats),
                f"data_repeats must be one integer >= 1 per data folder ({len(folders)}), got {repeats}",
            )
        else:
            _need(repeats == 1 and _is_int(repeats), "data_repeats must be 1 or a tuple, one integer >= 1 per folder")
        _need(isinstance(self.init_from, str), "init_from must be a drafter folder path or ''")
        _need(isinstance(self.init_grow, bool), "init_grow must be True or False")
        _need(not self.init_grow or self.init_from, "init_grow=True needs init_from (the drafter to grow)")
        for key, cls in SECTIONS.items():
            _need(isinstance(getattr(self, key), cls), f"{key} must be a {cls.__name__}")
        d, t = self.drafter, self.train
        _need(
            t.loss_offsets <= d.block_size - 1,
            f"train.loss_offsets must be an integer in [0, drafter.block_size - 1 = {d.block_size - 1}] (0 = all)",
        )
        _need(
            not t.copy_bias_lr or d.copy_bias is not None,
            "train.copy_bias_lr is the copy-bias table's learning rate: set drafter.copy_bias too, or 0",
        )
        _need(
            t.selector_objective == "ce" or not t.stored_features or not d.dflash2,
            "train.selector_objective 'kl' reads the target's distribution, which stored features do not hold: "
            "set train.stored_features=False",
        )
        _need(
            not t.stored_features or len(folders) == 1,
            "train.stored_features reads one data folder's stored features; name one folder in data, "
            "or set train.stored_features=False",
        )

    @property
    def folders(self) -> tuple[str, ...]:
        """``data`` as a tuple of folders, one or several."""
        return self.data if isinstance(self.data, tuple) else (self.data,)

    @property
    def repeats(self) -> tuple[int, ...] | None:
        """``data_repeats`` where it repeats a folder's answers; None where every folder counts once."""
        r = self.data_repeats
        return r if isinstance(r, tuple) and any(x != 1 for x in r) else None

    def to_dict(self) -> dict:
        """The config as nested plain dicts (tuples stay tuples): what ``config.json`` holds."""
        return dataclasses.asdict(self)


# ----------------------------------------------------------------------------- loading


def load_config(path: str | os.PathLike, overrides: list[str] = ()) -> TrainConfig:
    """``get_config()`` of a Python config file, then ``key.sub=value`` overrides, as a checked
    ``TrainConfig``.

    A field the file leaves out takes its default here (``TrainConfig`` and its sections); an
    override's value is a Python literal (a bare word is a string), typed like the value it
    replaces (an integer for a float field becomes a float; a list and a tuple are one type).

    Raises:
      ConfigError: no such file, no ``get_config``, an unknown or missing key, a value of the wrong
        type, or a value out of range (the dataclasses' checks).
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no config file {path} (see configs/ for examples)")
    spec = importlib.util.spec_from_file_location(f"dflash_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))  # configs may import their neighbours (configs/_recipe.py)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # a config is user code: report where it broke, in one line
        raise ConfigError(f"{path} failed to load: {type(e).__name__}: {e}") from None
    finally:
        sys.path.remove(str(path.parent))
    if not hasattr(module, "get_config"):
        raise ConfigError(f"{path} has no get_config() function")
    cfg = module.get_config()
    if isinstance(cfg, dict):
        cfg = ConfigDict(cfg)
    if not isinstance(cfg, ConfigDict):
        raise ConfigError(f"{path}: get_config() must return an ml_collections.ConfigDict, got {type(cfg).__name__}")
    values = _with_defaults(cfg.to_dict(), path)
    for item in overrides:
        _override(values, item)
    return TrainConfig(**{k: SECTIONS[k](**v) if k in SECTIONS else v for k, v in values.items()})


def _fields(cls) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _unknown(key: str, known) -> ConfigError:
    where = f"of {key.rpartition('.')[0]}" if "." in key else "at the top level"
    return ConfigError(f"unknown config key {key!r}; the keys {where}: {', '.join(sorted(known))}")


def _with_defaults(raw: dict, path: Path) -> dict:
    """The file's values, every key known, with the defaults of the fields it leaves out.

    Raises:
      ConfigError: an unknown key, a section that is no section, or a field without a default missing.
    """

    def fill(cls, values, prefix: str) -> dict:
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: {prefix[:-1]} must be a section (a ConfigDict), got {type(values).__name__}")
        known = _fields(cls)
        for key in values:
            if key not in known:
                raise ConfigError(f"{path}: {_unknown(prefix + key, known)}")
        out = {}
        for name, f in known.items():
            if name in values:
                out[name] = (
                    fill(SECTIONS[name], values[name], f"{name}.")
                    if cls is TrainConfig and name in SECTIONS
                    else values[name]
                )
            elif f.default is not dataclasses.MISSING:
                out[name] = f.default
            else:
                raise ConfigError(f"{path}: {prefix}{name} is missing (configs/smollm2_135m.py sets every field)")
        return out

    return fill(TrainConfig, raw, "")


_ONE_OR_SEVERAL = ("data", "data_shards", "data_repeats")  # top-level fields taking one value or a tuple of them


def _override(values: dict, item: str) -> None:
    """Apply one ``key.sub=value`` override to ``values`` (``_with_defaults``'s, every key present).

    Raises:
      ConfigError: not ``key=value``, an unknown key, or a value of another type than the field's.
    """
    key, eq, raw = item.partition("=")
    if not eq:
        raise ConfigError(f"override {item!r} is not key=value")
    node, parts = values, key.split(".")
    for i, p in enumerate(parts[:-1]):
        if p not in node or not isinstance(node[p], dict):
            if p in node:
                raise ConfigError(f"unknown config key {key!r}: {'.'.join(parts[: i + 1])} is a field, not a section")
            raise _unknown(".".join(parts[: i + 1]), node)
        node = node[p]
    name = parts[-1]
    if name not in node:
        raise _unknown(key, node)
    if isinstance(node[name], dict):
        raise ConfigError(f"{key} is a section: override its fields ({key}.{next(iter(node[name]))}=...)")
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        value = raw  # a bare string
    old = node[name]
    if isinstance(old, float) and _is_int(value):
        value = float(value)
    several = len(parts) == 1 and name in _ONE_OR_SEVERAL
    if several and isinstance(value, (tuple, list)):
        value = tuple(value)  # a field that takes one value or a tuple of them (``_ONE_OR_SEVERAL``)
    elif several and isinstance(old, tuple) and isinstance(value, (str, int)):
        pass
    elif isinstance(old, (tuple, list)) and isinstance(value, (tuple, list)):
        value = tuple(value)
    elif old is not None and value is not None and type(old) is not type(value):
        raise ConfigError(f"{key}: expected {type(old).__name__}, got {raw!r}")
    node[name] = value


# ----------------------------------------------------------------------------- the drafter


def drafter_config(c: TrainConfig, target: TargetConfig, tokenizer) -> DrafterConfig:
    """The ``DrafterConfig`` a training config asks for (``c.drafter``, in ``c.train.compute_dtype``),
    checked against the target.

    Raises:
      ConfigError: the drafter does not fit the target (layer ids, block size, vocabulary), or the
        mask token is outside the target's vocabulary (or the tokenizer has none to offer).
    """
    d = c.drafter
    mask = d.mask_token_id if d.mask_token_id is not None else mask_token_id(tokenizer)
    kw: dict[str, Any] = {}
    if d.target_layer_ids:
        kw["target_layer_ids"] = tuple(d.target_layer_ids)
    if d.layer_types:
        kw["layer_types"] = tuple(d.layer_types)
        kw["sliding_window"] = d.sliding_window
    kw.update(
        block_input=d.block_input,
        ngram_max=d.ngram_max,
        ngram_min=d.ngram_min,
        ngram_periodic=d.ngram_periodic,
        copy_bias=None if d.copy_bias is None else float(d.copy_bias),
    )
    if d.dflash2:
        kw.update(
            {k: getattr(d, k) for k in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")}
        )
    cfg = DrafterConfig.for_target(
        target, num_layers=d.num_layers, block_size=d.block_size, mask_token_id=mask, dtype=c.train.compute_dtype, **kw
    )
    check_fits(cfg, target)
    if not 0 <= mask < target.vocab_size:
        raise ConfigError(f"drafter.mask_token_id {mask} is outside the target's vocabulary")
    return cfg


# ----------------------------------------------------------------------------- run identity

# The train fields a run's identity leaves out, so that a run keeps the id it had before they
# existed (the dict hashed is the one the ConfigDict-era code hashed: ``train`` as the file set it,
# which held every field but these):
# added later: left out at these defaults
NEWER_TRAIN_FIELDS = {
    "loss_offsets": 0,
    "length_buckets": (),
    "copy_bias_lr": 0.0,
    "objective": "ce",
    "tv_weight": 0.5,
    "position_weights": "decay",
    "selector_objective": "ce",
}
SPEED_ONLY_TRAIN_FIELDS = ("remat", "stored_features")  # speed against memory or disk: the same run either way
DFLASH2_TRAIN_FIELDS = ("selector_alpha", "selector_stop_grad", "selector_objective")  # no effect on a DFlash drafter


def run_identity(
    c: TrainConfig,
    *,
    target_identity: dict,
    data_identity: dict,
    dcfg: DrafterConfig,
    val_within: int | None,
    bucket_window: int,
    bucket_lengths: tuple[int, ...] | None,
) -> dict:
    """What a training run is: target, data, drafter, training settings, seed, held-out split, and
    ``init_from``. A checkpoint whose identity differs is another run (``Trainer`` refuses to resume it).

    ``train`` is ``c.train`` as a dict, less the fields that do not change the run or were added
    after runs existed: ``NEWER_TRAIN_FIELDS`` at their defaults, ``SPEED_ONLY_TRAIN_FIELDS``
    always, and ``DFLASH2_TRAIN_FIELDS`` for a DFlash drafter. So the dict (and ``fingerprint``) is
    the one the ConfigDict-era code made for the same values, and older runs keep their ids.

    Args:
      c: the run's config.
      target_identity, data_identity: ``Target.identity`` and ``TokenDataset.identity``.
      dcfg: the drafter (``drafter_config``), in its released form.
      val_within: ``pipeline.split_indices``'s ``within`` (None: held out from all sequences).
      bucket_window, bucket_lengths: ``pipeline.BUCKET_WINDOW`` and ``pipeline.bucket_lengths``
        (None: no length buckets).
    """
    train = dataclasses.asdict(c.train)
    for key, default in NEWER_TRAIN_FIELDS.items():
        if train[key] == default:
            del train[key]
    for key in SPEED_ONLY_TRAIN_FIELDS + (() if dcfg.dflash2 else DFLASH2_TRAIN_FIELDS):
        train.pop(key, None)  # a newer field at its default is gone already
    identity = {
        "target": target_identity,
        "data": data_identity,
        "drafter": dflash_format.config_json(dcfg),
        "train": train,
        "seed": c.seed,
        "val_size": c.eval.val_size,
    }
    if val_within is not None:  # which sequences are held out (absent: drawn from all, as before this field)
        identity["val_within"] = val_within
    if bucket_lengths:  # what shapes the batches, spelled one way
        train["length_buckets"] = list(bucket_lengths)
        identity["bucket_window"] = bucket_window
    if c.init_from:
        identity["init_from"] = str(Path(c.init_from).resolve())
    if c.init_grow:  # absent when False: older runs keep their ids
        identity["init_grow"] = True
    if c.repeats:  # absent at 1: older runs keep their ids
        identity["data_repeats"] = list(c.repeats)
    return identity


def fingerprint(parts: dict) -> str:
    """The run id: sha256 (hex) of the run's identity (``run_identity``) as canonical JSON."""
    return json_sha256(parts)
