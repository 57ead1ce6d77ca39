"""The released DFlash drafter format (SPEC "Released drafter format"): what ``dflash==0.1.0`` loads
(``dflash.model.DFlashDraftModel``, and ``DFlash2DraftModel`` for a DFlash 2 drafter).

A folder holds ``config.json`` (a Qwen3-style Hugging Face config with a ``dflash_config`` object)
and ``model.safetensors``. ``read_config`` reads the config as a ``drafter.DrafterConfig``,
``config_json`` writes one, and ``param_names`` names the drafter's parameters as the released
tensors (``drafter_io`` reads and writes the folders through them).
"""

from __future__ import annotations

from typing import Any

from dflash_jax import hf_format
from dflash_jax.drafter import DrafterConfig, default_target_layer_ids
from dflash_jax.errors import ConfigError

# The drafter classes a released config.json may name in ``architectures`` (dflash==0.1.0's): DFlash, DFlash 2
ARCHITECTURES = ("DFlashDraftModel", "DFlash2DraftModel")


def read_config(hf: dict[str, Any], dtype: str = "float32") -> DrafterConfig:
    """Read a released DFlash drafter ``config.json`` (``dflash_config`` wins over top-level keys).

    ``architectures`` says which drafter it is: ``DFlash2DraftModel`` a DFlash 2 drafter,
    ``DFlashDraftModel`` (or no ``architectures`` at all) a DFlash one. The shape and RoPE fields
    are read as a Qwen3 config (``hf_format.read_config``), as the reference builds its layers.

    Raises:
      ConfigError: an ``architectures`` entry other than those of ``ARCHITECTURES`` (named, with
        the known ones); a required field missing (``num_target_layers``, ``mask_token_id``,
        ``num_hidden_layers``, a DFlash 2 drafter's ``conv_kernel_size``, ...), a field of the
        wrong type, top-level and ``dflash_config`` block sizes that disagree, or an unsupported
        setting; one line naming the field.
    """
    dcfg = hf.get("dflash_config") or {}
    if not isinstance(dcfg, dict):
        raise ConfigError("drafter config.json: dflash_config must be an object")
    arch = hf.get("architectures") or []  # none: a DFlash drafter
    arch = arch if isinstance(arch, list) else [arch]
    unknown = [a for a in arch if a not in ARCHITECTURES]
    if unknown:
        raise ConfigError(
            f"drafter config.json: architectures {unknown[0]!r} is not a released DFlash drafter; "
            f"known: {', '.join(ARCHITECTURES)}"
        )
    dflash2 = "DFlash2DraftModel" in arch

    def get(name, default=None):
        return dcfg.get(name, hf.get(name, default))

    def number(name, kind=int, default=None, top_only=False):
        value = hf.get(name, default) if top_only else get(name, default)
        if value is None:
            raise ConfigError(
                f"drafter config.json has no {name}" + ("" if top_only else " (in dflash_config or at the top level)")
            )
        try:
            if isinstance(value, bool) or (kind is int and float(value) != int(value)):
                raise ValueError
            return kind(value)
        except (TypeError, ValueError):
            raise ConfigError(
                f"drafter config.json: {name} must be {'an integer' if kind is int else 'a number'}, got {value!r}"
            ) from None

    if "num_target_layers" not in hf and "num_target_layers" not in dcfg:
        raise ConfigError("drafter config.json has no num_target_layers (required by the released format)")
    if get("mask_token_id") is None:
        raise ConfigError("drafter config.json has no mask_token_id (in dflash_config or at the top level)")
    n = number("num_hidden_layers", top_only=True)
    for name in ("hidden_size", "intermediate_size", "vocab_size", "num_attention_heads"):
        number(name, top_only=True)  # a clear error before the config is read further
    rope = hf_format.read_config(
        {**hf, "model_type": "qwen3", "use_sliding_window": False, "layer_types": None, "num_hidden_layers": n}
    )
    if rope.yarn is not None:  # the drafter's attention implements plain and Llama 3 RoPE only
        raise ConfigError(
            "drafter config.json: rope type 'yarn' is not supported for drafters; supported: 'default', 'llama3'"
        )
    ids = get("target_layer_ids") or default_target_layer_ids(number("num_target_layers"), n)
    if not isinstance(ids, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ConfigError(f"drafter config.json: target_layer_ids must be a list of integers, got {ids!r}")
    softcap = get("final_logit_softcapping")
    top, inner = hf.get("block_size"), dcfg.get("block_size")
    if top is not None and inner is not None and top != inner:
        raise ConfigError(
            f"drafter config.json: block_size {top!r} at the top level but {inner!r} in dflash_config; "
            "make them agree (the reference reads dflash_config's)"
        )
    periodic = dcfg.get("ngram_periodic", False)
    if not isinstance(periodic, bool):
        raise ConfigError(f"drafter config.json: dflash_config.ngram_periodic must be true or false, got {periodic!r}")
    extra = {}
    if dflash2:  # SPEC "DFlash 2": its fields, where the reference reads them
        extra = {k: number(k) for k in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")}
        if extra["conv_kernel_size"] < 1:
            raise ConfigError(f"drafter config.json: conv_kernel_size must be >= 1, got {extra['conv_kernel_size']}")
    return DrafterConfig(
        hidden_size=number("hidden_size", top_only=True),
        intermediate_size=number("intermediate_size", top_only=True),
        num_layers=n,
        num_heads=rope.num_heads,
        num_kv_heads=rope.num_kv_heads,
        head_dim=rope.head_dim,
        vocab_size=number("vocab_size", top_only=True),
        num_target_layers=number("num_target_layers"),
        target_layer_ids=tuple(ids),
        block_size=number("block_size", default=16),
        mask_token_id=number("mask_token_id"),
        rms_norm_eps=rope.rms_norm_eps,
        rope_theta=rope.rope_theta,
        rope_scaling=rope.rope_scaling,
        layer_types=tuple(hf.get("layer_types") or ()),
        sliding_window=hf.get("sliding_window") if "sliding_attention" in (hf.get("layer_types") or ()) else None,
        attention_bias=bool(hf.get("attention_bias", False)),
        input_embedding_scale=number("input_embedding_scale", float, 1.0),
        output_multiplier=number("output_multiplier", float, 1.0),
        final_logit_softcapping=number("final_logit_softcapping", float) if softcap else None,
        max_position_embeddings=number("max_position_embeddings", default=40960, top_only=True),
        dtype=dtype,
        block_input=str(dcfg.get("block_input", "mask")),
        ngram_max=number("ngram_max", default=4),
        ngram_min=number("ngram_min", default=1),
        ngram_periodic=periodic,
        copy_bias=None if dcfg.get("copy_bias") is None else number("copy_bias", float),
        tree_temperature=number("tree_temperature", float, 1.0),
        **extra,
    )


def config_json(cfg: DrafterConfig, target_identity: dict | None = None) -> dict:
    """The released-format ``config.json`` of ``cfg`` (a Qwen3-style config; ``architectures``
    ``DFlashDraftModel``, or ``DFlash2DraftModel`` for a DFlash 2 drafter); ``target_identity``,
    when given, is stored in ``dflash_config`` (dflash-jax's record of the target it drafts for)."""
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling:
        rope = {"rope_type": "llama3", "rope_theta": cfg.rope_theta, **dict(cfg.rope_scaling)}
        rope["original_max_position_embeddings"] = int(rope["original_max_position_embeddings"])
    out = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": rope,
        "max_position_embeddings": cfg.max_position_embeddings,
        "attention_bias": cfg.attention_bias,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "layer_types": list(cfg.layer_types),
        "sliding_window": cfg.sliding_window,
        "use_sliding_window": cfg.sliding_window is not None,
        "num_target_layers": cfg.num_target_layers,
        "block_size": cfg.block_size,
        "dflash_config": {
            "mask_token_id": cfg.mask_token_id,
            "target_layer_ids": list(cfg.target_layer_ids),
            "block_size": cfg.block_size,
            "input_embedding_scale": cfg.input_embedding_scale,
            "output_multiplier": cfg.output_multiplier,
            "final_logit_softcapping": cfg.final_logit_softcapping,
        },
    }
    if cfg.block_input != "mask":  # read by dflash-jax only: dflash==0.1.0 fills blocks with mask tokens
        out["dflash_config"].update(block_input=cfg.block_input, ngram_max=cfg.ngram_max, ngram_min=cfg.ngram_min)
        if cfg.ngram_periodic:  # absent when off: earlier drafters' configs (and runs' ids) stay as they were
            out["dflash_config"]["ngram_periodic"] = True
        if cfg.copy_bias is not None:
            out["dflash_config"]["copy_bias"] = cfg.copy_bias
    if cfg.tree_temperature != 1.0:  # read by dflash-jax only (draft trees); absent at 1, as before it existed
        out["dflash_config"]["tree_temperature"] = cfg.tree_temperature
    if cfg.dflash2:
        out["architectures"] = ["DFlash2DraftModel"]
        out["dflash_config"].update(
            conv_kernel_size=cfg.conv_kernel_size,
            conv_group_size=cfg.conv_group_size,
            selector_rank=cfg.selector_rank,
            selector_top_k=cfg.selector_top_k,
        )
    if target_identity:
        out["dflash_config"]["target_identity"] = target_identity
    return out


def param_names(cfg: DrafterConfig) -> dict[str, tuple[tuple[str, ...], bool]]:
    """Released tensor name -> (our param path, transpose?): the one place that names ``drafter.Drafter``'s
    parameters in the released DFlash format (SPEC "Released drafter format"; ``drafter_io`` reads
    and writes through it). Ours use the same names with ``layers_{i}`` and ``[in, out]`` kernels."""
    names = {
        "norm.weight": (("norm", "scale"), False),
        "fc.weight": (("fc",), True),
        "hidden_norm.weight": (("hidden_norm", "scale"), False),
    }
    if cfg.copy_bias is not None:  # a dflash-jax extension (``copy_prior``)
        names["copy_bias"] = (("copy_bias",), False)
    if cfg.dflash2:  # the reference's names (its codebooks are stored without ".weight")
        for i in range(cfg.num_layers):
            for conv in ("attention_conv", "mlp_conv"):
                r, o = f"layers.{i}.{conv}.", (f"layers_{i}", conv)
                names[f"{r}base_kernel"] = ((*o, "base_kernel"), False)
                names[f"{r}kernel_projection.weight"] = ((*o, "kernel_projection"), True)
        for book in ("predecessor_codebook", "successor_codebook"):
            names[f"candidate_selector.{book}"] = ((book,), False)
        names["candidate_selector.hidden_projection.weight"] = (("hidden_projection",), True)
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
