"""Hugging Face's format of a target: ``config.json`` -> ``TargetConfig``, and the tensor names of its
safetensors -> our parameters (``target.Target``'s pytree).

Read top to bottom: ``read_config`` (the checks every config passes), the per-family readers
behind ``READERS`` (a table from ``model_type`` to a small function), the pieces they share
(``_layers``, the one RoPE reader ``_rope``, ``_heads``, ``_shape``), then the weight names
(``param_names``, ``is_extra``).

Defaults for the fields a config may leave out are those of transformers' config class of the
family (``LlamaConfig``, ``Qwen3MoeConfig``, ``GptOssConfig``, ``Qwen3_5TextConfig``,
``Gemma3TextConfig``, ``Gemma4TextConfig``, ``DeepseekV3Config``, ``Glm4MoeConfig``, ...), so a minimal
config reads as transformers reads it (tests/test_target.py compares them).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection
from typing import Any

from dflash_jax.errors import ConfigError
from dflash_jax.target import LatentConfig, LinearAttentionConfig, MoEConfig, TargetConfig

HYBRID_FAMILIES = ("qwen3_5", "qwen3_5_moe")  # Gated DeltaNet layers among gated full attention
# multimodal configs (a text_config inside) whose language model is the target: their text model_type
# and whether the head is tied by default
MULTIMODAL = {
    "qwen3_5": ("qwen3_5_text", False),
    "qwen3_5_moe": ("qwen3_5_moe_text", False),
    "gemma3": ("gemma3_text", True),
    "gemma4": ("gemma4_text", True),
    "kimi_k25": ("deepseek_v3", True),  # Kimi-K2.5: a DeepSeek-V3 language model (its kimi_k2 text config)
}


# Text-only model types that are another family's architecture: Kimi-K2 is DeepSeek-V3's (its
# config.json names its own configuration class, which is DeepseekV3Config).
ALIASES = {"kimi_k2": "deepseek_v3"}

# The shape fields transformers' configuration classes fill in where a config.json leaves them out (the
# released multimodal Gemma 3 folders' text_config, say, gives neither num_attention_heads nor vocab_size).
DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": dict(vocab_size=262208, hidden_size=2304, num_hidden_layers=26, num_attention_heads=8),
    "gemma4_text": dict(vocab_size=262144, hidden_size=2304, num_hidden_layers=30, num_attention_heads=8),
    "deepseek_v3": dict(vocab_size=129280, hidden_size=7168, num_hidden_layers=61, num_attention_heads=128),
    "glm4_moe": dict(vocab_size=151552, hidden_size=4096, num_hidden_layers=46, num_attention_heads=96),
}


def read_config(hf: dict[str, Any], dtype: str = "float32") -> TargetConfig:
    """Read a Hugging Face ``config.json`` dict (transformers 4.x or 5.x layout) as a ``TargetConfig``.

    ``dtype``: the compute dtype of the config (``"float32"`` or ``"bfloat16"``).

    Raises:
      ConfigError: ``hf`` not a dict; an unknown ``model_type`` (one line listing
        ``SUPPORTED_FAMILIES``); a required field missing or malformed (named); a size not a
        positive integer, or ``num_attention_heads`` not a multiple of ``num_key_value_heads``;
        quantised weights; or a feature we do not implement (sliding-window attention in the Qwen
        families, an unknown RoPE type, an activation other than the family's (SiLU; Gemma's tanh
        GELU), MLP biases, partial rotary embeddings outside Qwen3.5 and GLM-4.5, bidirectional
        attention, DeepSeek-style expert groups that do not divide the experts), each named.
    """
    if not isinstance(hf, dict):
        raise ConfigError("config.json must hold a JSON object")
    try:
        cfg = _read(hf, dtype)
    except ConfigError:
        raise
    except KeyError as e:
        raise ConfigError(f"config.json lacks the required field {e.args[0]!r}") from None
    except (TypeError, ValueError, ZeroDivisionError, IndexError) as e:
        raise ConfigError(f"config.json has a malformed field: {type(e).__name__}: {e}") from None
    sizes = dict(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
    )
    bad = [k for k, v in sizes.items() if v < 1]
    if bad:
        raise ConfigError(f"config.json field {bad[0]} must be a positive integer")
    if cfg.num_heads % cfg.num_kv_heads:
        raise ConfigError(
            f"num_attention_heads ({cfg.num_heads}) must be a multiple of num_key_value_heads ({cfg.num_kv_heads})"
        )
    return cfg


def _read(hf: dict[str, Any], dtype: str) -> TargetConfig:
    family = hf.get("model_type")
    if family in MULTIMODAL:  # the multimodal config: its language model is the target
        hf, family = _language_model(hf, family), MULTIMODAL[family][0]
    family = ALIASES.get(family, family)
    if family not in READERS:
        raise ConfigError(
            f"model_type {family!r} is not supported; supported families: {', '.join(SUPPORTED_FAMILIES)}"
        )
    quant = hf.get("quantization_config")
    if quant:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else "?"
        raise ConfigError(
            f"config.json has quantization_config (quant_method {method!r}): quantised weights are not "
            "read; save a bfloat16 copy with transformers (for mxfp4: from_pretrained(..., "
            "quantization_config=Mxfp4Config(dequantize=True)) then save_pretrained) and convert that"
        )
    if (
        family not in ("gemma3_text", "gemma4_text") and hf.get("hidden_act", "silu") != "silu"
    ):  # Gemma's checks its own
        raise ConfigError(f"hidden_act {hf['hidden_act']!r} is not supported (only 'silu')")
    if hf.get("mlp_bias", False):
        raise ConfigError("mlp_bias=true is not supported")
    hf = {**DEFAULTS.get(family, {}), **hf}
    read, family = READERS[family], family.removesuffix("_text")
    return TargetConfig(family=family, dtype=dtype, **read(hf, family))


def _language_model(hf: dict[str, Any], family: str) -> dict[str, Any]:
    """A multimodal ``config.json`` (Qwen3.5, Gemma 3, Kimi-K2.5): its ``text_config``, as a config of
    the text model_type in ``MULTIMODAL``. transformers ties the head by the top-level flag (its default
    there too); a top-level quantisation applies to the whole."""
    text = hf.get("text_config")
    if not isinstance(text, dict):
        raise ConfigError(f"{family} config.json has no text_config object")
    if family == "gemma3":  # Gemma3ForConditionalGeneration's head has no soft-cap, whatever text_config says
        text = {**text, "final_logit_softcapping": None}
    return {
        **text,
        "tie_word_embeddings": hf.get("tie_word_embeddings", MULTIMODAL[family][1]),
        "model_type": MULTIMODAL[family][0],
        "quantization_config": hf.get("quantization_config") or text.get("quantization_config"),
    }


# ----------------------------------------------------------------------------- the families
#
# A reader takes the config dict and the family's name and returns the ``TargetConfig`` fields
# other than ``family`` and ``dtype``.


def _dense(hf: dict[str, Any], family: str) -> dict[str, Any]:
    """Llama, Qwen2 and Qwen3: full attention, one SwiGLU per layer."""
    num_layers, _ = _layers(hf, family)
    rope, heads = _rope(hf), _heads(hf)
    fields = {**rope, **_shape(hf, num_layers, heads), "intermediate_size": int(hf["intermediate_size"])}
    if family == "qwen2":  # Qwen2 biases q, k, v only
        fields.update(qkv_bias=True, o_bias=False)
    return fields | {"qk_norm": family == "qwen3"}


def _qwen3_moe(hf: dict[str, Any], family: str) -> dict[str, Any]:
    """Qwen3-MoE: Qwen3's attention; experts in the layers ``mlp_only_layers`` and
    ``decoder_sparse_step`` leave (softmax over all experts, then the top k)."""
    num_layers, _ = _layers(hf, family)
    rope, heads = _rope(hf), _heads(hf)
    experts = int(hf.get("num_experts", hf.get("num_local_experts", 128)))
    skip, step = set(hf.get("mlp_only_layers") or ()), int(hf.get("decoder_sparse_step", 1))
    moe = MoEConfig(
        num_experts=experts,
        experts_per_token=int(hf.get("num_experts_per_tok", 8)),
        intermediate_size=int(hf.get("moe_intermediate_size", 768)),
        layers=tuple(i for i in range(num_layers) if i not in skip and experts > 0 and (i + 1) % step == 0),
        norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
    )
    moe = _experts(moe)
    fields = {**rope, **_shape(hf, num_layers, heads, kv_heads=4, max_positions=32768)}
    return fields | {"intermediate_size": int(hf["intermediate_size"]), "qk_norm": True, "moe": moe}


# GptOssConfig's RoPE when config.json gives none
_GPT_OSS_YARN = dict(
    rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0, truncate=False, original_max_position_embeddings=4096
)


def _gpt_oss(hf: dict[str, Any], family: str) -> dict[str, Any]:
    """gpt-oss: sliding and full attention layers (GptOssConfig's default: sliding, full, sliding, ...),
    attention sinks, biased attention, YaRN RoPE; experts in every layer (top k of the biased router
    logits, then a softmax over those k; the clamped SwiGLU)."""

    num_layers, layer_types = _layers(hf, family, "sliding_attention", _every(2, "sliding_attention"))
    sliding = "sliding_attention" in layer_types
    if sliding and "sliding_window" in hf and not hf["sliding_window"]:
        raise ConfigError("config.json has sliding_attention layers but sliding_window is null or 0; set the window")
    rope, heads = _rope(hf, theta=150000.0, default=_GPT_OSS_YARN), _heads(hf, head_dim=64)
    moe = MoEConfig(
        num_experts=int(hf.get("num_local_experts", hf.get("num_experts", 128))),
        experts_per_token=int(hf.get("num_experts_per_tok", 4)),
        intermediate_size=int(hf.get("intermediate_size", 2880)),
        layers=tuple(range(num_layers)),
        router="topk_softmax",
        router_bias=True,
        expert_mlp="clamped_swiglu",
        swiglu_alpha=float(hf.get("swiglu_alpha", 1.702)),
        swiglu_limit=float(hf.get("swiglu_limit", 7.0)),
    )
    moe = _experts(moe)
    fields = {**rope, **_shape(hf, num_layers, heads, kv_heads=8, eps=1e-5, max_positions=131072, bias=True)}
    return fields | dict(
        intermediate_size=int(hf.get("intermediate_size", 2880)),
        layer_types=layer_types,
        sliding_window=int(hf.get("sliding_window", 128)) if sliding else 0,
        attention_sinks=True,
        moe=moe,
    )


def _qwen3_5(hf: dict[str, Any], family: str) -> dict[str, Any]:
    """Qwen3.5 and Qwen3.5-MoE (their text configs): Gated DeltaNet layers among gated full attention
    (Qwen3_5TextConfig's default: three linear layers, then a full one), partial rotary embeddings,
    zero-centred norms; Qwen3.5-MoE has experts in every layer (softmax, top k, always renormalised)
    and a gated shared expert."""

    every = _every(int(hf.get("full_attention_interval", 4)), "linear_attention")
    num_layers, layer_types = _layers(hf, family, "linear_attention", every)
    rope, heads = _rope(hf, partial=0.25), _heads(hf, head_dim=256)
    linear = LinearAttentionConfig(
        num_k_heads=int(hf.get("linear_num_key_heads", 16)),
        num_v_heads=int(hf.get("linear_num_value_heads", 32)),
        head_k_dim=int(hf.get("linear_key_head_dim", 128)),
        head_v_dim=int(hf.get("linear_value_head_dim", 128)),
        conv_kernel=int(hf.get("linear_conv_kernel_dim", 4)),
    )
    if linear.num_v_heads % linear.num_k_heads:
        raise ConfigError(
            f"linear_num_value_heads ({linear.num_v_heads}) must be a multiple of linear_num_key_heads "
            f"({linear.num_k_heads})"
        )
    rotary = heads[1] * rope["partial_rotary_factor"]
    if int(rotary) % 2:
        raise ConfigError(f"head_dim * partial_rotary_factor ({rotary}) must be even")
    fields = dict(layer_types=layer_types, linear=linear, qk_norm=True, attn_output_gate=True, norm_zero_centered=True)
    if family == "qwen3_5":
        shape = _shape(hf, num_layers, heads, kv_heads=4, max_positions=32768)
        return {**rope, **shape, **fields, "intermediate_size": int(hf["intermediate_size"])}
    moe = MoEConfig(
        num_experts=int(hf.get("num_experts", 256)),
        experts_per_token=int(hf.get("num_experts_per_tok", 8)),
        intermediate_size=int(hf.get("moe_intermediate_size", 512)),
        layers=tuple(range(num_layers)),
        norm_topk_prob=True,
        shared_expert_size=int(hf.get("shared_expert_intermediate_size", 512)),
    )
    fields |= {"intermediate_size": moe.intermediate_size, "moe": _experts(moe)}  # the dense width is unused
    return {**rope, **_shape(hf, num_layers, heads, kv_heads=2, max_positions=32768), **fields}


def _gemma3(hf: dict[str, Any], family: str) -> dict[str, Any]:
    """Gemma 3 (its text config, ``Gemma3TextConfig``): sliding-window layers (every sixth layer
    global by default) with their own plain RoPE (``rope_local_base_freq``, 10000) and global layers
    with theirs (``rope_theta`` 1e6, optionally linearly scaled); GeGLU; q/k norms; zero-centred
    RMSNorms, one more around each sublayer's output; embeddings times sqrt(hidden_size); attention
    scaled by ``query_pre_attn_scalar ** -0.5``; a tied head. ``attn_logit_softcapping`` is read by
    transformers' config but not used by its Gemma 3 attention, so not here either."""
    act = hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"
    if act != "gelu_pytorch_tanh":
        raise ConfigError(f"hidden_activation {act!r} is not supported for gemma3 (only 'gelu_pytorch_tanh')")
    if hf.get("use_bidirectional_attention"):
        raise ConfigError("use_bidirectional_attention=true is an encoder's setting; a decoding target is causal")

    every = _every(int(hf.get("sliding_window_pattern") or hf.get("_sliding_window_pattern") or 6), "sliding_attention")
    num_layers, layer_types = _layers(hf, family, "sliding_attention", every)
    params = hf.get("rope_parameters") or {}
    nested = "full_attention" in params or "sliding_attention" in params  # transformers 5: one set per layer type
    full = dict(params.get("full_attention") or {}) if nested else {}
    local = dict(params.get("sliding_attention") or {}) if nested else {}
    if not nested:  # transformers 4.x: rope_theta (+ rope_scaling) global, rope_local_base_freq local
        full = {"rope_theta": hf.get("rope_theta", 1_000_000.0), **(hf.get("rope_scaling") or {})}
        local = {"rope_theta": hf.get("rope_local_base_freq", 10_000.0)}
    if local.get("rope_type", local.get("type", "default")) != "default":
        kind = local.get("rope_type", local.get("type"))
        raise ConfigError(f"gemma3 sliding layers' rope type {kind!r} is not supported (only 'default')")
    rope = _rope({"rope_parameters": full}, theta=1_000_000.0)
    heads = _heads(hf, head_dim=256)
    sliding = "sliding_attention" in layer_types
    shape = _shape(hf, num_layers, heads, kv_heads=4, max_positions=131072, tie=True)
    return {
        **rope,
        **shape,
        "intermediate_size": int(hf.get("intermediate_size", 9216)),
        "layer_types": layer_types,
        "sliding_window": int(hf.get("sliding_window") or 4096) if sliding else 0,
        "local_rope_theta": float(local.get("rope_theta", 10_000.0)) if sliding else 0.0,
        "qk_norm": True,
        "norm_zero_centered": True,
        "mlp_activation": "gelu_tanh",
        "sandwich_norms": True,
        "embed_scale": True,
        "attn_scale": float(hf.get("query_pre_attn_scalar", 256)) ** -0.5,
        "final_logit_softcap": float(hf.get("final_logit_softcapping") or 0.0),
    }


def _gemma4(hf: dict[str, Any], family: str) -> dict[str, Any]:
    """Gemma 4 (its text config, ``Gemma4TextConfig``): Gemma 3's layer (GeGLU, q/k norms, norms around
    each sublayer, scaled embeddings) with weights applied as stored, attention unscaled (the q/k norms
    set it), values normed without a weight; full-attention layers (the last one always) with their own
    head size and key/value heads (``global_head_dim`` / ``num_global_key_value_heads``, or
    ``per_layer_config``), keys equal to values where ``attention_k_eq_v``, and "proportional" RoPE;
    the last ``num_kv_shared_layers`` layers reusing earlier keys and values; per-layer embeddings;
    a learned scalar per layer; optionally experts beside each MLP (``enable_moe_block``)."""
    act = hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"
    if act != "gelu_pytorch_tanh":
        raise ConfigError(f"hidden_activation {act!r} is not supported for gemma4 (only 'gelu_pytorch_tanh')")
    if hf.get("use_bidirectional_attention") == "all":
        raise ConfigError("use_bidirectional_attention='all' is an encoder's setting; a decoding target is causal")

    num_layers, layer_types = _layers(hf, family, "sliding_attention", _every(6, "sliding_attention"))
    if layer_types and layer_types[-1] != "full_attention":  # as Gemma4TextConfig: the last layer is global
        layer_types = (*layer_types[:-1], "full_attention")
    params = hf.get("rope_parameters") or {}
    full = dict(params.get("full_attention") or {"rope_type": "proportional", "partial_rotary_factor": 0.25})
    local = dict(params.get("sliding_attention") or {"rope_type": "default"})
    if local.get("rope_type", "default") != "default" or full.get("rope_type", "default") not in (
        "default",
        "proportional",
    ):
        raise ConfigError(f"gemma4 rope types {local.get('rope_type')!r} / {full.get('rope_type')!r} are not supported")
    if full.get("factor", 1.0) != 1.0:
        raise ConfigError(f"gemma4 global RoPE factor {full['factor']} is not supported (only 1)")
    proportion = float(full.get("partial_rotary_factor", 1.0)) if full.get("rope_type") == "proportional" else 0.0
    heads = _heads(hf, head_dim=256)
    kv_heads = int(hf.get("num_key_value_heads") or 4)
    kinds = layer_types or ("full_attention",) * num_layers  # () when every layer is full
    overrides = {}  # transformers 5's per_layer_config, or the released global_head_dim / num_global_key_value_heads
    for layer, fields in (hf.get("per_layer_config") or {}).items():
        if kinds[int(layer)] != "full_attention":
            raise ConfigError(f"per_layer_config for layer {layer}: only full-attention layers may differ")
        overrides.setdefault("head_dim", set()).add(int(fields.get("head_dim", heads[1])))
        overrides.setdefault("kv", set()).add(int(fields.get("num_key_value_heads", kv_heads)))
    if len(overrides.get("head_dim", ())) > 1 or len(overrides.get("kv", ())) > 1:
        raise ConfigError("per_layer_config gives full-attention layers different shapes; one shape is supported")
    k_eq_v = bool(hf.get("attention_k_eq_v", False))
    if "per_layer_config" in hf:  # as Gemma4TextConfig: it then ignores global_head_dim and
        # num_global_key_value_heads (transformers writes {} where the full layers are like the others)
        global_head_dim = next(iter(overrides["head_dim"])) if overrides else heads[1]
        global_kv = next(iter(overrides["kv"])) if overrides else 0
    else:  # the released configs: global_head_dim, and num_global_key_value_heads only with attention_k_eq_v
        global_head_dim = int(hf.get("global_head_dim") or 512)
        global_kv = int(hf.get("num_global_key_value_heads") or 0) if k_eq_v else 0
    shared = int(hf.get("num_kv_shared_layers", 0))
    if shared and {t for t in layer_types[: num_layers - shared]} != set(layer_types):
        raise ConfigError(
            "num_kv_shared_layers leaves a layer kind with no earlier layer to share keys and values from"
        )
    moe = None
    if hf.get("enable_moe_block"):
        moe = MoEConfig(
            num_experts=int(hf["num_experts"]),
            experts_per_token=int(hf["top_k_experts"]),
            intermediate_size=int(hf["moe_intermediate_size"]),
            layers=tuple(range(num_layers)),
            router="scaled_softmax",
            expert_mlp="geglu",
        )
        moe = _experts(moe)
    per_layer = int(hf.get("hidden_size_per_layer_input", 256) or 0)
    rope = _rope({"rope_parameters": {**full, "rope_type": "default"}}, theta=1_000_000.0, partial=1.0)
    rope["partial_rotary_factor"] = 1.0  # the proportion is rope_proportion's (another rule)
    shape = _shape(hf, num_layers, heads, kv_heads=4, max_positions=131072, tie=True)
    return {
        **rope,
        **shape,
        "intermediate_size": int(hf.get("intermediate_size", 9216)),
        "layer_types": layer_types,
        "sliding_window": int(hf.get("sliding_window") or 512),
        "local_rope_theta": float(local.get("rope_theta", 10_000.0)),
        "rope_proportion": proportion,
        "qk_norm": True,
        "mlp_activation": "gelu_tanh",
        "sandwich_norms": True,
        "embed_scale": True,
        "attn_scale": 1.0,
        "final_logit_softcap": float(hf.get("final_logit_softcapping") or 0.0),
        "global_head_dim": global_head_dim,
        "global_kv_heads": global_kv,
        "k_eq_v": k_eq_v,
        "v_norm": True,
        "kv_shared_layers": shared,
        "per_layer_input": per_layer,
        "per_layer_vocab": int(hf.get("vocab_size_per_layer_input", 262144)) if per_layer else 0,
        "layer_scalar": True,
        "double_wide_mlp": bool(hf.get("use_double_wide_mlp", False)),
        "norm_product_f32": True,
        "moe": moe,
    }


def _deepseek_v3(hf: dict[str, Any], family: str) -> dict[str, Any]:
    """DeepSeek-V3 (and Kimi-K2's language model), ``DeepseekV3Config``: multi-head latent attention in
    every layer (``LatentConfig``; the query through ``q_lora_rank`` unless it is null), scores scaled by
    ``qk_head_dim ** -0.5`` times YaRN's ``mscale_all_dim`` factor squared; dense SwiGLU layers first
    (``first_k_dense_replace``), then experts with the sigmoid, group-limited router and ungated shared
    experts. The multi-token-prediction layers past ``num_hidden_layers`` are not part of the target."""
    num_layers, _ = _layers(hf, family)
    rope = _rope(hf)
    q_lora = hf["q_lora_rank"] if "q_lora_rank" in hf else 1536  # null: a plain q_proj
    latent = LatentConfig(
        q_lora_rank=int(q_lora or 0),
        kv_lora_rank=int(hf.get("kv_lora_rank", 512)),
        qk_nope_head_dim=int(hf.get("qk_nope_head_dim", 128)),
        qk_rope_head_dim=int(hf.get("qk_rope_head_dim", 64)),
        v_head_dim=int(hf.get("v_head_dim") or 128),
        rope_interleave=bool(hf.get("rope_interleave", True)),
    )
    if latent.qk_rope_head_dim % 2:
        raise ConfigError(f"qk_rope_head_dim ({latent.qk_rope_head_dim}) must be even")
    scale = (latent.qk_nope_head_dim + latent.qk_rope_head_dim) ** -0.5
    yarn = dict(rope["yarn"] or ())
    if yarn.get("mscale_all_dim") and yarn["factor"] > 1:  # as transformers' yarn_apply_mscale
        scale *= (0.1 * yarn["mscale_all_dim"] * math.log(yarn["factor"]) + 1.0) ** 2
    heads = int(hf.get("num_attention_heads", 128))
    shape = _shape(hf, num_layers, (heads, latent.qk_rope_head_dim), kv_heads=heads, max_positions=4096)
    return {
        **rope,
        **shape,
        "num_kv_heads": heads,  # unused by MLA (one latent a token); the query heads, as transformers' default
        "intermediate_size": int(hf.get("intermediate_size", 18432)),
        "latent": latent,
        "attn_scale": scale,
        "moe": _grouped_experts(hf, num_layers, experts=256, width=2048, first_dense=3, scaling=2.5, groups=(8, 4)),
    }


def _glm4_moe(hf: dict[str, Any], family: str) -> dict[str, Any]:
    """GLM-4.5 (``Glm4MoeConfig``): grouped-query attention with partial RoPE (half the head by default),
    optional q/k norms, q/k/v biases where ``attention_bias`` (never on ``o_proj``); dense SwiGLU layers
    first, then DeepSeek-V3's router and shared experts."""
    num_layers, _ = _layers(hf, family)
    rope, heads = _rope(hf, partial=0.5), _heads(hf)
    if int(heads[1] * rope["partial_rotary_factor"]) % 2:
        raise ConfigError(f"head_dim * partial_rotary_factor ({heads[1] * rope['partial_rotary_factor']}) must be even")
    shape = _shape(hf, num_layers, heads, kv_heads=8, eps=1e-5, max_positions=131072)
    return {
        **rope,
        **shape,
        "o_bias": False,
        "qk_norm": bool(hf.get("use_qk_norm", False)),
        "intermediate_size": int(hf.get("intermediate_size", 10944)),
        "moe": _grouped_experts(hf, num_layers, experts=128, width=1408, first_dense=1, scaling=1.0, groups=(1, 1)),
    }


def _grouped_experts(
    hf: dict[str, Any], num_layers: int, experts: int, width: int, first_dense: int, scaling: float, groups: tuple
) -> MoEConfig | None:
    """The experts of DeepSeek-V3 and GLM-4.5 (``DeepseekV3MoE``, ``Glm4MoeMoE``): in the layers from
    ``first_k_dense_replace`` on, the sigmoid group-limited router (``target.group_limited_topk``) and
    ``n_shared_experts`` ungated shared experts; the arguments are the family's defaults."""
    moe = MoEConfig(
        num_experts=int(hf.get("n_routed_experts", experts)),
        experts_per_token=int(hf.get("num_experts_per_tok", 8)),
        intermediate_size=int(hf.get("moe_intermediate_size", width)),
        layers=tuple(range(int(hf.get("first_k_dense_replace", first_dense)), num_layers)),
        router="sigmoid_group",
        norm_topk_prob=bool(hf.get("norm_topk_prob", True)),
        shared_expert_size=int(hf.get("n_shared_experts", 1)) * int(hf.get("moe_intermediate_size", width)),
        shared_expert_gated=False,
        num_groups=int(hf.get("n_group", groups[0]) or 1),  # null: one group
        topk_groups=int(hf.get("topk_group", groups[1]) or 1),
        routed_scaling=float(hf.get("routed_scaling_factor", scaling)),
    )
    if moe.num_experts % moe.num_groups or not 1 <= moe.topk_groups <= moe.num_groups:
        raise ConfigError(
            f"n_group ({moe.num_groups}) must divide n_routed_experts ({moe.num_experts}) and topk_group "
            f"({moe.topk_groups}) be between 1 and n_group"
        )
    if moe.experts_per_token > moe.topk_groups * (moe.num_experts // moe.num_groups):
        raise ConfigError(
            f"num_experts_per_tok ({moe.experts_per_token}) exceeds the experts of topk_group groups "
            f"({moe.topk_groups} x {moe.num_experts // moe.num_groups})"
        )
    return _experts(moe)


def _no_sliding_window(reader: Callable[[dict, str], dict]) -> Callable[[dict, str], dict]:
    """The Qwen families: ``use_sliding_window=true`` is refused (their sliding window is not implemented)."""

    def read(hf: dict[str, Any], family: str) -> dict[str, Any]:
        if hf.get("use_sliding_window", False):
            raise ConfigError(
                f"{family} config has use_sliding_window=true; sliding-window attention in this target "
                "is not implemented (set it to false only if the model never runs past its window)"
            )
        return reader(hf, family)

    return read


# model_type -> reader. qwen3_5 and qwen3_5_moe are the multimodal configs: ``_read`` first turns them into
# their text_config (model_type qwen3_5_text, qwen3_5_moe_text), the target
READERS: dict[str, Callable[[dict, str], dict]] = {
    "llama": _dense,
    "qwen2": _no_sliding_window(_dense),
    "qwen3": _no_sliding_window(_dense),
    "qwen3_moe": _no_sliding_window(_qwen3_moe),
    "gpt_oss": _gpt_oss,
    "qwen3_5": _no_sliding_window(_qwen3_5),
    "qwen3_5_text": _no_sliding_window(_qwen3_5),
    "qwen3_5_moe": _no_sliding_window(_qwen3_5),
    "qwen3_5_moe_text": _no_sliding_window(_qwen3_5),
    "gemma3": _gemma3,
    "gemma3_text": _gemma3,
    "gemma4": _gemma4,
    "gemma4_text": _gemma4,
    "deepseek_v3": _deepseek_v3,
    "glm4_moe": _glm4_moe,
}
SUPPORTED_FAMILIES = tuple(dict.fromkeys([*READERS, *MULTIMODAL, *ALIASES]))


# ----------------------------------------------------------------------------- shared pieces


def _layers(
    hf: dict[str, Any], family: str, kind: str | None = None, default: Callable[[int], tuple] | None = None
) -> tuple[int, tuple[str, ...]]:
    """``(num_hidden_layers, layer_types)``; ``layer_types`` is ``()`` when every layer is full
    attention. ``kind``: the family's other kind of layer, if any (``"sliding_attention"``,
    ``"linear_attention"``); ``default(num_layers)``: the family's ``layer_types`` where config.json
    has none."""
    num_layers = int(hf["num_hidden_layers"])
    layer_types = tuple(hf.get("layer_types") or ())
    if default is not None and not layer_types:
        layer_types = default(num_layers)
    allowed = {"full_attention", *([kind] if kind else [])}
    if set(layer_types) - allowed:
        raise ConfigError(f"layer_types {sorted(set(layer_types))} not supported for {family}; only {sorted(allowed)}")
    if layer_types and len(layer_types) != num_layers:
        raise ConfigError(f"layer_types has {len(layer_types)} entries for num_hidden_layers={num_layers}")
    return num_layers, layer_types if set(layer_types) - {"full_attention"} else ()


def _every(k: int, kind: str) -> Callable[[int], tuple[str, ...]]:
    """A family's default ``layer_types``: every ``k``-th layer full attention, the others ``kind``."""
    return lambda n: tuple(kind if (i + 1) % k else "full_attention" for i in range(n))


def _rope(
    hf: dict[str, Any], theta: float = 10000.0, default: dict | None = None, partial: float | None = None
) -> dict[str, Any]:
    """The RoPE fields (``rope_theta``, ``rope_scaling``, ``yarn``, ``partial_rotary_factor``) of every
    family, from transformers 5's ``rope_parameters`` or 4.x's top-level ``rope_theta`` and
    ``rope_scaling`` (which wins where both are given). ``theta``: the family's default base;
    ``default``: its RoPE parameters where config.json gives none; ``partial``: its default
    ``partial_rotary_factor``, None where only 1 is supported. Types: ``default``, ``linear``, ``llama3``,
    ``yarn``."""
    rope = dict(hf.get("rope_parameters") or {})
    legacy = hf.get("rope_scaling")
    if legacy:
        rope.update(legacy)
    if default and not hf.get("rope_parameters") and not legacy:
        rope = dict(default)
    theta = float(rope.get("rope_theta", hf.get("rope_theta", theta)))
    if legacy and "rope_type" not in legacy and "type" not in legacy:
        raise ConfigError(f"rope_scaling {legacy} has no rope_type; supported: 'default', 'linear', 'llama3', 'yarn'")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    factor = float(
        rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0 if partial is None else partial))
    )
    if factor != 1.0 and partial is None:
        raise ConfigError("partial_rotary_factor != 1 is not supported outside Qwen3.5 and GLM-4.5")
    scaling = yarn = None
    if rope_type == "llama3":
        keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        missing = [k for k in keys if k not in rope]
        if missing:
            raise ConfigError(f"llama3 rope scaling is missing {missing}")
        scaling = tuple(sorted((k, float(rope[k])) for k in keys))
    elif rope_type == "linear":
        if "factor" not in rope:
            raise ConfigError("linear rope scaling needs 'factor'")
        scaling = (("factor", float(rope["factor"])),)
    elif rope_type == "yarn":
        if "factor" not in rope or "original_max_position_embeddings" not in rope:
            raise ConfigError("yarn rope scaling needs 'factor' and 'original_max_position_embeddings'")
        keys = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "truncate")
        keys += ("attention_factor", "mscale", "mscale_all_dim")
        if "truncate" in rope:  # present but null reads as false in transformers
            rope["truncate"] = bool(rope["truncate"])
        yarn = tuple(sorted((k, float(rope[k])) for k in keys if rope.get(k) is not None))
    elif rope_type != "default":
        raise ConfigError(f"rope type {rope_type!r} is not supported; supported: 'default', 'linear', 'llama3', 'yarn'")
    return dict(rope_theta=theta, rope_scaling=scaling, yarn=yarn, partial_rotary_factor=factor)


