"""Drafter checkpoints in the released DFlash format (``config.json`` + ``model.safetensors``).

The released format is what ``dflash==0.1.0`` (``dflash.model.DFlashDraftModel``) loads:
PyTorch ``Linear`` weights ``[out, in]`` under ``layers.{i}.self_attn.{q,k,v,o}_proj.weight``,
``layers.{i}.self_attn.{q,k}_norm.weight``, ``layers.{i}.mlp.{gate,up,down}_proj.weight``,
``layers.{i}.{input,post_attention}_layernorm.weight``, ``norm.weight``, ``fc.weight``,
``hidden_norm.weight``. Our parameter pytree uses the same names with ``layers_{i}`` and
``[in, out]`` kernels, so the mapping is a rename plus a transpose.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from dflash_jax.checkpoint import CheckpointError, atomic_folder, read_json
from dflash_jax.drafter import DrafterConfig


def released_names(cfg: DrafterConfig) -> dict[str, tuple[tuple[str, ...], bool]]:
    """Released tensor name -> (our param path, transpose?)."""
    names = {"norm.weight": (("norm", "scale"), False), "fc.weight": (("fc",), True),
             "hidden_norm.weight": (("hidden_norm", "scale"), False)}
    for i in range(cfg.num_layers):
        r, o = f"layers.{i}.", (f"layers_{i}",)
        for p in "qkvo":
            names[f"{r}self_attn.{p}_proj.weight"] = ((*o, "self_attn", f"{p}_proj"), True)
            if cfg.attention_bias:
                names[f"{r}self_attn.{p}_proj.bias"] = ((*o, "self_attn", f"{p}_bias"), False)
        for p in "qk":
            names[f"{r}self_attn.{p}_norm.weight"] = ((*o, "self_attn", f"{p}_norm", "scale"), False)
        for p in ("gate", "up", "down"):
            names[f"{r}mlp.{p}_proj.weight"] = ((*o, "mlp", f"{p}_proj"), True)
        for p in ("input_layernorm", "post_attention_layernorm"):
            names[f"{r}{p}.weight"] = ((*o, p, "scale"), False)
    return names


def export_released(params, cfg: DrafterConfig, out: str | Path, *, dtype: str = "float32",
                    target_identity: dict | None = None, overwrite: bool = False) -> Path:
    """Write ``params`` as a released-format drafter folder (atomic). ``dtype``: float32 or bfloat16."""
    import ml_dtypes
    from safetensors.numpy import save_file

    np_dtype = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}[dtype]
    tensors = {}
    for name, (path, transpose) in released_names(cfg).items():
        x = params
        for k in path:
            x = x[k]
        x = np.asarray(x, np.float32)
        tensors[name] = np.ascontiguousarray(x.T if transpose else x).astype(np_dtype)
    with atomic_folder(Path(out), overwrite) as tmp:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        config = cfg.to_released(target_identity)
        config["torch_dtype"] = dtype
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
    return Path(out)


def import_released(folder: str | Path, dtype: str = "float32"):
    """Read a released-format drafter folder -> ``(params, DrafterConfig, config.json dict)``.

    Raises:
      CheckpointError: missing files or tensors, or a tensor of the wrong shape (named).
      ConfigError: the config lacks a required field or asks for something unsupported.
    """
    from safetensors import safe_open

    folder = Path(folder)
    raw = read_json(folder / "config.json")
    cfg = DrafterConfig.from_released(raw, dtype=dtype)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors in {folder}")
    names = released_names(cfg)
    params: dict = {}
    found = set()
    for f in files:
        with safe_open(str(f), framework="numpy") as h:
            for name in h.keys():
                if name not in names:
                    continue
                path, transpose = names[name]
                x = np.asarray(h.get_tensor(name)).astype(np.float32)
                x = x.T if transpose else x
                node = params
                for k in path[:-1]:
                    node = node.setdefault(k, {})
                node[path[-1]] = x
                found.add(name)
    missing = sorted(set(names) - found)
    if missing:
        raise CheckpointError(f"{len(missing)} drafter tensor(s) missing from {folder}, first: {missing[0]}")
    _check_shapes(params, cfg, folder)
    return params, cfg, raw


def _check_shapes(params, cfg: DrafterConfig, folder: Path) -> None:
    import jax

    from dflash_jax.drafter import init_drafter_params

    want = jax.eval_shape(lambda: init_drafter_params(cfg))
    for (path, w), (_, g) in zip(jax.tree_util.tree_leaves_with_path(want), jax.tree_util.tree_leaves_with_path(params)):
        if tuple(w.shape) != tuple(g.shape):
            raise CheckpointError(
                f"drafter tensor {jax.tree_util.keystr(path)} in {folder} has shape {g.shape}, expected {w.shape}")


# --- our own (orbax) drafter checkpoints ------------------------------------------------------

DRAFTER_FORMAT = "dflash-jax-drafter"


def save_drafter(params, cfg: DrafterConfig, out: str | Path, *, target_identity: dict | None = None,
                 overwrite: bool = False, extra_meta: dict | None = None) -> Path:
    """Write a drafter checkpoint: ``config.json`` (the released-format config), ``params/`` (orbax)
    and ``dflash_jax.json`` (format, target identity). Atomic: a partial folder is never left at ``out``.

    Only the drafter's own parameters are stored; the embedding and LM head stay in the target.
    """
    import jax
    import orbax.checkpoint as ocp

    from dflash_jax.checkpoint import META_FILE

    params = jax.tree.map(lambda x: np.asarray(x, np.float32), params)
    with atomic_folder(Path(out), overwrite) as tmp:
        (tmp / "config.json").write_text(json.dumps(cfg.to_released(target_identity), indent=2))
        # host numpy arrays, written by this process alone (in a multi-host job only process 0 exports)
        only_me = ocp.options.MultiprocessingOptions(primary_host=jax.process_index(),
                                                     active_processes={jax.process_index()})
        ckptr = ocp.StandardCheckpointer(multiprocessing_options=only_me)
        ckptr.save((tmp / "params").resolve(), params)
        ckptr.wait_until_finished()
        meta = {"format": DRAFTER_FORMAT, "format_version": 1, "target_identity": target_identity,
                **(extra_meta or {})}
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2))
    return Path(out)


def load_drafter(folder: str | Path, dtype: str = "float32"):
    """Load a drafter from our orbax checkpoint **or** a released-format folder (detected by content).

    Returns:
      ``(params, DrafterConfig, target_identity or None)``; params are float32 numpy/jax arrays.

    Raises:
      CheckpointError: not a drafter folder, or missing/partial/mis-shaped tensors (named).
      ConfigError: an unsupported or incomplete drafter config.
    """
    import jax

    from dflash_jax.checkpoint import META_FILE, restore_params
    from dflash_jax.drafter import init_drafter_params

    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"drafter folder {folder} does not exist")
    if (folder / "ckpt").is_dir() and ((folder / "best").is_dir() or (folder / "drafter").is_dir()):
        raise CheckpointError(f"{folder} is a training run folder; pass its best/ or drafter/ subfolder")
    meta_path = folder / META_FILE
    if not meta_path.exists():
        if not (folder / "config.json").exists():
            raise CheckpointError(f"{folder} is not a drafter: expected config.json plus model.safetensors "
                                  f"(released format) or params/ and {META_FILE} (dflash-jax format)")
        params, cfg, raw = import_released(folder, dtype)
        return params, cfg, (raw.get("dflash_config") or {}).get("target_identity")
    meta = read_json(meta_path)
    if meta.get("format") != DRAFTER_FORMAT:
        raise CheckpointError(f"{meta_path} has format {meta.get('format')!r}, expected {DRAFTER_FORMAT!r}"
                              " (is this a target checkpoint? pass it as --target)")
    cfg = DrafterConfig.from_released(read_json(folder / "config.json"), dtype=dtype)
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=one),
                            jax.eval_shape(lambda: init_drafter_params(cfg)))
    params = restore_params(folder / "params", abstract)
    return params, cfg, meta.get("target_identity")
