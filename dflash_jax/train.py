"""The drafter trainer: ``dflash-jax train --config configs/NAME.py [key=value ...]``.

Read top to bottom: ``Trainer.__init__`` loads the frozen target, the data and the drafter
config and restores the last checkpoint if there is one; ``train_step`` is the jitted update
(anchors for every accumulation step are drawn first, so the loss is normalised by the weight
sum of the whole global batch, SPEC "Training" 6); ``Trainer.run`` loops with a progress bar,
logs JSONL metrics, validates, checkpoints (orbax, atomic, keep-last-N) and writes the best
drafter by validation loss. A killed run restarted with the same command continues from its
last checkpoint with bitwise-identical losses: the batch of step ``s`` is ``dataset[s]``
(random-access grain), the anchors of step ``s`` come from ``fold_in(rng, s)``, and the
parameters and optimiser state are restored exactly.

Only the drafter's layers, ``fc`` and norms train; the target (and with it the shared
embedding and LM head) is frozen and stored once, in the target checkpoint.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dflash_jax import loss as loss_lib
from dflash_jax.checkpoint import CheckpointError
from dflash_jax.drafter import DrafterConfig, check_fits, init_drafter_params
from dflash_jax.sharding import make_mesh
from dflash_jax.target import ConfigError, TargetConfig
from dflash_jax.utils import read_jsonl

Array = jax.Array


# ----------------------------------------------------------------------------- config


def load_config(path: str | os.PathLike, overrides: list[str] = ()):
    """``get_config()`` of a Python config file, then ``key.sub=value`` overrides (typed like the default).

    Raises:
      ConfigError: no such file, no ``get_config``, an unknown key or a value of the wrong type.
    """
    import ast
    import importlib.util

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
    from ml_collections import ConfigDict

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


NEWER_TRAIN_FIELDS = ("loss_offsets", "length_buckets")  # left out of a run's identity at their defaults


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
    need(isinstance(mesh, (tuple, list)) and len(mesh) == 3 and all(is_int(x) and x >= 1 for x in mesh),
         "mesh must be three positive integers (data, fsdp, tensor)")
    need(is_int(c.get("data_shards", 0)) and c.get("data_shards", 0) >= 0, "data_shards must be an integer >= 0")
    need(isinstance(c.get("init_from", ""), str), "init_from must be a drafter folder path or ''")
    d, t, e, k = c.drafter, c.train, c.eval, c.ckpt
    need(is_int(d.num_layers) and d.num_layers >= 1, "drafter.num_layers must be an integer >= 1")
    need(is_int(d.block_size) and d.block_size >= 2, "drafter.block_size must be an integer >= 2")
    need(d.mask_token_id is None or is_int(d.mask_token_id), "drafter.mask_token_id must be an integer or None")
    need(d.sliding_window is None or (is_int(d.sliding_window) and d.sliding_window >= 1),
         "drafter.sliding_window must be a positive integer or None")
    for key in ("steps", "batch_size", "grad_accum", "max_len", "num_anchors", "anchor_chunk"):
        need(is_int(t[key]) and t[key] >= 1, f"train.{key} must be an integer >= 1")
    need(t.max_len >= 2, "train.max_len must be >= 2")
    lo = t.get("loss_offsets", 0)
    need(is_int(lo) and 0 <= lo <= d.block_size - 1,
         f"train.loss_offsets must be an integer in [0, drafter.block_size - 1 = {d.block_size - 1}] (0 = all)")
    lb = t.get("length_buckets", ())
    need(isinstance(lb, (tuple, list)) and all(is_int(x) and 1 <= x <= t.max_len for x in lb)
         and list(lb) == sorted(set(lb)),
         f"train.length_buckets must be increasing integers in [1, train.max_len = {t.max_len}] (() = no bucketing)")
    for key in ("gamma", "lr"):
        need(isinstance(t[key], (int, float)) and t[key] > 0, f"train.{key} must be a positive number")
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
    for key in ("every", "keep"):
        need(is_int(k[key]) and k[key] >= 1, f"ckpt.{key} must be an integer >= 1")


def drafter_config(c, target: TargetConfig, tokenizer) -> DrafterConfig:
    """The ``DrafterConfig`` a training config asks for, checked against the target."""
    from dflash_jax.cli import mask_token_id

    d = c.drafter
    mask = d.mask_token_id if d.mask_token_id is not None else mask_token_id(tokenizer)
    kw: dict[str, Any] = {}
    if d.target_layer_ids:
        kw["target_layer_ids"] = tuple(d.target_layer_ids)
    if d.layer_types:
        kw["layer_types"] = tuple(d.layer_types)
        kw["sliding_window"] = d.sliding_window
    cfg = DrafterConfig.for_target(target, num_layers=d.num_layers, block_size=d.block_size, mask_token_id=mask,
                                   dtype=c.train.compute_dtype, **kw)
    check_fits(cfg, target)
    if not 0 <= mask < target.vocab_size:
        raise ConfigError(f"drafter.mask_token_id {mask} is outside the target's vocabulary")
    return cfg


# ----------------------------------------------------------------------------- the update


def make_schedule(t) -> optax.Schedule:
    """Learning rate: linear warmup over ``warmup_frac * steps``, then cosine decay to 0 at ``steps``."""
    warmup = max(1, int(round(t.warmup_frac * t.steps)))
    return optax.warmup_cosine_decay_schedule(0.0, t.lr, warmup_steps=warmup, decay_steps=max(t.steps, warmup + 1),
                                              end_value=0.0)


def make_optimizer(t) -> optax.GradientTransformation:
    """AdamW on the warmup-cosine schedule, after global-norm clipping (SPEC "Training" 7)."""
    return optax.chain(optax.clip_by_global_norm(t.grad_clip),
                       optax.adamw(make_schedule(t), b1=t.b1, b2=t.b2, weight_decay=t.weight_decay))


def train_step(params, opt_state, target_params, batch, rng, *, tcfg, dcfg, opt, num_anchors, gamma,
               anchor_chunk, loss_offsets=0, remat=True):
    """One optimiser update over ``accum`` micro-batches.

    Args:
      batch: ``{"tokens": int32 [accum, b, T], "loss_mask": bool [accum, b, T]}``, and
        ``"features"`` float32 ``[accum, b, T, F]`` with stored target features
        (``train.stored_features``; else the target computes them).
      rng: the step's key (``fold_in(run_key, step)``).
    Returns:
      ``(params, opt_state, metrics)``; metrics are float32 scalars / ``[B]`` arrays.
    """
    accum = batch["tokens"].shape[0]
    keys = jax.random.split(rng, accum)
    anchors = jax.vmap(loss_lib.sample_anchors, (0, 0, None))(keys, batch["loss_mask"], num_anchors)
    w = loss_lib.offset_weights(dcfg.block_size, gamma, loss_offsets)
    _, use = jax.vmap(loss_lib.block_labels, (0, 0, 0, None))(batch["tokens"], batch["loss_mask"], anchors,
                                                               dcfg.block_size)
    total_weight = jnp.maximum(jnp.sum(use * w), 1e-6)  # the whole global batch, every micro-batch

    def micro(carry, xs):
        grads, stats = carry
        tokens, mask, anc, feats = xs

        def objective(p):
            s = loss_lib.block_loss(p, target_params, tokens, mask, anc, tcfg=tcfg, cfg=dcfg, gamma=gamma,
                                    anchor_chunk=anchor_chunk, loss_offsets=loss_offsets, remat=remat, feats=feats)
            return s.loss / total_weight, s

        (_, s), g = jax.value_and_grad(objective, has_aux=True)(params)
        return (jax.tree.map(jnp.add, grads, g), jax.tree.map(jnp.add, stats, s)), None

    zeros = jax.tree.map(jnp.zeros_like, params)
    stats0 = loss_lib.BlockStats(*(jnp.zeros(s, jnp.float32) for s in ((), (), (dcfg.block_size,),
                                                                         (dcfg.block_size,), (), ())))
    xs = (batch["tokens"], batch["loss_mask"], anchors, batch.get("features"))
    (grads, stats), _ = jax.lax.scan(micro, (zeros, stats0), xs)
    updates, opt_state = opt.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    return params, opt_state, summarise(stats) | {"grad_norm": optax.tree.norm(grads)}


def sharded_step(mesh, params, target_params, *, tcfg, dcfg, opt, num_anchors, gamma, anchor_chunk,
                 loss_offsets=0, remat=True, stored_features=False):
    """``train_step`` jitted with explicit shardings over ``mesh`` (the old ``pjit``).

    Parameters of the drafter and the frozen target are laid out by the logical-axis table
    (``dflash_jax.sharding``); the batch ``[accum, b, T]`` is split over ``data`` x ``fsdp`` along
    ``b``; the optimiser state follows the parameters; metrics are replicated. With
    ``stored_features`` the batch also carries ``"features"`` ``[accum, b, T, F]``, split the same way.

    Returns:
      ``(step_fn, param_shardings, batch_sharding)``; ``step_fn(params, opt_state, target_params,
      batch, rng)`` donates ``params`` and ``opt_state``.
    """
    from jax.sharding import NamedSharding, PartitionSpec as P

    from dflash_jax.drafter import drafter_logical_specs
    from dflash_jax.sharding import axis_rules, logical_spec, logical_to_sharding

    param_sh = logical_to_sharding(drafter_logical_specs(dcfg), mesh)
    target_sh = jax.tree.map(lambda x: x.sharding, target_params)
    rep = NamedSharding(mesh, P())
    # the optimiser moments mirror the parameter tree: each takes its parameter's sharding; the rest
    # (step counts) is replicated
    opt_sh = optax.tree_map_params(opt, lambda _, sh: sh, jax.eval_shape(opt.init, params), param_sh,
                                   transform_non_params=lambda _: rep)
    batch_sh = NamedSharding(mesh, P(None, *logical_spec("batch", "length")))
    step = partial(train_step, tcfg=tcfg, dcfg=dcfg, opt=opt, num_anchors=num_anchors, gamma=gamma,
                   anchor_chunk=anchor_chunk, loss_offsets=loss_offsets, remat=remat)
    features_sh = NamedSharding(mesh, P(*batch_sh.spec, None))  # [accum, b, T, F]: split like the tokens
    batch_in = {"tokens": batch_sh, "loss_mask": batch_sh}
    if stored_features:
        batch_in["features"] = features_sh
    jitted = jax.jit(step, in_shardings=(param_sh, opt_sh, target_sh, batch_in, rep),
                     out_shardings=(param_sh, opt_sh, rep), donate_argnums=(0, 1))

    def run(*args):
        with axis_rules(), jax.set_mesh(mesh):
            return jitted(*args)

    run.jitted = jitted  # for ahead-of-time lowering (launch/memory_plan.py)
    run.features_sharding = features_sh  # for the trainer's stored-feature batches
    return run, param_sh, batch_sh, opt_sh


def summarise(s: loss_lib.BlockStats) -> dict:
    """Loss, per-offset accuracy and two acceptance-length estimates from summed ``BlockStats``."""
    acc = s.correct / jnp.maximum(s.count, 1.0)
    return {"loss": s.loss / jnp.maximum(s.weight, 1e-6), "acc": acc,
            "tau_est": loss_lib.tau_estimate(s.count, s.correct),
            "tau_blocks": 1.0 + s.prefix / jnp.maximum(s.blocks, 1.0)}


def eval_stats(params, target_params, batch, rng, *, tcfg, dcfg, num_anchors, gamma, anchor_chunk, loss_offsets=0,
               remat=True):
    anchors = loss_lib.sample_anchors(rng, batch["loss_mask"], num_anchors)
    return loss_lib.block_loss(params, target_params, batch["tokens"], batch["loss_mask"], anchors, tcfg=tcfg,
                               cfg=dcfg, gamma=gamma, anchor_chunk=anchor_chunk, loss_offsets=loss_offsets,
                               remat=remat, feats=batch.get("features"))


# ----------------------------------------------------------------------------- the run


def _differences(old, new, prefix: str = "") -> list[str]:
    """``key: old -> new`` for every leaf that differs between two JSON-like trees."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new)):
            out += _differences(old.get(k), new.get(k), f"{prefix}{k}.")
        return out
    return [] if old == new else [f"{prefix[:-1]}: {old!r} -> {new!r}"]


