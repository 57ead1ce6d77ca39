"""The target model in Flax linen, with an explicit KV cache: Llama, Qwen2, Qwen3 (dense),
Qwen3-MoE and gpt-oss (mixture of experts), Qwen3.5 and Qwen3.5-MoE (hybrid: Gated DeltaNet
layers, ``deltanet.py``, among gated full attention).

Read top to bottom: ``MoEConfig`` and ``TargetConfig`` (from a Hugging Face ``config.json``),
``Attention`` (grouped-query; sliding window and attention sinks for gpt-oss), ``MoE`` (router
and experts as one grouped matmul, a gated shared expert), ``DecoderLayer``, ``Target``, then the KV-cache and
parameter helpers and the Hugging Face weight-name map (``hf_param_names``).

KV cache convention: one ``(k, v)`` pair per layer, each ``[B, S, KV, D]`` with a
static maximum length ``S``; the cache slot of a token **is** its absolute
position. A forward over a block of ``T`` new tokens at positions
``p .. p+T-1`` writes slots ``p .. p+T-1`` and lets each query see slots
``<= its position``. Truncating the cache to ``n`` tokens therefore costs
nothing: later writes overwrite slots ``>= n`` before anything reads them.
Each sequence of a batch has its own positions, so sequences advance
independently.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from dflash_jax.deltanet import GatedDeltaNet, LinearState, PendingLinear, commit
from dflash_jax.errors import ConfigError
from dflash_jax.layers import RMSNorm, SwiGLU, apply_rope, attend, param, rope_inv_freq, yarn_inv_freq

Array = jax.Array
KVCache = list  # list over layers of (k, v), each [B, S, KV, D]

SUPPORTED_FAMILIES = (
    "llama",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "gpt_oss",
    "qwen3_5",
    "qwen3_5_text",
    "qwen3_5_moe",
    "qwen3_5_moe_text",
)
HYBRID_FAMILIES = ("qwen3_5", "qwen3_5_moe")  # Gated DeltaNet layers among gated full attention


@dataclasses.dataclass(frozen=True)
class MoEConfig:
    """The mixture-of-experts MLP of a target (static, hashable).

    ``router``: ``"softmax_topk"`` (Qwen3-MoE: softmax over all experts, then the top k, renormalised
    when ``norm_topk_prob``) or ``"topk_softmax"`` (gpt-oss: top k of the biased router logits, then a
    softmax over those k). ``expert_mlp``: ``"swiglu"`` (Qwen3-MoE: ``down(silu(gate) * up)``, no
    biases) or ``"clamped_swiglu"`` (gpt-oss: gate and up interleaved in one ``gate_up`` projection,
    ``gate`` clamped above at ``swiglu_limit``, ``up`` to ``+-swiglu_limit``,
    ``(up + 1) * gate * sigmoid(swiglu_alpha * gate)``, biased). ``layers``: the decoder layers that
    use experts (the others keep the dense SwiGLU of ``intermediate_size``). ``shared_expert_size``:
    when nonzero, every token also goes through one shared SwiGLU expert of that width, scaled by
    ``sigmoid(x @ shared_expert_gate)`` (Qwen3.5-MoE's ``Qwen3NextSparseMoeBlock``).
    """

    num_experts: int
    experts_per_token: int
    intermediate_size: int
    layers: tuple[int, ...]
    router: str = "softmax_topk"
    norm_topk_prob: bool = False
    router_bias: bool = False
    expert_mlp: str = "swiglu"
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    shared_expert_size: int = 0


@dataclasses.dataclass(frozen=True)
class LinearAttentionConfig:
    """Qwen3.5's Gated DeltaNet layers (``deltanet.GatedDeltaNet``): key / value heads and their sizes,
    the causal convolution's kernel."""

    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int


# num_key_value_heads when config.json leaves it out, as transformers' config classes default it
# (Llama, Qwen2, Qwen3: the number of attention heads)
_KV_HEADS_DEFAULT = {"qwen3_moe": 4, "gpt_oss": 8, "qwen3_5": 4, "qwen3_5_moe": 2}
_MAX_POSITIONS_DEFAULT = {"qwen3_moe": 32768, "gpt_oss": 131072, "qwen3_5": 32768, "qwen3_5_moe": 32768}

# Fields added after format 1: they enter a checkpoint's config hash only when they differ from
# their default, so targets converted before they existed keep their identity.
_LATER_FIELDS = (
    "layer_types",
    "sliding_window",
    "attention_sinks",
    "yarn",
    "moe",
    "linear",
    "partial_rotary_factor",
    "attn_output_gate",
    "norm_zero_centered",
)


@dataclasses.dataclass(frozen=True)
class TargetConfig:
    """Static shape and numerics of a target model (hashable: safe as a jit static arg)."""

    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: tuple[tuple[str, float], ...] | None = None  # llama3 parameters, sorted items
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    max_position_embeddings: int = 4096
    dtype: str = "float32"  # compute dtype; parameters stay as loaded
    layer_types: tuple[str, ...] = ()  # per layer "full_attention" / "sliding_attention"; () = all full
    sliding_window: int = 0  # a sliding layer's query sees the keys at positions > its own - window
    attention_sinks: bool = False  # gpt-oss: one learned sink logit per head (``layers.attend``)
    yarn: tuple[tuple[str, float], ...] | None = None  # YaRN RoPE parameters, sorted items
    moe: MoEConfig | None = None
    linear: LinearAttentionConfig | None = None  # Qwen3.5: the "linear_attention" layers' shape
    partial_rotary_factor: float = 1.0  # RoPE rotates the first head_dim * factor dims of q and k
    attn_output_gate: bool = False  # Qwen3.5: q_proj also gives a per-head gate, out *= sigmoid(gate)
    norm_zero_centered: bool = False  # Qwen3.5: every RMSNorm weight is applied as 1 + w

    def is_sliding(self, layer: int) -> bool:
        return bool(self.layer_types) and self.layer_types[layer] == "sliding_attention"

    def is_linear(self, layer: int) -> bool:
        return bool(self.layer_types) and self.layer_types[layer] == "linear_attention"

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    def is_moe(self, layer: int) -> bool:
        return self.moe is not None and layer in self.moe.layers

    def hash_fields(self) -> dict[str, Any]:
        """The fields that fix the model's function (not the compute dtype), for identity hashes."""
        fields = dataclasses.asdict(self)
        fields.pop("dtype")
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for name in _LATER_FIELDS:
            if getattr(self, name) == defaults[name]:
                fields.pop(name)
        if self.moe is not None and not self.moe.shared_expert_size:  # added after the first MoE targets
            fields["moe"].pop("shared_expert_size")
        return fields

    @property
    def compute_dtype(self):
        return jnp.dtype(self.dtype)

    @property
    def rope_scaling_dict(self) -> dict | None:
        return None if self.rope_scaling is None else dict(self.rope_scaling)

    @classmethod
    def from_hf(cls, hf: dict[str, Any], dtype: str = "float32") -> TargetConfig:
        """Read a Hugging Face ``config.json`` dict; see ``_from_hf``. Any malformed field is a ConfigError."""
        if not isinstance(hf, dict):
            raise ConfigError("config.json must hold a JSON object")
        try:
            cfg = cls._from_hf(hf, dtype)
        except ConfigError:
            raise
        except KeyError as e:
            raise ConfigError(f"config.json lacks the required field {e.args[0]!r}") from None
        except (TypeError, ValueError, ZeroDivisionError) as e:
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

    @classmethod
    def _from_hf(cls, hf: dict[str, Any], dtype: str = "float32") -> TargetConfig:
        """Read a Hugging Face ``config.json`` dict (transformers 4.x or 5.x layout).

        Defaults for fields a config may leave out are those of transformers' config class of the
        family (``Qwen3MoeConfig``, ``GptOssConfig``, ...).

        Raises:
          ConfigError: unknown ``model_type``, or a feature we do not implement
            (sliding-window attention outside gpt-oss, an unknown ``rope_scaling`` type, a non-SiLU
            activation, MLP biases, partial rotary embeddings), each named.
        """
        family = hf.get("model_type")
        if family in HYBRID_FAMILIES:  # the multimodal config: its language model is the target
            text = hf.get("text_config")
            if not isinstance(text, dict):
                raise ConfigError(f"{family} config.json has no text_config object")
            # transformers ties the head by the top-level flag; a top-level quantisation applies to the whole
            top, hf = hf, {**text, "tie_word_embeddings": hf.get("tie_word_embeddings", False)}
            hf.update(
                model_type=f"{family}_text",
                quantization_config=top.get("quantization_config") or text.get("quantization_config"),
            )
            family = f"{family}_text"
        if family not in SUPPORTED_FAMILIES:
            raise ConfigError(
                f"model_type {family!r} is not supported; supported families: {', '.join(SUPPORTED_FAMILIES)}"
            )
        gpt_oss = family == "gpt_oss"
        hybrid = family.removesuffix("_text") in HYBRID_FAMILIES
        family = family.removesuffix("_text")
        quant = hf.get("quantization_config")
        if quant:
            method = quant.get("quant_method", "?") if isinstance(quant, dict) else "?"
            raise ConfigError(
                f"config.json has quantization_config (quant_method {method!r}): quantised weights are not "
                "read; save a bfloat16 copy with transformers (for mxfp4: from_pretrained(..., "
                "quantization_config=Mxfp4Config(dequantize=True)) then save_pretrained) and convert that"
            )
        if hf.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"hidden_act {hf['hidden_act']!r} is not supported (only 'silu')")
        if hf.get("mlp_bias", False):
            raise ConfigError("mlp_bias=true is not supported")
        if family.startswith("qwen") and hf.get("use_sliding_window", False):
            raise ConfigError(
                f"{family} config has use_sliding_window=true; sliding-window attention in this target "
                "is not implemented (set it to false only if the model never runs past its window)"
            )
        num_layers = int(hf["num_hidden_layers"])
        layer_types = tuple(hf.get("layer_types") or ())
        if gpt_oss and not layer_types:  # GptOssConfig's default: sliding, full, sliding, ...
            layer_types = tuple("sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(num_layers))
        if hybrid and not layer_types:  # Qwen3_5TextConfig's default: three linear layers, then a full one
            every = int(hf.get("full_attention_interval", 4))
            layer_types = tuple("linear_attention" if (i + 1) % every else "full_attention" for i in range(num_layers))
        allowed = {"full_attention"}
        allowed |= {"sliding_attention"} if gpt_oss else {"linear_attention"} if hybrid else set()
        if set(layer_types) - allowed:
            raise ConfigError(
                f"layer_types {sorted(set(layer_types))} not supported for {family}; only {sorted(allowed)}"
            )
        if layer_types and len(layer_types) != num_layers:
            raise ConfigError(f"layer_types has {len(layer_types)} entries for num_hidden_layers={num_layers}")
        if not set(layer_types) & {"sliding_attention", "linear_attention"}:
            layer_types = ()
        elif "sliding_attention" in layer_types and "sliding_window" in hf and not hf["sliding_window"]:
            raise ConfigError(
                "config.json has sliding_attention layers but sliding_window is null or 0; set the window"
            )
        rope = dict(hf.get("rope_parameters") or {})
        legacy = hf.get("rope_scaling")
        if legacy:
            rope.update(legacy)
        if gpt_oss and not hf.get("rope_parameters") and not legacy:  # GptOssConfig's default
            rope = dict(rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0, truncate=False)
            rope["original_max_position_embeddings"] = 4096
        theta = float(rope.get("rope_theta", hf.get("rope_theta", 150000.0 if gpt_oss else 10000.0)))
        if legacy and "rope_type" not in legacy and "type" not in legacy:
            raise ConfigError(f"rope_scaling {legacy} has no rope_type; supported: 'default', 'llama3', 'yarn'")
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        partial = float(rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 0.25 if hybrid else 1.0)))
        if partial != 1.0 and not hybrid:
            raise ConfigError("partial_rotary_factor != 1 is not supported outside Qwen3.5")
        scaling = yarn = None
        if rope_type == "llama3":
            keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
            missing = [k for k in keys if k not in rope]
            if missing:
                raise ConfigError(f"llama3 rope scaling is missing {missing}")
            scaling = tuple(sorted((k, float(rope[k])) for k in keys))
        elif rope_type == "yarn":
            if "factor" not in rope or "original_max_position_embeddings" not in rope:
                raise ConfigError("yarn rope scaling needs 'factor' and 'original_max_position_embeddings'")
            keys = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "truncate")
            keys += ("attention_factor", "mscale", "mscale_all_dim")
            if "truncate" in rope:  # present but null reads as false in transformers
                rope["truncate"] = bool(rope["truncate"])
            yarn = tuple(sorted((k, float(rope[k])) for k in keys if rope.get(k) is not None))
        elif rope_type != "default":
            raise ConfigError(f"rope type {rope_type!r} is not supported; supported: 'default', 'llama3', 'yarn'")
        heads = int(hf["num_attention_heads"])
        head_dim = int(hf.get("head_dim") or (64 if gpt_oss else 256 if hybrid else hf["hidden_size"] // heads))
        linear = None
        if hybrid:
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
            if int(head_dim * partial) % 2:
                raise ConfigError(f"head_dim * partial_rotary_factor ({head_dim * partial}) must be even")
        bias = bool(hf.get("attention_bias", gpt_oss))
        moe = None
        if family == "qwen3_5_moe":  # every layer: softmax, top k, always renormalised; a gated shared expert
            moe = MoEConfig(
                num_experts=int(hf.get("num_experts", 256)),
                experts_per_token=int(hf.get("num_experts_per_tok", 8)),
                intermediate_size=int(hf.get("moe_intermediate_size", 512)),
                layers=tuple(range(num_layers)),
                norm_topk_prob=True,
                shared_expert_size=int(hf.get("shared_expert_intermediate_size", 512)),
            )
        elif family == "qwen3_moe":
            experts = int(hf.get("num_experts", hf.get("num_local_experts", 128)))
            skip, step = set(hf.get("mlp_only_layers") or ()), int(hf.get("decoder_sparse_step", 1))
            layers = tuple(i for i in range(num_layers) if i not in skip and experts > 0 and (i + 1) % step == 0)
            moe = MoEConfig(
                num_experts=experts,
                experts_per_token=int(hf.get("num_experts_per_tok", 8)),
                intermediate_size=int(hf.get("moe_intermediate_size", 768)),
                layers=layers,
                norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
            )
        elif gpt_oss:
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
        if moe is not None and moe.layers and not 1 <= moe.experts_per_token <= moe.num_experts:
            raise ConfigError(
                f"num_experts_per_tok ({moe.experts_per_token}) must be between 1 and the number of experts "
                f"({moe.num_experts})"
            )
        if moe is not None and not moe.layers:
            moe = None
        return cls(
            family=family,
            vocab_size=int(hf["vocab_size"]),
            hidden_size=int(hf["hidden_size"]),
            intermediate_size=(
                int(hf.get("intermediate_size", 2880))
                if gpt_oss
                else moe.intermediate_size  # unused: every layer has experts
                if family == "qwen3_5_moe"
                else int(hf["intermediate_size"])
            ),
            num_layers=num_layers,
            num_heads=heads,
            num_kv_heads=int(hf.get("num_key_value_heads") or _KV_HEADS_DEFAULT.get(family, heads)),
            head_dim=head_dim,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-5 if gpt_oss else 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=True if family == "qwen2" else bias,
            o_bias=False if family == "qwen2" else bias,  # Qwen2 biases q, k, v only
            qk_norm=family in ("qwen3", "qwen3_moe", *HYBRID_FAMILIES),
            max_position_embeddings=int(hf.get("max_position_embeddings", _MAX_POSITIONS_DEFAULT.get(family, 4096))),
            dtype=dtype,
            layer_types=layer_types,
            sliding_window=int(hf.get("sliding_window", 128)) if "sliding_attention" in layer_types else 0,
            attention_sinks=gpt_oss,
            yarn=yarn,
            moe=moe,
            linear=linear,
            partial_rotary_factor=partial,
            attn_output_gate=hybrid,
            norm_zero_centered=hybrid,
        )


def rope_tables(cfg: TargetConfig) -> tuple[np.ndarray, float]:
    """The target's RoPE: inverse frequencies ``[rotary_dim // 2]`` and the cos/sin scale (1 but for YaRN)."""
    if cfg.yarn is not None:
        return yarn_inv_freq(cfg.rotary_dim, cfg.rope_theta, dict(cfg.yarn))
    return rope_inv_freq(cfg.rotary_dim, cfg.rope_theta, cfg.rope_scaling_dict), 1.0


def rotate(x: Array, positions: Array, cfg: TargetConfig) -> Array:
    """RoPE on the first ``cfg.rotary_dim`` dims of ``x`` ``[B, T, N, D]``; the rest pass through
    (Qwen3.5's partial rotary embedding; its multimodal sections coincide for text positions)."""
    inv_freq, scale = rope_tables(cfg)
    r = cfg.rotary_dim
    if r == x.shape[-1]:
        return apply_rope(x, positions, inv_freq, scale)
    return jnp.concatenate([apply_rope(x[..., :r], positions, inv_freq, scale), x[..., r:]], axis=-1)


class Attention(nn.Module):
    """Causal grouped-query self-attention over a block, on top of an optional KV cache.

    ``sliding``: the query at position p sees only keys at positions > p - ``cfg.sliding_window``
    (transformers' ``sliding_window_overlay``); with ``cfg.attention_sinks`` each head has a learned
    sink logit (gpt-oss)."""

    cfg: TargetConfig
    sliding: bool = False

    @nn.compact
    def __call__(self, x: Array, positions: Array, cache: tuple[Array, Array] | None):
        cfg, dt = self.cfg, self.cfg.compute_dtype
        d, h, kv, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        zeros = nn.initializers.zeros

        def proj(name, heads, axes, width=hd):
            out = x @ param(self, f"{name}_proj", (d, heads * width), ("embed", axes)).astype(dt)
            if cfg.qkv_bias:
                out = out + param(self, f"{name}_bias", (heads * width,), (axes,), zeros).astype(dt)
            return out.reshape(*x.shape[:2], heads, width)

        if cfg.attn_output_gate:  # per head [query | gate] (Qwen3_5Attention)
            q, gate = jnp.split(proj("q", h, "heads", 2 * hd), 2, axis=-1)
        else:
            q, gate = proj("q", h, "heads"), None
        k, v = proj("k", kv, "kv_heads"), proj("v", kv, "kv_heads")
        if cfg.qk_norm:
            q = RMSNorm(cfg.rms_norm_eps, "head_dim", cfg.norm_zero_centered, name="q_norm")(q)
            k = RMSNorm(cfg.rms_norm_eps, "head_dim", cfg.norm_zero_centered, name="k_norm")(k)
        q, k = rotate(q, positions, cfg), rotate(k, positions, cfg)
        q = nn.with_logical_constraint(q, ("batch", "length", "act_heads", None))

        if cache is None:  # plain causal forward over the block itself
            keys, values, key_pos = k, v, positions
            new_cache = None
        else:  # write the block at its positions, then attend over the whole cache
            keys = write_block(cache[0], k, positions[:, 0])
            values = write_block(cache[1], v, positions[:, 0])
            keys = nn.with_logical_constraint(keys, ("batch", "cache_length", "act_kv_heads", None))
            values = nn.with_logical_constraint(values, ("batch", "cache_length", "act_kv_heads", None))
            key_pos = jnp.broadcast_to(jnp.arange(keys.shape[1]), keys.shape[:2])
            new_cache = (keys, values)
        mask = key_pos[:, None, :] <= positions[:, :, None]
        if self.sliding:
            mask &= key_pos[:, None, :] > positions[:, :, None] - cfg.sliding_window
        sinks = param(self, "sinks", (h,), ("heads",), zeros) if cfg.attention_sinks else None
        out = attend(q, keys.astype(dt), values.astype(dt), mask, sinks)
        if gate is not None:
            out = out * jax.nn.sigmoid(gate)
        out = out.reshape(*x.shape[:2], h * hd)
        out = out @ param(self, "o_proj", (h * hd, d), ("heads", "embed")).astype(dt)
        if cfg.o_bias:
            out = out + param(self, "o_bias", (d,), ("embed",), zeros).astype(dt)
        return out, new_cache


class MoE(nn.Module):
    """Mixture-of-experts MLP: route each token to ``experts_per_token`` experts, sum their outputs
    weighted by the router (Qwen3-MoE's ``Qwen3MoeSparseMoeBlock``, gpt-oss's ``GptOssMLP``).

    The experts run as one grouped matmul: the (token, choice) pairs are sorted by expert and
    ``jax.lax.ragged_dot`` multiplies each expert's rows by its weights, so the activations are
    ``[tokens * k, width]``, never ``[tokens, experts, width]``. (XLA lowers ``ragged_dot`` to a
    grouped GEMM on accelerators; its CPU backend expands it to a masked dense product, which costs
    ``experts`` times the FLOPs: fine for tests' few experts, not for a 128-expert model on CPU.)
    Parameters: ``router`` ``[d, E]`` (+ ``router_bias`` ``[E]``), ``gate_up`` ``[E, d, 2F]``
    (Qwen3-MoE: ``[gate | up]`` halves; gpt-oss: interleaved, as stored), ``down`` ``[E, F, d]``
    (+ ``gate_up_bias`` ``[E, 2F]``, ``down_bias`` ``[E, d]`` for gpt-oss); the expert axis carries
    the logical name ``expert``.
    """

    cfg: TargetConfig

    @nn.compact
    def __call__(self, x: Array) -> Array:
        moe, dt = self.cfg.moe, self.cfg.compute_dtype
        d, e, f, k = self.cfg.hidden_size, moe.num_experts, moe.intermediate_size, moe.experts_per_token
        zeros = nn.initializers.zeros
        biased = moe.expert_mlp == "clamped_swiglu"
        tokens = x.reshape(-1, d)  # [N, d]
        logits = jnp.matmul(
            tokens, param(self, "router", (d, e), ("embed", None)).astype(dt), preferred_element_type=jnp.float32
        )
        if moe.router_bias:
            logits = logits + param(self, "router_bias", (e,), (None,), zeros)
        if moe.router == "softmax_topk":
            weights, experts = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), k)
            if moe.norm_topk_prob:
                weights = weights / weights.sum(-1, keepdims=True)
        else:  # "topk_softmax"
            top, experts = jax.lax.top_k(logits, k)
            weights = jax.nn.softmax(top, axis=-1)
        weights = weights.astype(dt)  # as transformers: the routing weights in the compute dtype

        flat = experts.reshape(-1)  # [N * k], choice j of token n at n * k + j
        order = jnp.argsort(flat, stable=True)
        rows = tokens[order // k]  # [N * k, d], grouped by expert
        sizes = jnp.bincount(flat, length=e).astype(jnp.int32)
        chosen = flat[order]
        gate_up = param(self, "gate_up", (e, d, 2 * f), ("expert", "embed", "mlp")).astype(dt)
        h = jax.lax.ragged_dot(rows, gate_up, sizes)  # [N * k, 2F]
        if biased:
            h = h + param(self, "gate_up_bias", (e, 2 * f), ("expert", "mlp"), zeros).astype(dt)[chosen]
            gate, up = h[:, ::2], h[:, 1::2]
            gate = jnp.minimum(gate, moe.swiglu_limit)
            up = jnp.clip(up, -moe.swiglu_limit, moe.swiglu_limit)
            h = (up + 1) * (gate * jax.nn.sigmoid(gate * moe.swiglu_alpha))
        else:
            h = nn.silu(h[:, :f]) * h[:, f:]
        out = jax.lax.ragged_dot(h, param(self, "down", (e, f, d), ("expert", "mlp", "embed")).astype(dt), sizes)
        if biased:
            out = out + param(self, "down_bias", (e, d), ("expert", "embed"), zeros).astype(dt)[chosen]
        out = out * weights.reshape(-1)[order][:, None]
        combined = jnp.zeros_like(tokens).at[order // k].add(out)
        if moe.shared_expert_size:
            shared = SwiGLU(d, moe.shared_expert_size, dt, name="shared_expert")(x).reshape(-1, d)
            gate = jnp.matmul(tokens, param(self, "shared_expert_gate", (d, 1), ("embed", None)).astype(dt))
            combined = combined + jax.nn.sigmoid(gate) * shared
        return combined.reshape(x.shape)


class DecoderLayer(nn.Module):
    cfg: TargetConfig
    layer: int = 0

    @nn.compact
    def __call__(self, x, positions, cache, lengths=None):
        cfg = self.cfg
        norm = RMSNorm(cfg.rms_norm_eps, zero_centered=cfg.norm_zero_centered, name="input_norm")(x)
        if cfg.is_linear(self.layer):
            lin = cfg.linear
            mixer = GatedDeltaNet(
                cfg.hidden_size,
                lin.num_k_heads,
                lin.num_v_heads,
                lin.head_k_dim,
                lin.head_v_dim,
                lin.conv_kernel,
                cfg.rms_norm_eps,
                cfg.compute_dtype,
                name="linear_attn",
            )
            attn, cache = mixer(norm, cache, lengths)
        else:
            attn, cache = Attention(cfg, cfg.is_sliding(self.layer), name="attn")(norm, positions, cache)
        x = x + attn
        if cfg.is_moe(self.layer):
            mlp = MoE(cfg, name="moe")
        else:
            mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size, cfg.compute_dtype, name="mlp")
        x = x + mlp(RMSNorm(cfg.rms_norm_eps, zero_centered=cfg.norm_zero_centered, name="post_attn_norm")(x))
        return nn.with_logical_constraint(x, ("batch", "length", "act_embed")), cache


class Target(nn.Module):
    """Decoder-only LM. One parameter set per layer (unrolled): fastest on XLA CPU (NOTES.md).

    ``__call__(tokens, positions, cache=None, tap_layers=())``:
      tokens, positions: int32 ``[B, T]`` (positions are absolute; with a cache, each
        row's block occupies positions ``positions[b, 0] .. positions[b, 0] + T - 1``).
      cache: ``None`` (causal forward over the block alone) or a ``KVCache``.
      tap_layers: static tuple of 0-based decoder layer ids whose **raw outputs** are
        returned (``hidden_states[i + 1]`` in transformers' convention).
      lengths: optional int32 ``[B]`` with a cache: row ``b`` keeps only its first ``lengths[b]``
        tokens in the linear-attention layers' state (right-padded prefill), returned committed.
        Without it those layers return a ``PendingLinear`` for ``commit_cache`` (verification,
        where the kept length is known only afterwards).

    Returns ``(hidden, taps, cache)``: hidden ``[B, T, d]`` after the final norm (feed
    it to ``logits``); taps ``[B, T, len(tap_layers) * d]`` (concatenated in the order
    given) or ``None``; the updated cache (or ``None``).
    """

    cfg: TargetConfig

    def setup(self):
        cfg = self.cfg
        self.embedding = param(self, "embedding", (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"))
        if not cfg.tie_word_embeddings:
            self.lm_head = param(self, "lm_head", (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"))
        self.layers = [DecoderLayer(cfg, i, name=f"layers_{i}") for i in range(cfg.num_layers)]
        self.final_norm = RMSNorm(cfg.rms_norm_eps, zero_centered=cfg.norm_zero_centered)

    def __call__(
        self,
        tokens: Array,
        positions: Array,
        cache: KVCache | None = None,
        tap_layers: Sequence[int] = (),
        lengths: Array | None = None,
    ):
        x = self.embed(tokens)
        taps, new_cache = {}, []
        for i, layer in enumerate(self.layers):
            x, layer_cache = layer(x, positions, None if cache is None else cache[i], lengths)
            new_cache.append(layer_cache)
            if i in tap_layers:
                taps[i] = x
        tapped = jnp.concatenate([taps[i] for i in tap_layers], axis=-1) if tap_layers else None
        return self.final_norm(x), tapped, (new_cache if cache is not None else None)

    def embed(self, tokens: Array) -> Array:
        """Token embeddings ``[..., d]`` in the compute dtype."""
        x = jnp.take(self.embedding, tokens, axis=0).astype(self.cfg.compute_dtype)
        return nn.with_logical_constraint(x, ("batch", "length", "act_embed"))

    def logits(self, hidden: Array) -> Array:
        """LM head: ``[..., d]`` -> float32 ``[..., vocab]``."""
        dt = self.cfg.compute_dtype
        w = self.embedding.T if self.cfg.tie_word_embeddings else self.lm_head
        return jnp.matmul(hidden.astype(dt), w.astype(dt), preferred_element_type=jnp.float32)


def write_block(buf: Array, block: Array, start: Array) -> Array:
    """Write ``block`` ``[B, T, ...]`` into ``buf`` ``[B, S, ...]`` at per-row offsets ``start`` ``[B]``."""
    return jax.vmap(lambda b, x, s: jax.lax.dynamic_update_slice_in_dim(b, x, s, axis=0))(
        buf, block.astype(buf.dtype), start
    )


def init_cache(cfg: TargetConfig, batch: int, max_len: int, dtype=None) -> KVCache:
    """Empty cache: per attention layer a ``(k, v)`` pair of zeros ``[batch, max_len, KV, head_dim]``;
    per linear-attention layer a zero ``deltanet.LinearState``."""
    dtype = dtype or cfg.compute_dtype
    shape = (batch, max_len, cfg.num_kv_heads, cfg.head_dim)
    cache = []
    for i in range(cfg.num_layers):
        if cfg.is_linear(i):
            lin = cfg.linear
            channels = 2 * lin.num_k_heads * lin.head_k_dim + lin.num_v_heads * lin.head_v_dim
            conv = jnp.zeros((batch, lin.conv_kernel - 1, channels), dtype)
            cache.append(LinearState(conv, jnp.zeros((batch, lin.num_v_heads, lin.head_k_dim, lin.head_v_dim))))
        else:
            cache.append((jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)))
    return cache


def commit_cache(cache: list, keep: Array) -> KVCache:
    """The cache after a forward over a block, keeping row ``b``'s first ``keep[b]`` block tokens
    (``keep`` int32 ``[B]``): linear-attention layers replay them into their state
    (``deltanet.commit``); attention layers are already right (slots at or past the next position
    are overwritten before they are read). The identity for targets without linear attention."""
    return [commit(c, keep) if isinstance(c, PendingLinear) else c for c in cache]


def pad_pending(cache: list, block: int) -> list:
    """Pad the block axis of every ``PendingLinear`` to ``block`` tokens (masked: ``beta = g = 0``), so
    verify passes of different lengths return caches of one shape (``lax.switch``)."""

    def pad(c):
        if not isinstance(c, PendingLinear):
            return c
        extra = block - c.k.shape[1]

        def tail(x, axis=1):
            return jnp.pad(x, [(0, extra) if a == axis else (0, 0) for a in range(x.ndim)])

        return PendingLinear(tail(c.window), c.state, tail(c.k), tail(c.v), tail(c.g), tail(c.beta))

    return [pad(c) for c in cache]


def _variables(cfg: TargetConfig, seed: int = 0):
    """The one trace of ``Target.init`` (boxed variables with logical axis names)."""
    tokens = jnp.zeros((1, 1), jnp.int32)
    return Target(cfg).init(jax.random.PRNGKey(seed), tokens, tokens)


def init_params(cfg: TargetConfig, seed: int = 0):
    """Random parameters (plain pytree, float32) for tests and benchmarks."""
    return nn.meta.unbox(_variables(cfg, seed))["params"]


def param_shapes(cfg: TargetConfig):
    """``jax.ShapeDtypeStruct`` pytree of ``init_params(cfg)`` (traced; nothing is computed)."""
    return jax.eval_shape(lambda: init_params(cfg))


def param_logical_specs(cfg: TargetConfig):
    """Pytree of logical ``PartitionSpec`` matching ``init_params(cfg)``."""
    return nn.get_partition_spec(jax.eval_shape(lambda: _variables(cfg)))["params"]


# ----------------------------------------------------------------------------- Hugging Face names


def hf_param_names(cfg: TargetConfig, fused_experts: bool = False, prefix: str = "model.") -> dict[str, tuple]:
    """Map each HF tensor name to (our param path, transpose?[, piece]): PyTorch ``Linear`` weights are
    ``[out, in]`` (transpose swaps the last two axes). ``piece``, where present, is the index (ints and
    slices) of the part of our parameter the tensor fills: Qwen3-MoE checkpoints store each expert's
    ``gate_proj`` / ``up_proj`` / ``down_proj`` as its own tensor, which we stack into ``gate_up``
    ``[E, d, 2F]`` and ``down`` ``[E, F, d]``; with ``fused_experts`` (transformers 5's in-memory
    layout, which ``save_pretrained(save_original_format=False)`` writes) they are
    ``mlp.experts.gate_up_proj`` ``[E, 2F, d]`` (gate first) and ``mlp.experts.down_proj``
    ``[E, d, F]``. gpt-oss stores them stacked already, ``[in, out]``. ``prefix``: where the
    language model's tensors live (``model.``; ``model.language_model.`` in Qwen3.5's multimodal
    checkpoints). Qwen3.5's linear-attention layers: ``linear_attn.in_proj_{qkv,z,b,a}``,
    ``conv1d.weight`` ``[C, 1, K]`` (kept in that layout), ``dt_bias``, ``A_log``, ``norm``, ``out_proj``.

    The one place that names this module's parameters in Hugging Face's convention
    (``checkpoint.load_hf_params`` reads through it)."""
    names: dict[str, tuple] = {f"{prefix}embed_tokens.weight": (("embedding",), False)}
    names[f"{prefix}norm.weight"] = (("final_norm", "scale"), False)
    if not cfg.tie_word_embeddings:
        names["lm_head.weight"] = (("lm_head",), True)
    for i in range(cfg.num_layers):
        hf, ours = f"{prefix}layers.{i}.", (f"layers_{i}",)
        names[f"{hf}input_layernorm.weight"] = ((*ours, "input_norm", "scale"), False)
        names[f"{hf}post_attention_layernorm.weight"] = ((*ours, "post_attn_norm", "scale"), False)
        if cfg.is_linear(i):
            names.update(_linear_attention_names(f"{hf}linear_attn.", (*ours, "linear_attn")))
        else:
            names.update(_attention_names(cfg, f"{hf}self_attn.", (*ours, "attn")))
        if not cfg.is_moe(i):
            for p in ("gate", "up", "down"):
                names[f"{hf}mlp.{p}_proj.weight"] = ((*ours, "mlp", f"{p}_proj"), True)
        elif cfg.family == "gpt_oss":
            moe = (*ours, "moe")
            names[f"{hf}mlp.router.weight"] = ((*moe, "router"), True)
            names[f"{hf}mlp.router.bias"] = ((*moe, "router_bias"), False)
            for p in ("gate_up", "down"):
                names[f"{hf}mlp.experts.{p}_proj"] = ((*moe, p), False)
                names[f"{hf}mlp.experts.{p}_proj_bias"] = ((*moe, f"{p}_bias"), False)
        elif fused_experts:  # qwen3_moe, qwen3_5_moe: transformers 5's fused layout
            moe = (*ours, "moe")
            names[f"{hf}mlp.gate.weight"] = ((*moe, "router"), True)
            names[f"{hf}mlp.experts.gate_up_proj"] = ((*moe, "gate_up"), True)
            names[f"{hf}mlp.experts.down_proj"] = ((*moe, "down"), True)
        else:  # qwen3_moe: one tensor per expert and projection
            moe, f, whole = (*ours, "moe"), cfg.moe.intermediate_size, slice(None)
            names[f"{hf}mlp.gate.weight"] = ((*moe, "router"), True)
            for j in range(cfg.moe.num_experts):
                expert = f"{hf}mlp.experts.{j}."
                names[f"{expert}gate_proj.weight"] = ((*moe, "gate_up"), True, (j, whole, slice(0, f)))
                names[f"{expert}up_proj.weight"] = ((*moe, "gate_up"), True, (j, whole, slice(f, 2 * f)))
                names[f"{expert}down_proj.weight"] = ((*moe, "down"), True, (j,))
        if cfg.is_moe(i) and cfg.moe.shared_expert_size:
            shared = (*ours, "moe", "shared_expert")
            for p in ("gate", "up", "down"):
                names[f"{hf}mlp.shared_expert.{p}_proj.weight"] = ((*shared, f"{p}_proj"), True)
            names[f"{hf}mlp.shared_expert_gate.weight"] = ((*ours, "moe", "shared_expert_gate"), True)
    return names


def _attention_names(cfg: TargetConfig, hf: str, ours: tuple[str, ...]) -> dict[str, tuple]:
    names = {f"{hf}{p}_proj.weight": ((*ours, f"{p}_proj"), True) for p in "qkvo"}
    if cfg.qkv_bias:
        names.update({f"{hf}{p}_proj.bias": ((*ours, f"{p}_bias"), False) for p in "qkv"})
    if cfg.o_bias:
        names[f"{hf}o_proj.bias"] = ((*ours, "o_bias"), False)
    if cfg.qk_norm:
        names[f"{hf}q_norm.weight"] = ((*ours, "q_norm", "scale"), False)
        names[f"{hf}k_norm.weight"] = ((*ours, "k_norm", "scale"), False)
    if cfg.attention_sinks:
        names[f"{hf}sinks"] = ((*ours, "sinks"), False)
    return names


def _linear_attention_names(hf: str, ours: tuple[str, ...]) -> dict[str, tuple]:
    names = {f"{hf}{p}.weight": ((*ours, p), True) for p in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")}
    names[f"{hf}out_proj.weight"] = ((*ours, "out_proj"), True)
    names[f"{hf}conv1d.weight"] = ((*ours, "conv_weight"), False)  # [C, 1, K], kept in that layout
    names.update({f"{hf}{p}": ((*ours, p), False) for p in ("dt_bias", "A_log")})
    names[f"{hf}norm.weight"] = ((*ours, "norm"), False)
    return names
