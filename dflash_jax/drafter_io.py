"""Drafter checkpoints: ours (orbax) and the released DFlash format (``config.json`` + ``model.safetensors``).

The released format is what ``dflash==0.1.0`` (``dflash.model.DFlashDraftModel``) loads:
PyTorch ``Linear`` weights ``[out, in]`` under ``layers.{i}.self_attn.{q,k,v,o}_proj.weight``,
``layers.{i}.self_attn.{q,k}_norm.weight``, ``layers.{i}.mlp.{gate,up,down}_proj.weight``,
``layers.{i}.{input,post_attention}_layernorm.weight``, ``norm.weight``, ``fc.weight``,
``hidden_norm.weight``. Our parameter pytree uses the same names with ``layers_{i}`` and
``[in, out]`` kernels, so the mapping (``dflash_format.param_names``) is a rename plus a transpose.

``drafter_for`` loads what a user passes as ``--drafter`` (a folder, ``auto``, ``random``,
``none``), checked against the target; ``speculation.load`` and ``plan_for`` build on it.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
from safetensors.numpy import save_file

from dflash_jax import dflash_format, hub
from dflash_jax.checkpoint import TargetCheckpoint, restore_params
from dflash_jax.drafter import (
    DrafterConfig,
    check_draft_vocab,
    check_fits,
    drafter_param_shapes,
    init_drafter_params,
    with_draft_vocab,
)
from dflash_jax.errors import CheckpointError, ConfigError
from dflash_jax.sharding import placed
from dflash_jax.tokens import mask_token_id
from dflash_jax.utils import META_FILE, atomic_folder, atomic_write_text, read_json, read_safetensors

DRAFT_VOCAB_FILE = "draft_vocab.json"  # a drafter's draft vocabulary, stored beside its weights


def export_released(
    params,
    cfg: DrafterConfig,
    out: str | Path,
    *,
    dtype: str = "float32",
    target_identity: dict | None = None,
    overwrite: bool = False,
    draft_vocab: dict | None = None,
) -> Path:
    """Write ``params`` as a released-format drafter folder (atomic). ``dtype``: float32 or bfloat16.
    ``draft_vocab``: a draft vocabulary to store with it (``stored_draft_vocab``), in the same
    atomic write."""
    np_dtype = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}[dtype]
    tensors = {}
    for name, (path, transpose) in dflash_format.param_names(cfg).items():
        x = params
        for k in path:
            x = x[k]
        x = np.asarray(x, np.float32)
        tensors[name] = np.ascontiguousarray(x.T if transpose else x).astype(np_dtype)
    with atomic_folder(Path(out), overwrite, kind="released-drafter") as tmp:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        config = dflash_format.config_json(cfg, target_identity)
        config["torch_dtype"] = dtype
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        if draft_vocab is not None:
            (tmp / DRAFT_VOCAB_FILE).write_text(json.dumps(draft_vocab))
    return Path(out)


def import_released(folder: str | Path, dtype: str = "float32"):
    """Read a released-format drafter folder -> ``(params, DrafterConfig, config.json dict)``.

    Raises:
      CheckpointError: missing files or tensors, or a tensor of the wrong shape (named).
      ConfigError: the config lacks a required field or asks for something unsupported.
    """
    folder = Path(folder)
    raw = read_json(folder / "config.json")
    cfg = dflash_format.read_config(raw, dtype=dtype)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors in {folder}")
    params, unused = read_safetensors(files, dflash_format.param_names(cfg), drafter_param_shapes(cfg))
    if unused:
        raise CheckpointError(
            f"{len(unused)} tensor(s) in {folder} that a {cfg.num_layers}-layer DFlash drafter does "
            f"not have, first: {sorted(unused)[0]} (another drafter kind, such as DFlash 2, or a "
            "config that does not match the weights)"
        )
    return params, cfg, raw


# --- our own (orbax) drafter checkpoints ------------------------------------------------------

DRAFTER_FORMAT = "dflash-jax-drafter"


def save_drafter(
    params,
    cfg: DrafterConfig,
    out: str | Path,
    *,
    target_identity: dict | None = None,
    overwrite: bool = False,
    extra_meta: dict | None = None,
    draft_vocab: dict | None = None,
) -> Path:
    """Write a drafter checkpoint: ``config.json`` (the released-format config), ``params/`` (orbax)
    and ``dflash_jax.json`` (format, target identity). Atomic: a partial folder is never left at ``out``.

    Only the drafter's own parameters are stored; the embedding and LM head stay in the target.
    ``draft_vocab``: a draft vocabulary to store with it (``stored_draft_vocab``), in the same write.
    """
    params = jax.tree.map(lambda x: np.asarray(x, np.float32), params)
    with atomic_folder(Path(out), overwrite, kind="drafter") as tmp:
        (tmp / "config.json").write_text(json.dumps(dflash_format.config_json(cfg, target_identity), indent=2))
        # host numpy arrays, written by this process alone (in a multi-host job only process 0 exports)
        only_me = ocp.options.MultiprocessingOptions(
            primary_host=jax.process_index(), active_processes={jax.process_index()}
        )
        ckptr = ocp.StandardCheckpointer(multiprocessing_options=only_me)
        ckptr.save((tmp / "params").resolve(), params)
        ckptr.wait_until_finished()
        meta = {"format": DRAFTER_FORMAT, "format_version": 1, "target_identity": target_identity, **(extra_meta or {})}
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2))
        if draft_vocab is not None:
            (tmp / DRAFT_VOCAB_FILE).write_text(json.dumps(draft_vocab))
    return Path(out)


def load_drafter(folder: str | Path, dtype: str = "float32"):
    """Load a drafter from our orbax checkpoint **or** a released-format folder (detected by content).

    Returns:
      ``(params, DrafterConfig, target_identity or None)``; params are float32 numpy/jax arrays.

    Raises:
      CheckpointError: not a drafter folder, or missing/partial/mis-shaped tensors (named).
      ConfigError: an unsupported or incomplete drafter config.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"drafter folder {folder} does not exist")
    if (folder / "ckpt").is_dir() and ((folder / "best").is_dir() or (folder / "drafter").is_dir()):
        raise CheckpointError(f"{folder} is a training run folder; pass its best/ or drafter/ subfolder")
    meta_path = folder / META_FILE
    if not meta_path.exists():
        if not (folder / "config.json").exists():
            raise CheckpointError(
                f"{folder} is not a drafter: expected config.json plus model.safetensors "
                f"(released format) or params/ and {META_FILE} (dflash-jax format)"
            )
        params, cfg, raw = import_released(folder, dtype)
        return params, cfg, (raw.get("dflash_config") or {}).get("target_identity")
    meta = read_json(meta_path)
    if meta.get("format") != DRAFTER_FORMAT:
        raise CheckpointError(
            f"{meta_path} has format {meta.get('format')!r}, expected {DRAFTER_FORMAT!r}"
            " (is this a target checkpoint? pass it as --target)"
        )
    cfg = dflash_format.read_config(read_json(folder / "config.json"), dtype=dtype)
    params = restore_params(folder / "params", placed(drafter_param_shapes(cfg)))
    return params, cfg, meta.get("target_identity")


