"""Training configs: loading (``get_config()`` of a Python file plus ``key=value`` overrides),
validation, the ``DrafterConfig`` a config asks for, and a run's identity (what a resumed run must
share with the checkpoint it resumes).

Configs are Python files returning an ``ml_collections.ConfigDict`` (``configs/``), as in
big_vision. ``load_config`` validates once; everything downstream trusts its result.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from ml_collections import ConfigDict

from dflash_jax import dflash_format
from dflash_jax.drafter import BLOCK_INPUTS, DrafterConfig, check_fits
from dflash_jax.errors import ConfigError
from dflash_jax.target import TargetConfig
from dflash_jax.tokens import mask_token_id
from dflash_jax.utils import json_sha256


def load_config(path: str | os.PathLike, overrides: list[str] = ()):
    """``get_config()`` of a Python config file, then ``key.sub=value`` overrides (typed like the default).

    Raises:
      ConfigError: no such file, no ``get_config``, an unknown key or a value of the wrong type.
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
    for item in overrides:
        key, eq, raw = item.partition("=")
        if not eq:
            raise ConfigError(f"override {item!r} is not key=value")
        node, parts = cfg, key.split(".")
        for p in parts[:-1]:
            if not hasattr(node, "keys") or p not in node:
                raise ConfigError(f"unknown config key {key!r}")
            node = node[p]
        if not hasattr(node, "keys"):
            raise ConfigError(f"unknown config key {key!r}")
        if parts[-1] not in node:
            raise ConfigError(f"unknown config key {key!r}; keys here: {sorted(node.keys())}")
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw  # a bare string
        old = node[parts[-1]]
        if isinstance(old, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if isinstance(old, tuple) and isinstance(value, list):
            value = tuple(value)
        if old is not None and value is not None and type(old) is not type(value):
            raise ConfigError(f"{key}: expected {type(old).__name__}, got {raw!r}")
        node[parts[-1]] = value
    validate_config(cfg)
    return cfg


# left out of a run's identity at their defaults
NEWER_TRAIN_FIELDS = ("loss_offsets", "length_buckets", "copy_bias_lr")
# eval.best_by: what makes a run's best/: the objective trained ("loss", lowest), or a validation tau (highest)
BEST_BY = {"loss": None, "tau_blocks": "val_tau_blocks", "decode_tau": "val_decode_tau"}


def validate_config(c) -> None:
    """Range and type checks of a training config (one clear error instead of a silent no-op or a
    traceback deep inside the run).

    Raises:
      ConfigError: naming the field and what it must be.
    """

    def need(ok: bool, what: str) -> None:
        if not ok:
            raise ConfigError(f"config: {what}")

    def is_int(x) -> bool:
        return isinstance(x, int) and not isinstance(x, bool)

    for key in ("target", "data", "out_dir"):
        need(isinstance(c.get(key), str) and c[key], f"{key} must be a non-empty string")
    need(is_int(c.get("seed")), "seed must be an integer")
    mesh = c.get("mesh", (1, 1, 1))
    need(
        isinstance(mesh, (tuple, list)) and len(mesh) in (3, 4) and all(is_int(x) and x >= 1 for x in mesh),
        "mesh must be three or four positive integers (data, fsdp, tensor[, expert])",
    )
    need(is_int(c.get("data_shards", 0)) and c.get("data_shards", 0) >= 0, "data_shards must be an integer >= 0")
    need(isinstance(c.get("init_from", ""), str), "init_from must be a drafter folder path or ''")
    d, t, e, k = c.drafter, c.train, c.eval, c.ckpt
    need(is_int(d.num_layers) and d.num_layers >= 1, "drafter.num_layers must be an integer >= 1")
    need(is_int(d.block_size) and d.block_size >= 2, "drafter.block_size must be an integer >= 2")
    need(d.mask_token_id is None or is_int(d.mask_token_id), "drafter.mask_token_id must be an integer or None")
    need(
        d.sliding_window is None or (is_int(d.sliding_window) and d.sliding_window >= 1),
        "drafter.sliding_window must be a positive integer or None",
    )
    need(d.get("block_input", "mask") in BLOCK_INPUTS, f"drafter.block_input must be one of {', '.join(BLOCK_INPUTS)}")
    nmax, nmin = d.get("ngram_max", 4), d.get("ngram_min", 1)
    need(is_int(nmax) and is_int(nmin) and 1 <= nmin <= nmax, "drafter.ngram_min/ngram_max need 1 <= min <= max")
    bias = d.get("copy_bias")
    need(
        bias is None
        or (isinstance(bias, (int, float)) and not isinstance(bias, bool) and d.get("block_input") == "ngram"),
        'drafter.copy_bias must be None or a number, with drafter.block_input="ngram"',
    )
    conv, rank = d.get("conv_kernel_size", 0), d.get("selector_rank", 0)
    need(is_int(conv) and conv >= 0, "drafter.conv_kernel_size must be an integer >= 0 (0: DFlash, no DFlash 2)")
    if conv:
        need(
            is_int(rank) and rank >= 1 and is_int(d.get("selector_top_k")) and d.selector_top_k >= 1,
            "a DFlash 2 drafter (drafter.conv_kernel_size > 0) needs drafter.selector_rank >= 1 and "
            "drafter.selector_top_k >= 1",
        )
        need(is_int(d.get("conv_group_size")) and d.conv_group_size >= 1, "drafter.conv_group_size must be >= 1")
    else:
        need(not rank, "drafter.selector_rank is DFlash 2's: set drafter.conv_kernel_size (2) too, or selector_rank 0")
    alpha = t.get("selector_alpha", 1.0)
    need(
        isinstance(alpha, (int, float)) and not isinstance(alpha, bool) and alpha >= 0,
        "train.selector_alpha must be a number >= 0",
    )
    need(isinstance(t.get("selector_stop_grad", False), bool), "train.selector_stop_grad must be True or False")
    for key in ("steps", "batch_size", "grad_accum", "max_len", "num_anchors", "anchor_chunk"):
        need(is_int(t[key]) and t[key] >= 1, f"train.{key} must be an integer >= 1")
    need(t.max_len >= 2, "train.max_len must be >= 2")
    lo = t.get("loss_offsets", 0)
    need(
        is_int(lo) and 0 <= lo <= d.block_size - 1,
        f"train.loss_offsets must be an integer in [0, drafter.block_size - 1 = {d.block_size - 1}] (0 = all)",
    )
    lb = t.get("length_buckets", ())
    need(
        isinstance(lb, (tuple, list))
        and all(is_int(x) and 1 <= x <= t.max_len for x in lb)
        and list(lb) == sorted(set(lb)),
        f"train.length_buckets must be increasing integers in [1, train.max_len = {t.max_len}] (() = no bucketing)",
    )
    for key in ("gamma", "lr"):
        need(isinstance(t[key], (int, float)) and t[key] > 0, f"train.{key} must be a positive number")
    need(
        isinstance(t.get("copy_bias_lr", 0.0), (int, float)) and t.get("copy_bias_lr", 0.0) >= 0,
        "train.copy_bias_lr must be a number >= 0 (0: train.lr)",
    )
    need(
        not t.get("copy_bias_lr") or c.drafter.get("copy_bias") is not None,
        "train.copy_bias_lr is the copy-bias table's learning rate: set drafter.copy_bias too, or 0",
    )
    for key in ("warmup_frac", "weight_decay", "b1", "b2"):
        need(isinstance(t[key], (int, float)) and 0 <= t[key] <= 1, f"train.{key} must be in [0, 1]")
    need(isinstance(t.grad_clip, (int, float)) and t.grad_clip > 0, "train.grad_clip must be a positive number")
    need(isinstance(t.get("remat", True), bool), "train.remat must be True or False")
    need(isinstance(t.get("stored_features", False), bool), "train.stored_features must be True or False")
    need(t.compute_dtype in ("float32", "bfloat16"), "train.compute_dtype must be 'float32' or 'bfloat16'")
    need(is_int(e.every) and e.every >= 1, "eval.every must be an integer >= 1")
    for key in ("val_size", "decode_prompts", "val_within_shards"):
        need(is_int(e.get(key, 0)) and e.get(key, 0) >= 0, f"eval.{key} must be an integer >= 0")
    need(is_int(e.decode_max_new_tokens) and e.decode_max_new_tokens >= 1, "eval.decode_max_new_tokens must be >= 1")
    best_by = e.get("best_by", "loss")
    need(best_by in BEST_BY, f"eval.best_by must be one of {', '.join(BEST_BY)}, got {best_by!r}")
    need(
        best_by != "decode_tau" or e.get("decode_prompts", 0) >= 1,
        'eval.best_by="decode_tau" needs eval.decode_prompts >= 1 (prompts decoded at each validation)',
    )
    for key in ("every", "keep"):
        need(is_int(k[key]) and k[key] >= 1, f"ckpt.{key} must be an integer >= 1")


def drafter_config(c, target: TargetConfig, tokenizer) -> DrafterConfig:
    """The ``DrafterConfig`` a training config asks for, checked against the target."""
    d = c.drafter
    mask = d.mask_token_id if d.mask_token_id is not None else mask_token_id(tokenizer)
    kw: dict[str, Any] = {}
    if d.target_layer_ids:
        kw["target_layer_ids"] = tuple(d.target_layer_ids)
    if d.layer_types:
        kw["layer_types"] = tuple(d.layer_types)
        kw["sliding_window"] = d.sliding_window
    kw.update(
        block_input=d.get("block_input", "mask"),
        ngram_max=d.get("ngram_max", 4),
        ngram_min=d.get("ngram_min", 1),
        copy_bias=None if d.get("copy_bias") is None else float(d.copy_bias),
    )
    if d.get("conv_kernel_size", 0):  # DFlash 2
        kw.update({k: d[k] for k in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")})
    cfg = DrafterConfig.for_target(
        target, num_layers=d.num_layers, block_size=d.block_size, mask_token_id=mask, dtype=c.train.compute_dtype, **kw
    )
    check_fits(cfg, target)
    if not 0 <= mask < target.vocab_size:
        raise ConfigError(f"drafter.mask_token_id {mask} is outside the target's vocabulary")
    return cfg


# ----------------------------------------------------------------------------- run identity


SPEED_ONLY_TRAIN_FIELDS = ("remat", "stored_features")  # speed against memory or disk: the same run either way
DFLASH2_TRAIN_FIELDS = ("selector_alpha", "selector_stop_grad")  # no effect on a DFlash drafter


def run_identity(
    c,
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

    Fields added after runs existed (``NEWER_TRAIN_FIELDS``) are left out at their defaults,
    speed-only fields always and DFlash 2's training fields for a DFlash drafter, so older runs keep
    their identity.
    """
    t = c.train
    identity = {
        "target": target_identity,
        "data": data_identity,
        "drafter": dflash_format.config_json(dcfg),
        "train": t.to_dict(),
        "seed": c.seed,
        "val_size": c.eval.val_size,
    }
    if val_within is not None:  # which sequences are held out (absent: drawn from all, as before this field)
        identity["val_within"] = val_within
    for key in NEWER_TRAIN_FIELDS:
        if not identity["train"].get(key):
            identity["train"].pop(key, None)
    for key in SPEED_ONLY_TRAIN_FIELDS + (() if dcfg.dflash2 else DFLASH2_TRAIN_FIELDS):
        identity["train"].pop(key, None)
    if bucket_lengths:  # what shapes the batches, spelled one way
        identity["train"]["length_buckets"] = list(bucket_lengths)
        identity["bucket_window"] = bucket_window
    if c.get("init_from"):
        identity["init_from"] = str(Path(c.init_from).resolve())
    return identity


def fingerprint(parts: dict) -> str:
    """The run id: a hash of the run's identity (``run_identity``)."""
    return json_sha256(parts)