def fingerprint(parts: dict) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


class Trainer:
    """A training run in ``c.out_dir``: ``ckpt/`` (orbax, last N states), ``metrics.jsonl``,
    ``best/`` (drafter with the lowest validation loss), ``drafter/`` (final drafter), both in
    the dflash-jax drafter format that ``dflash-jax generate --drafter`` loads.

    Raises (on construction):
      ConfigError: the config does not fit the target (block size, layer ids, mask token).
      CheckpointError / DataError: unreadable target or data, data for another tokenizer, or a
        checkpoint in ``out_dir`` from another model, data or config (nothing is overwritten).
    """

    def __init__(self, c, log=print):
        from dflash_jax import checkpoint, data
        from dflash_jax.cli import stop_ids
        from dflash_jax.utils import enable_compilation_cache

        enable_compilation_cache()
        validate_config(c)
        self.c, self.log = c, log
        t = c.train
        micro = t.batch_size // t.grad_accum
        # shape checks first: a bad config fails before anything is loaded
        if micro * t.grad_accum != t.batch_size:
            raise ConfigError(f"train.batch_size ({t.batch_size}) must be a multiple of train.grad_accum ({t.grad_accum})")
        if t.num_anchors % t.anchor_chunk:
            raise ConfigError(f"train.num_anchors ({t.num_anchors}) must be a multiple of train.anchor_chunk "
                              f"({t.anchor_chunk})")
        self.mesh = make_mesh(tuple(c.get("mesh", (1, 1, 1))))
        shards = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
        if micro % shards:
            raise ConfigError(f"the micro-batch (train.batch_size / train.grad_accum = {micro}) must be a multiple "
                              f"of data x fsdp = {shards} of mesh {tuple(c.mesh)}")
        self.out = Path(c.out_dir)
        if self.out.exists() and not self.out.is_dir():
            raise CheckpointError(f"out_dir {self.out} is a file; choose a folder")
        if self.out.is_dir() and jax.process_index() == 0:  # leftovers of a kill during an export
            for stale in [*self.out.glob("*.partial-*"), *self.out.glob("*.old-*")]:
                shutil.rmtree(stale, ignore_errors=True)
        self.target = checkpoint.load_target(c.target, dtype=t.compute_dtype, mesh=self.mesh)
        self.tcfg = self.target.cfg
        tok = self.target.tokenizer()
        self.dcfg = drafter_config(c, self.tcfg, tok)
        self.ds = data.TokenDataset(c.data, max_shards=c.get("data_shards") or None)
        if not self.ds.complete:
            raise data.DataError(f"{c.data} is still being prepared ({len(self.ds.shards)} shards so far): finish "
                                 "`dflash-jax prepare-data` (rerun its command) before training on it, or set "
                                 "data_shards=N to train on its first N shards")
        if len(self.ds) <= c.eval.val_size:
            raise data.DataError(f"{c.data} has {len(self.ds)} sequences, too few for eval.val_size={c.eval.val_size} "
                                 "plus training")
        self.ds.check_vocab(self.tcfg.vocab_size)
        self.stop_ids = stop_ids(tok)
        want = self.ds.meta.get("tokenizer_sha256")
        if want and want != self.target.identity["tokenizer_sha256"]:
            raise data.DataError(f"{c.data} was tokenised with another tokenizer than the target {c.target}'s")
        self.features = None  # stored target features (train.stored_features): the step skips the target forward
        self.features_width = len(self.dcfg.target_layer_ids) * self.tcfg.hidden_size
        if t.get("stored_features"):
            self.features = data.FeatureStore(
                data.features_folder(c.data, self.target.identity, self.dcfg.target_layer_ids, t.compute_dtype),
                self.ds, self.features_width)
        within = None  # eval.val_within_shards: keep an earlier stage's held-out answers (data.split_indices)
        if c.eval.get("val_within_shards"):
            k = c.eval.val_within_shards
            if k > len(self.ds.shards):
                raise ConfigError(f"eval.val_within_shards={k} but this run reads {len(self.ds.shards)} shard(s) of "
                                  f"{c.data}; ask for at most that many (0 = all)")
            within = self.ds.shard_start(k)
            if c.eval.val_size >= within:
                raise ConfigError(f"eval.val_size={c.eval.val_size} needs more than the {within} sequences of the "
                                  f"first eval.val_within_shards={k} shard(s); raise val_within_shards")
            if within == len(self.ds):
                within = None  # the same split as drawing from all: the same run
        self.train_idx, self.val_idx = data.split_indices(len(self.ds), c.eval.val_size, seed=c.seed, within=within)
        self.rows = data.rows(self.ds, self.train_idx, max_len=t.max_len, seed=c.seed, features=self.features)
        self.batches = None
        if t.get("length_buckets"):
            self.batches = data.bucketed_batches(self.ds, self.train_idx, batch_size=t.batch_size, max_len=t.max_len,
                                                 buckets=tuple(t.length_buckets), seed=c.seed, features=self.features)
        self.opt, self.schedule = make_optimizer(t), make_schedule(t)
        self.identity = {
            "target": self.target.identity, "data": self.ds.identity,
            "drafter": self.dcfg.to_released(), "train": t.to_dict(), "seed": c.seed, "val_size": c.eval.val_size,
        }
        if within is not None:  # which sequences are held out (absent: drawn from all, as before this field)
            self.identity["val_within"] = within
        for key in NEWER_TRAIN_FIELDS:  # at their defaults: runs made before these fields existed match
            if not self.identity["train"].get(key):
                self.identity["train"].pop(key, None)
        for key in ("remat", "stored_features"):  # speed against memory or disk: the same run either way
            self.identity["train"].pop(key, None)
        if t.get("length_buckets"):  # what shapes the batches, spelled one way
            self.identity["train"]["length_buckets"] = list(data.bucket_lengths(tuple(t.length_buckets), t.max_len))
            self.identity["bucket_window"] = data.BUCKET_WINDOW
        if c.get("init_from"):
            self.identity["init_from"] = str(Path(c.init_from).resolve())
        self.run_id = fingerprint(self.identity)
        kw = dict(tcfg=self.tcfg, dcfg=self.dcfg, num_anchors=t.num_anchors, gamma=t.gamma,
                  anchor_chunk=t.anchor_chunk, loss_offsets=t.get("loss_offsets", 0), remat=t.get("remat", True))
        params = init_drafter_params(self.dcfg, seed=c.seed)
        if c.get("init_from"):
            params = self._initial_weights(c.init_from, params)
        self._step, param_sh, self.batch_sh, opt_sh = sharded_step(self.mesh, params, self.target.params,
                                                                    opt=self.opt, **kw,
                                                                    stored_features=self.features is not None)
        self._eval = jax.jit(partial(eval_stats, **kw))
        self.rng = jax.random.PRNGKey(c.seed)
        self.params = jax.device_put(params, param_sh)
        self.opt_state = jax.device_put(self.opt.init(params), opt_sh)
        self.step = 0
        self.best = math.inf
        self.ckpt = self._manager()
        self._restore()

    def _initial_weights(self, folder: str, params):
        """Weights of the drafter in ``folder`` (a fresh run continues from it: a new schedule and
        optimiser state); its config must be this run's."""
        from dflash_jax.drafter_io import load_drafter

        loaded, cfg, _ = load_drafter(folder)
        ours, theirs = self.dcfg.to_released(), cfg.to_released()
        diff = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
        if diff:
            raise ConfigError(f"init_from {folder}: its drafter differs from this config's in {', '.join(diff)}; "
                              "set the drafter.* fields to match it")
        return jax.tree.map(lambda a, b: np.asarray(b, a.dtype), params, loaded)

    # -- checkpoints
    def _manager(self):
        import orbax.checkpoint as ocp

        opts = ocp.CheckpointManagerOptions(max_to_keep=self.c.ckpt.keep, create=True,
                                            enable_async_checkpointing=False)
        return ocp.CheckpointManager((self.out / "ckpt").resolve(), options=opts)

    def _state(self):
        return {"params": self.params, "opt_state": self.opt_state, "step": np.int64(self.step),
                "rng": np.asarray(self.rng)}  # a host array: orbax cannot save a single-device one across hosts

    def save(self):
        import orbax.checkpoint as ocp

        meta = {"run_id": self.run_id, "identity": self.identity, "step": self.step, "data_position": self.step,
                "best_val_loss": self.best}
        self.ckpt.save(self.step, args=ocp.args.Composite(state=ocp.args.StandardSave(self._state()),
                                                          meta=ocp.args.JsonSave(meta)))
        self.ckpt.wait_until_finished()

    def _restore(self):
        import orbax.checkpoint as ocp

        last = self.ckpt.latest_step()
        if last is None:
            return
        meta = self.ckpt.restore(last, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
        if meta.get("run_id") != self.run_id:
            diff = _differences(meta.get("identity", {}), json.loads(json.dumps(self.identity, default=str)))
            raise CheckpointError(
                f"{self.out / 'ckpt'} holds a run with another {diff[0].split('.')[0] if diff else 'setup'} "
                f"({'; '.join(diff[:4]) or 'unknown difference'}); a run cannot change its target, data, drafter "
                "or training settings (train.steps shapes the schedule): pass another out_dir to start a new run; "
                "nothing was changed")
        def spec(x):  # restore onto this run's mesh, whatever mesh wrote the checkpoint
            if isinstance(x, jax.Array):
                return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
            return jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype)

        abstract = jax.tree.map(spec, self._state())
        state = self.ckpt.restore(last, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))["state"]
        self.params, self.opt_state, self.rng = state["params"], state["opt_state"], state["rng"]
        self.step, self.best = int(state["step"]), float(meta.get("best_val_loss", math.inf))
        self.log(f"resumed {self.out} at step {self.step}")

    # -- metrics log: entries past the resumed step (written after the last checkpoint) are dropped
    def _open_log(self):
        path = self.out / "metrics.jsonl"
        rows = read_jsonl(path)[0] if path.exists() else []  # a line cut by a kill is dropped
        keep = [r for r in rows if r.get("step", 0) <= self.step]
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in keep))
        os.replace(tmp, path)
        return open(path, "a")

    # -- input
    def global_batch(self, step: int) -> dict:
        """The batch of ``step`` as global arrays ``[accum, micro, T]`` split over data x fsdp.

        Without ``train.length_buckets``: row ``j`` of step ``s`` is element ``s * batch_size + j`` of
        the shuffled, repeated grain dataset (so a restart at step ``s`` sees exactly the same data),
        and each process reads only the rows its own devices hold (per-host data sharding). With
        them: the step's batch is ``data.bucketed_batches[s]`` (the same rows regrouped by length
        within windows; ``T`` = its bucket), read whole by every process (its length must agree
        everywhere), and the step is compiled once per bucket (``step_s`` then includes that
        first compile).
        """
        t = self.c.train
        accum, micro = t.grad_accum, t.batch_size // t.grad_accum
        if self.batches is not None:  # length buckets: the whole batch at once, padded to its bucket
            whole = self.batches[step]
            shape = (accum, micro, whole["tokens"].shape[1])

            def row(a: int, r: int) -> dict:
                return {k: v[a * micro + r] for k, v in whole.items()}
        else:
            shape = (accum, micro, t.max_len)
            cache: dict[int, dict] = {}

            def row(a: int, r: int) -> dict:
                j = step * t.batch_size + a * micro + r
                if j not in cache:
                    cache[j] = self.rows[j]
                return cache[j]

        def fetch(key):
            def cb(index):
                a_idx, r_idx = range(accum)[index[0]], range(micro)[index[1]]
                return np.stack([np.stack([row(a, r)[key][index[2:]] for r in r_idx]) for a in a_idx])
            if key == "features":  # [accum, micro, T, F], split like the tokens
                return jax.make_array_from_callback((*shape, self.features_width), self._step.features_sharding, cb)
            return jax.make_array_from_callback(shape, self.batch_sh, cb)

        keys = ("tokens", "loss_mask") + (("features",) if self.features is not None else ())
        return {key: fetch(key) for key in keys}

    # -- validation
    def validate(self) -> dict:
        c = self.c
        from dflash_jax.data import PaddedSource

        src = PaddedSource(self.ds, self.val_idx, c.train.max_len, features=self.features)
        total = None
        b = c.train.batch_size // c.train.grad_accum
        empty = {"tokens": np.zeros(c.train.max_len, np.int32), "loss_mask": np.zeros(c.train.max_len, bool)}
        if self.features is not None:
            empty["features"] = np.zeros((c.train.max_len, self.features_width), np.float32)
        for i in range(0, len(src), b):  # the last batch is padded with rows that carry no loss
            rows = [src[j] if j < len(src) else empty for j in range(i, i + b)]
            batch = {k: self._global(np.stack([r[k] for r in rows])) for k in rows[0]}
            s = self._eval(self.params, self.target.params, batch, jax.random.PRNGKey(c.seed + 1))
            total = s if total is None else jax.tree.map(jnp.add, total, s)
        out = {f"val_{k}": v for k, v in summarise(total).items()} if total is not None else {}
        if c.eval.decode_prompts and jax.process_count() == 1:  # a real decode runs on one host
            out["val_decode_tau"] = self.decode_tau(c.eval.decode_prompts, c.eval.decode_max_new_tokens)
        return out

    def _global(self, x: np.ndarray):
        """A host array (the same on every process) as a global array split over data x fsdp."""
        from jax.sharding import NamedSharding, PartitionSpec as P

        sh = NamedSharding(self.mesh, P(*self.batch_sh.spec[1:], *[None] * (x.ndim - 2)))  # features: [b, T, F]
        return jax.make_array_from_callback(x.shape, sh, lambda idx: x[idx])

    def decode_tau(self, n: int, max_new: int) -> float:
        """Real speculative decoding of ``n`` validation prompts (prompt = tokens before the response)."""
        from dflash_jax.decode import Decoder

        if not hasattr(self, "_decoder"):
            self._decoder = Decoder(self.target.params, self.tcfg, drafter=(self.params, self.dcfg))
        self._decoder.drafter_params = self.params
        lengths = []
        for j in self.val_idx[:n]:
            tok, mask = self.ds[int(j)]
            first = int(np.argmax(mask)) if mask.any() else len(tok)
            if first == 0:
                continue
            r = self._decoder.generate([tok[:first].tolist()], max_new, self.stop_ids)[0]
            lengths += r.acceptance_lengths
        return float(np.mean(lengths)) if lengths else float("nan")

    def export(self, name: str):
        """Write the current drafter as ``out_dir/name`` (process 0; all processes gather it)."""
        from jax.experimental import multihost_utils

        from dflash_jax.distributed import is_main
        from dflash_jax.drafter_io import save_drafter

        params = multihost_utils.process_allgather(self.params, tiled=True) if jax.process_count() > 1 else self.params
        if is_main():
            save_drafter(params, self.dcfg, self.out / name, target_identity=self.target.identity,
                         overwrite=True, extra_meta={"step": self.step, "run_id": self.run_id})
        return self.out / name

    # -- the loop
    def run(self, stop_after: int | None = None):
        """Train until ``train.steps`` (or ``stop_after`` more steps); returns the last metrics."""
        from tqdm import tqdm

        from dflash_jax.distributed import is_main

        c, t = self.c, self.c.train
        main = is_main()
        self.out.mkdir(parents=True, exist_ok=True)
        if main:
            (self.out / "config.json").write_text(json.dumps(c.to_dict(), indent=2))
        end = t.steps if stop_after is None else min(t.steps, self.step + stop_after)
        logf = self._open_log() if main else open(os.devnull, "w")
        last: dict = {}
        bar = tqdm(total=t.steps, initial=self.step, desc="train", unit="step", dynamic_ncols=True,
                   **({} if main else {"disable": True}))
        while self.step < end:
            batch = self.global_batch(self.step)
            t0 = time.perf_counter()
            self.params, self.opt_state, m = self._step(self.params, self.opt_state, self.target.params, batch,
                                                        jax.random.fold_in(self.rng, self.step))
            m = jax.device_get(m)
            dt = time.perf_counter() - t0
            self.step += 1
            rec = {"step": self.step, "loss": float(m["loss"]), "grad_norm": float(m["grad_norm"]),
                   "tau_est": float(m["tau_est"]), "tau_blocks": float(m["tau_blocks"]),
                   "acc": [float(x) for x in m["acc"][1:]], "lr": float(self.schedule(self.step - 1)),
                   "step_s": dt}
            if self.step % c.eval.every == 0 or self.step == t.steps:
                val = self.validate()
                rec |= {k: (float(v) if np.ndim(v) == 0 else [float(x) for x in v[1:]]) for k, v in val.items()}
                if "val_loss" in rec and rec["val_loss"] < self.best:
                    self.best = rec["val_loss"]
                    self.export("best")
            logf.write(json.dumps(rec) + "\n")
            logf.flush()
            bar.set_postfix(loss=f"{rec['loss']:.3f}", acc1=f"{rec['acc'][0]:.2f}", tau=f"{rec['tau_est']:.2f}")
            bar.update(1)
            if self.step % c.ckpt.every == 0 or self.step == t.steps:
                self.save()
            last = rec
        bar.close()
        logf.close()
        if self.step == t.steps:
            self.log(f"wrote final drafter {self.export('drafter')}")
        return last