def _heads(hf: dict[str, Any], head_dim: int | None = None) -> tuple[int, int]:
    """``(num_attention_heads, head_dim)``; ``head_dim``: the family's default, ``hidden_size //
    num_attention_heads`` when None."""
    heads = int(hf["num_attention_heads"])
    return heads, int(hf.get("head_dim") or head_dim or hf["hidden_size"] // heads)


def _shape(
    hf: dict[str, Any],
    num_layers: int,
    heads: tuple[int, int],
    kv_heads: int | None = None,
    eps: float = 1e-6,
    max_positions: int = 4096,
    bias: bool = False,
    tie: bool = False,
) -> dict[str, Any]:
    """The fields every family reads alike. ``heads``: from ``_heads``; the others are the family's
    defaults (``kv_heads``: the number of heads when None; ``tie``: ``tie_word_embeddings``)."""
    heads, head_dim = heads
    bias = bool(hf.get("attention_bias", bias))
    return dict(
        vocab_size=int(hf["vocab_size"]),
        hidden_size=int(hf["hidden_size"]),
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or kv_heads or heads),
        head_dim=head_dim,
        rms_norm_eps=float(hf.get("rms_norm_eps", eps)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", tie)),
        max_position_embeddings=int(hf.get("max_position_embeddings", max_positions)),
        qkv_bias=bias,
        o_bias=bias,
    )


def _experts(moe: MoEConfig) -> MoEConfig | None:
    """``moe`` checked; None where no layer has experts."""
    if moe.layers and not 1 <= moe.experts_per_token <= moe.num_experts:
        raise ConfigError(
            f"num_experts_per_tok ({moe.experts_per_token}) must be between 1 and the number of experts "
            f"({moe.num_experts})"
        )
    return moe if moe.layers else None


# ----------------------------------------------------------------------------- weight names


def param_names(cfg: TargetConfig, present: Collection[str] = ()) -> dict[str, tuple]:
    """Map each HF tensor name to (our param path, transpose?[, piece]), for the checkpoint layout the
    tensor names ``present`` show: PyTorch ``Linear`` weights are ``[out, in]`` (transpose swaps the
    last two axes). ``piece``, where present, is the index (ints and slices) of the part of our
    parameter the tensor fills: Qwen3-MoE checkpoints store each expert's ``gate_proj`` /
    ``up_proj`` / ``down_proj`` as its own tensor, which we stack into ``gate_up`` ``[E, d, 2F]`` and
    ``down`` ``[E, F, d]``; in transformers 5's in-memory layout (which
    ``save_pretrained(save_original_format=False)`` writes; read where ``present`` has
    ``mlp.experts.gate_up_proj``) they are ``mlp.experts.gate_up_proj`` ``[E, 2F, d]`` (gate first)
    and ``mlp.experts.down_proj`` ``[E, d, F]``. gpt-oss stores them stacked already, ``[in, out]``.
    The language model's tensors live under ``model.``, or ``model.language_model.`` in Qwen3.5's and
    Gemma 3's multimodal checkpoints (``language_model.model.`` and ``language_model.lm_head`` as
    transformers 4.x saved Gemma 3; read where ``present`` has such names). Gemma's four norms a layer:
    ``input_layernorm`` (ours ``input_norm``), ``post_attention_layernorm`` on the attention's output
    (``attn_out_norm``), ``pre_feedforward_layernorm`` (``post_attn_norm``, the norm before the MLP in
    every family) and ``post_feedforward_layernorm`` (``mlp_out_norm``). Qwen3.5's linear-attention
    layers: ``linear_attn.in_proj_{qkv,z,b,a}``, ``conv1d.weight`` ``[C, 1, K]`` (kept in that
    layout), ``dt_bias``, ``A_log``, ``norm``, ``out_proj``.

    The one place that names ``target.Target``'s parameters in Hugging Face's convention
    (``checkpoint.load_hf_params`` reads through it)."""
    fused = cfg.family != "gpt_oss" and any(n.endswith(".mlp.experts.gate_up_proj") for n in present)
    prefix, head = "model.", "lm_head.weight"
    if any(n.startswith("model.language_model.") for n in present):  # a multimodal folder
        prefix = "model.language_model."
    elif any(n.startswith("language_model.model.") for n in present):  # ... as transformers 4.x saved it
        prefix, head = "language_model.model.", "language_model.lm_head.weight"
    names: dict[str, tuple] = {f"{prefix}embed_tokens.weight": (("embedding",), False)}
    names[f"{prefix}norm.weight"] = (("final_norm", "scale"), False)
    if not cfg.tie_word_embeddings:
        names[head] = (("lm_head",), True)
    if cfg.per_layer_input:  # Gemma 4's per-layer embeddings
        names[f"{prefix}embed_tokens_per_layer.weight"] = (("per_layer_embedding",), False)
        names[f"{prefix}per_layer_model_projection.weight"] = (("per_layer_projection",), True)
        names[f"{prefix}per_layer_projection_norm.weight"] = (("per_layer_norm", "scale"), False)
    for i in range(cfg.num_layers):
        hf, ours = f"{prefix}layers.{i}.", (f"layers_{i}",)
        names[f"{hf}input_layernorm.weight"] = ((*ours, "input_norm", "scale"), False)
        if cfg.per_layer_input:  # Gemma 4
            names[f"{hf}per_layer_input_gate.weight"] = ((*ours, "per_layer_gate"), True)
            names[f"{hf}per_layer_projection.weight"] = ((*ours, "per_layer_proj"), True)
            names[f"{hf}post_per_layer_input_norm.weight"] = ((*ours, "per_layer_norm", "scale"), False)
        if cfg.layer_scalar:
            names[f"{hf}layer_scalar"] = ((*ours, "layer_scalar"), False)
        if cfg.is_moe(i) and cfg.moe.router == "scaled_softmax":  # Gemma 4's experts beside the MLP
            moe = (*ours, "moe")
            names[f"{hf}post_feedforward_layernorm_1.weight"] = ((*ours, "mlp_out_norm_1", "scale"), False)
            names[f"{hf}pre_feedforward_layernorm_2.weight"] = ((*ours, "moe_in_norm", "scale"), False)
            names[f"{hf}post_feedforward_layernorm_2.weight"] = ((*ours, "moe_out_norm", "scale"), False)
            names[f"{hf}router.proj.weight"] = ((*moe, "router"), True)
            names[f"{hf}router.scale"] = ((*moe, "router_scale"), False)
            names[f"{hf}router.per_expert_scale"] = ((*moe, "expert_scale"), False)
            names[f"{hf}experts.gate_up_proj"] = ((*moe, "gate_up"), True)
            names[f"{hf}experts.down_proj"] = ((*moe, "down"), True)
        if cfg.sandwich_norms:  # Gemma: post_attention_layernorm norms the attention's output
            names[f"{hf}post_attention_layernorm.weight"] = ((*ours, "attn_out_norm", "scale"), False)
            names[f"{hf}pre_feedforward_layernorm.weight"] = ((*ours, "post_attn_norm", "scale"), False)
            names[f"{hf}post_feedforward_layernorm.weight"] = ((*ours, "mlp_out_norm", "scale"), False)
        else:
            names[f"{hf}post_attention_layernorm.weight"] = ((*ours, "post_attn_norm", "scale"), False)
        if cfg.is_linear(i):
            names.update(_linear_attention_names(f"{hf}linear_attn.", (*ours, "linear_attn")))
        elif cfg.latent is not None:
            names.update(_latent_attention_names(cfg, f"{hf}self_attn.", (*ours, "attn")))
        else:
            names.update(_attention_names(cfg, i, f"{hf}self_attn.", (*ours, "attn")))
        if not cfg.is_moe(i) or cfg.moe.router == "scaled_softmax":
            for p in ("gate", "up", "down"):
                names[f"{hf}mlp.{p}_proj.weight"] = ((*ours, "mlp", f"{p}_proj"), True)
        elif cfg.family == "gpt_oss":
            moe = (*ours, "moe")
            names[f"{hf}mlp.router.weight"] = ((*moe, "router"), True)
            names[f"{hf}mlp.router.bias"] = ((*moe, "router_bias"), False)
            for p in ("gate_up", "down"):
                names[f"{hf}mlp.experts.{p}_proj"] = ((*moe, p), False)
                names[f"{hf}mlp.experts.{p}_proj_bias"] = ((*moe, f"{p}_bias"), False)
        elif fused:  # transformers 5's fused layout
            moe = (*ours, "moe")
            names[f"{hf}mlp.gate.weight"] = ((*moe, "router"), True)
            names[f"{hf}mlp.experts.gate_up_proj"] = ((*moe, "gate_up"), True)
            names[f"{hf}mlp.experts.down_proj"] = ((*moe, "down"), True)
        else:  # one tensor per expert and projection (the released Qwen3-MoE, DeepSeek-V3, GLM-4.5)
            moe, f, whole = (*ours, "moe"), cfg.moe.intermediate_size, slice(None)
            names[f"{hf}mlp.gate.weight"] = ((*moe, "router"), True)
            for j in range(cfg.moe.num_experts):
                expert = f"{hf}mlp.experts.{j}."
                names[f"{expert}gate_proj.weight"] = ((*moe, "gate_up"), True, (j, whole, slice(0, f)))
                names[f"{expert}up_proj.weight"] = ((*moe, "gate_up"), True, (j, whole, slice(f, 2 * f)))
                names[f"{expert}down_proj.weight"] = ((*moe, "down"), True, (j,))
        if cfg.is_moe(i) and cfg.moe.router == "sigmoid_group":
            names[f"{hf}mlp.gate.e_score_correction_bias"] = ((*ours, "moe", "router_correction"), False)
        if cfg.is_moe(i) and cfg.moe.shared_expert_size:
            shared = (*ours, "moe", "shared_expert")
            hf_shared = f"{hf}mlp.shared_expert." if cfg.moe.shared_expert_gated else f"{hf}mlp.shared_experts."
            for p in ("gate", "up", "down"):
                names[f"{hf_shared}{p}_proj.weight"] = ((*shared, f"{p}_proj"), True)
            if cfg.moe.shared_expert_gated:
                names[f"{hf}mlp.shared_expert_gate.weight"] = ((*ours, "moe", "shared_expert_gate"), True)
    return names


def is_extra(cfg: TargetConfig, name: str, present: Collection[str] = ()) -> bool:
    """Whether tensor ``name`` of a Hugging Face checkpoint is one the target does not use: rotary
    ``inv_freq`` buffers (derived from the config, saved by old transformers versions), Qwen3.5's
    vision tower and multi-token-prediction head, Gemma 3's and 4's and Kimi-K2.5's towers, Gemma 4's
    unused key/value projections of layers that share another's, and DeepSeek-V3's and GLM-4.5's
    multi-token-prediction layers (numbered past the last layer, each holding ``eh_proj``: ``present``,
    the checkpoint's tensor names, says which do)."""
    skipped = cfg.family in HYBRID_FAMILIES and name.startswith(("model.visual.", "mtp."))
    vision = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")
    skipped |= cfg.family == "gemma3" and name.startswith(vision)
    towers = ("model.vision_tower.", "model.audio_tower.", "model.embed_vision.", "model.embed_audio.")
    skipped |= cfg.family == "gemma4" and name.startswith(towers)
    shared = re.match(r".*layers\.(\d+)\.self_attn\.(k_proj|v_proj|k_norm|v_norm)\.", name)
    skipped |= bool(shared) and cfg.kv_shared_layers > 0 and cfg.kv_source(int(shared.group(1))) is not None
    kimi = ("vision_tower.", "mm_projector.", "model.vision_tower.", "model.mm_projector.")
    skipped |= cfg.family == "deepseek_v3" and name.startswith(kimi)
    if cfg.family in ("deepseek_v3", "glm4_moe"):  # multi-token-prediction layers, numbered past the last layer
        layer = re.match(r"((?:model\.|model\.language_model\.|language_model\.model\.)layers\.(\d+)\.)", name)
        # such a layer holds eh_proj (it mixes the embedding and the hidden state); a layer past the last
        # without it is one config.json does not describe, and stays an error
        skipped |= (
            layer is not None and int(layer.group(2)) >= cfg.num_layers and f"{layer.group(1)}eh_proj.weight" in present
        )
    return skipped or name.endswith("rotary_emb.inv_freq")


def _attention_names(cfg: TargetConfig, layer: int, hf: str, ours: tuple[str, ...]) -> dict[str, tuple]:
    """Grouped-query attention's tensors; Gemma 4: none for keys and values in a layer reusing another's,
    no ``v_proj`` where keys equal values."""
    own_kv = cfg.kv_source(layer) is None
    projections = "q" + ("k" if own_kv else "") + ("v" if own_kv and not _k_is_v(cfg, layer) else "") + "o"
    names = {f"{hf}{p}_proj.weight": ((*ours, f"{p}_proj"), True) for p in projections}
    if cfg.qkv_bias:
        names.update({f"{hf}{p}_proj.bias": ((*ours, f"{p}_bias"), False) for p in projections if p != "o"})
    if cfg.o_bias:
        names[f"{hf}o_proj.bias"] = ((*ours, "o_bias"), False)
    if cfg.qk_norm:
        names[f"{hf}q_norm.weight"] = ((*ours, "q_norm", "scale"), False)
        if own_kv:
            names[f"{hf}k_norm.weight"] = ((*ours, "k_norm", "scale"), False)
    if cfg.attention_sinks:
        names[f"{hf}sinks"] = ((*ours, "sinks"), False)
    return names


def _k_is_v(cfg: TargetConfig, layer: int) -> bool:
    return cfg.k_eq_v and not cfg.is_sliding(layer)


def _latent_attention_names(cfg: TargetConfig, hf: str, ours: tuple[str, ...]) -> dict[str, tuple]:
    """MLA (``target.LatentAttention``): ``q_a_proj``, ``q_a_layernorm``, ``q_b_proj`` (or ``q_proj``),
    ``kv_a_proj_with_mqa``, ``kv_a_layernorm``, ``kv_b_proj``, ``o_proj``."""
    names = {f"{hf}kv_a_proj_with_mqa.weight": ((*ours, "kv_a_proj"), True)}
    names[f"{hf}kv_a_layernorm.weight"] = ((*ours, "kv_a_norm", "scale"), False)
    names[f"{hf}kv_b_proj.weight"] = ((*ours, "kv_b_proj"), True)
    names[f"{hf}o_proj.weight"] = ((*ours, "o_proj"), True)
    if cfg.latent.q_lora_rank:
        names[f"{hf}q_a_proj.weight"] = ((*ours, "q_a_proj"), True)
        names[f"{hf}q_a_layernorm.weight"] = ((*ours, "q_a_norm", "scale"), False)
        names[f"{hf}q_b_proj.weight"] = ((*ours, "q_b_proj"), True)
    else:
        names[f"{hf}q_proj.weight"] = ((*ours, "q_proj"), True)
    if cfg.qkv_bias:
        names[f"{hf}kv_a_proj_with_mqa.bias"] = ((*ours, "kv_a_proj_bias"), False)
        if cfg.latent.q_lora_rank:
            names[f"{hf}q_a_proj.bias"] = ((*ours, "q_a_proj_bias"), False)
    if cfg.o_bias:
        names[f"{hf}o_proj.bias"] = ((*ours, "o_proj_bias"), False)
    return names


def _linear_attention_names(hf: str, ours: tuple[str, ...]) -> dict[str, tuple]:
    names = {f"{hf}{p}.weight": ((*ours, p), True) for p in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")}
    names[f"{hf}out_proj.weight"] = ((*ours, "out_proj"), True)
    names[f"{hf}conv1d.weight"] = ((*ours, "conv_weight"), False)  # [C, 1, K], kept in that layout
    names.update({f"{hf}{p}": ((*ours, p), False) for p in ("dt_bias", "A_log")})
    names[f"{hf}norm.weight"] = ((*ours, "norm"), False)
    return names