# --- what --drafter names ------------------------------------------------------------------


def resolve_drafter(spec: str, ck: TargetCheckpoint) -> str:
    """``auto`` -> the folder of the drafter shipped for this target (``hub.SHIPPED_DRAFTERS``),
    else ``none``; any other value is returned as it is."""
    if spec != "auto":
        return spec
    found = hub.shipped_drafter(ck.identity)
    return str(found) if found is not None else "none"


# --- a draft vocabulary stored with a drafter ---------------------------------------------


def write_draft_vocab(folder: str | Path, ids, /, **meta) -> Path:
    """Store a draft vocabulary with the drafter in ``folder`` (atomically): ``draft_vocab.json``
    ``{"ids": [...], **meta}``, ids most frequent first, so that its first N are the best N
    (``drafter.with_draft_vocab``; docs/JOURNAL.md "A draft vocabulary").

    Raises:
      CheckpointError: ``folder`` is not a drafter folder.
      ValueError: ids empty, repeated, negative or past the drafter's ``vocab_size``.
    """
    folder = Path(folder)
    if not (folder / "config.json").exists():
        raise CheckpointError(f"{folder} is not a drafter folder (no config.json); pass the drafter's folder")
    ids = check_draft_vocab(list(ids), read_json(folder / "config.json").get("vocab_size"))
    path = folder / DRAFT_VOCAB_FILE
    atomic_write_text(path, json.dumps({"ids": ids.tolist(), **meta}))
    return path


def _read_draft_vocab_file(folder: str | Path) -> dict | None:
    """``draft_vocab.json`` of ``folder`` as its JSON object, its ``ids`` checked to be a list of
    integers >= 0, or None if there is none. Raises CheckpointError otherwise."""
    path = Path(folder) / DRAFT_VOCAB_FILE
    if not path.exists():
        return None
    raw = read_json(path)
    ids = raw.get("ids") if isinstance(raw, dict) else None
    ok = isinstance(ids, list) and ids and all(type(i) is int and 0 <= i < 2**31 for i in ids)
    if not ok:
        raise CheckpointError(
            f"{path} holds no list of token ids (integers >= 0) under 'ids';"
            " rewrite it with dflash-jax draft-vocab DATA --write DRAFTER"
        )
    return raw


def read_draft_vocab(folder: str | Path) -> np.ndarray | None:
    """The draft vocabulary stored with a drafter, int32 ``[N]`` most frequent first, or None.

    Raises:
      CheckpointError: the file exists but holds no list of ids.
    """
    raw = _read_draft_vocab_file(folder)
    return None if raw is None else np.asarray(raw["ids"], np.int32)


def stored_draft_vocab(folder: str | Path, vocab_size: int | None) -> dict | None:
    """The draft vocabulary stored with the drafter in ``folder`` as its JSON object (``{"ids": [...],
    **metadata}``), checked against ``vocab_size``, or None if there is none: what
    ``import-drafter`` and ``export-drafter`` pass on (``draft_vocab=`` of ``save_drafter`` and
    ``export_released``), so a converted drafter keeps the head it drafts over.

    Raises:
      CheckpointError: the file holds no list of ids, or ids repeated or past ``vocab_size``.
    """
    raw = _read_draft_vocab_file(folder)
    if raw is not None:
        try:
            check_draft_vocab(raw["ids"], vocab_size)
        except ValueError as e:
            raise CheckpointError(
                f"{Path(folder) / DRAFT_VOCAB_FILE}: {e}; rewrite it with dflash-jax draft-vocab DATA --write DRAFTER"
            ) from None
    return raw


def check_draft_vocab_size(draft_vocab: int | None) -> None:
    """Raise ``ConfigError`` unless ``draft_vocab`` is None or a whole number of tokens >= 0."""
    if draft_vocab is not None and (type(draft_vocab) is not int or draft_vocab < 0):
        raise ConfigError(f"--draft-vocab takes a number of tokens >= 0 (0: the whole vocabulary); got {draft_vocab!r}")


def drafter_for(spec: str, ck: TargetCheckpoint, tok, seed: int = 0, draft_vocab: int | None = None):
    """The ``(params, DrafterConfig)`` of a DFlash drafter for target ``ck``: ``spec`` is ``random``
    (a fresh 1-layer drafter, block 16, seeded) or a drafter folder (ours or the released format).
    What ``--drafter`` names (``auto`` and the others) is resolved once, by ``speculation.load``.

    ``draft_vocab``: None -> the draft vocabulary stored with the drafter (``draft_vocab.json``),
    whole, if there is one; 0 -> none (the head over the whole vocabulary); N -> the stored list's
    first N tokens (its N most frequent). With one, ``params`` hold it (``with_draft_vocab``).
    ``params`` are on the default device, placed once, so every ``Decoder`` built from them shares
    one copy.

    Raises:
      ConfigError: the drafter does not fit the target (hidden size, vocabulary, layer count or
        ids, or another target's identity), or ``draft_vocab`` is negative, not a whole number, or
        asks for more tokens than stored (or for any with a random drafter).
      CheckpointError: not a drafter folder, or a damaged one.
      ValueError: ``spec`` is a name to resolve (``auto``, ``none``, ``ngram``).
    """
    check_draft_vocab_size(draft_vocab)
    if spec in ("auto", "none", "ngram"):
        raise ValueError(
            f"drafter_for takes a drafter folder or 'random', not {spec!r}: resolve it with speculation.load"
        )
    if spec == "random":
        if draft_vocab:
            raise ConfigError("--draft-vocab: a random drafter has no draft vocabulary; pass a drafter folder")
        cfg = DrafterConfig.for_target(ck.cfg, num_layers=1, block_size=16, mask_token_id=mask_token_id(tok))
        return init_drafter_params(cfg, seed), cfg
    params, cfg, identity = load_drafter(spec)
    check_fits(cfg, ck.cfg, identity, ck.identity)
    if draft_vocab == 0:  # the head over the whole vocabulary
        return jax.device_put(params), cfg
    ids = read_draft_vocab(spec)
    if draft_vocab:
        if ids is None:
            raise ConfigError(
                f"--draft-vocab {draft_vocab}: {spec} stores no draft vocabulary ({DRAFT_VOCAB_FILE});"
                " pass 0 for the whole vocabulary, or write one with dflash-jax draft-vocab DATA --write DRAFTER"
            )
        if draft_vocab > len(ids):
            raise ConfigError(
                f"--draft-vocab {draft_vocab}: {spec} stores {len(ids)} tokens; pass at most that, or 0 for"
                " the whole vocabulary (dflash-jax draft-vocab DATA --write DRAFTER --size N writes a longer list)"
            )
        ids = ids[:draft_vocab]
    if ids is not None:
        try:
            params = with_draft_vocab(params, ids, ck.params, ck.cfg)
        except ValueError as e:
            raise ConfigError(f"{Path(spec) / DRAFT_VOCAB_FILE}: {e}") from None
    return jax.device_put(params), cfg
