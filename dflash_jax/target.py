"""The target model: a Llama / Qwen2 / Qwen3 decoder in Flax linen, with an explicit KV cache.

Read top to bottom: ``TargetConfig`` (from a Hugging Face ``config.json``),
``Attention``, ``DecoderLayer``, ``Target``, then the KV-cache and parameter helpers and
the Hugging Face weight-name map (``hf_param_names``).

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
from flax import linen as nn

from dflash_jax.errors import ConfigError
from dflash_jax.layers import RMSNorm, SwiGLU, apply_rope, attend, param, rope_inv_freq

Array = jax.Array
KVCache = list  # list over layers of (k, v), each [B, S, KV, D]

SUPPORTED_FAMILIES = ("llama", "qwen2", "qwen3")


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

        Raises:
          ConfigError: unknown ``model_type``, or a feature we do not implement
            (sliding-window attention, an unknown ``rope_scaling`` type, a non-SiLU
            activation, MLP biases, partial rotary embeddings), each named.
        """
        family = hf.get("model_type")
        if family not in SUPPORTED_FAMILIES:
            raise ConfigError(
                f"model_type {family!r} is not supported; supported families: {', '.join(SUPPORTED_FAMILIES)}"
            )
        if hf.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"hidden_act {hf['hidden_act']!r} is not supported (only 'silu')")
        if hf.get("mlp_bias", False):
            raise ConfigError("mlp_bias=true is not supported")
        if family in ("qwen2", "qwen3") and hf.get("use_sliding_window", False):
            raise ConfigError(
                f"{family} config has use_sliding_window=true; sliding-window attention in the target "
                "is not implemented (set it to false only if the model never runs past its window)"
            )
        layer_types = hf.get("layer_types")
        if layer_types and any(t != "full_attention" for t in layer_types):
            raise ConfigError(f"layer_types {sorted(set(layer_types))} not supported; only 'full_attention'")
        rope = dict(hf.get("rope_parameters") or {})
        legacy = hf.get("rope_scaling")
        if legacy:
            rope.update(legacy)
        theta = float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))
        if legacy and "rope_type" not in legacy and "type" not in legacy:
            raise ConfigError(f"rope_scaling {legacy} has no rope_type; supported: 'default', 'llama3'")
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)) != 1.0:
            raise ConfigError("partial_rotary_factor != 1 is not supported")
        scaling = None
        if rope_type == "llama3":
            keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
            missing = [k for k in keys if k not in rope]
            if missing:
                raise ConfigError(f"llama3 rope scaling is missing {missing}")
            scaling = tuple(sorted((k, float(rope[k])) for k in keys))
        elif rope_type != "default":
            raise ConfigError(f"rope type {rope_type!r} is not supported; supported: 'default', 'llama3'")
        heads = int(hf["num_attention_heads"])
        head_dim = int(hf.get("head_dim") or hf["hidden_size"] // heads)
        bias = bool(hf.get("attention_bias", False))
        return cls(
            family=family,
            vocab_size=int(hf["vocab_size"]),
            hidden_size=int(hf["hidden_size"]),
            intermediate_size=int(hf["intermediate_size"]),
            num_layers=int(hf["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(hf.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=True if family == "qwen2" else bias,
            o_bias=bias if family == "llama" else False,
            qk_norm=family == "qwen3",
            max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
            dtype=dtype,
        )


class Attention(nn.Module):
    """Causal grouped-query self-attention over a block, on top of an optional KV cache."""

    cfg: TargetConfig

    @nn.compact
    def __call__(self, x: Array, positions: Array, cache: tuple[Array, Array] | None):
        cfg, dt = self.cfg, self.cfg.compute_dtype
        d, h, kv, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        zeros = nn.initializers.zeros

        def proj(name, heads, axes):
            out = x @ param(self, f"{name}_proj", (d, heads * hd), ("embed", axes)).astype(dt)
            if cfg.qkv_bias:
                out = out + param(self, f"{name}_bias", (heads * hd,), (axes,), zeros).astype(dt)
            return out.reshape(*x.shape[:2], heads, hd)

        q, k, v = proj("q", h, "heads"), proj("k", kv, "kv_heads"), proj("v", kv, "kv_heads")
        if cfg.qk_norm:
            q = RMSNorm(cfg.rms_norm_eps, "head_dim", name="q_norm")(q)
            k = RMSNorm(cfg.rms_norm_eps, "head_dim", name="k_norm")(k)
        inv_freq = rope_inv_freq(hd, cfg.rope_theta, cfg.rope_scaling_dict)
        q, k = apply_rope(q, positions, inv_freq), apply_rope(k, positions, inv_freq)
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
        out = attend(q, keys.astype(dt), values.astype(dt), mask).reshape(*x.shape[:2], h * hd)
        out = out @ param(self, "o_proj", (h * hd, d), ("heads", "embed")).astype(dt)
        if cfg.o_bias:
            out = out + param(self, "o_bias", (d,), ("embed",), zeros).astype(dt)
        return out, new_cache


class DecoderLayer(nn.Module):
    cfg: TargetConfig

    @nn.compact
    def __call__(self, x, positions, cache):
        cfg = self.cfg
        attn, cache = Attention(cfg, name="attn")(RMSNorm(cfg.rms_norm_eps, name="input_norm")(x), positions, cache)
        x = x + attn
        mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size, cfg.compute_dtype, name="mlp")
        x = x + mlp(RMSNorm(cfg.rms_norm_eps, name="post_attn_norm")(x))
        return nn.with_logical_constraint(x, ("batch", "length", "act_embed")), cache


class Target(nn.Module):
    """Decoder-only LM. One parameter set per layer (unrolled): fastest on XLA CPU (NOTES.md).

    ``__call__(tokens, positions, cache=None, tap_layers=())``:
      tokens, positions: int32 ``[B, T]`` (positions are absolute; with a cache, each
        row's block occupies positions ``positions[b, 0] .. positions[b, 0] + T - 1``).
      cache: ``None`` (causal forward over the block alone) or a ``KVCache``.
      tap_layers: static tuple of 0-based decoder layer ids whose **raw outputs** are
        returned (``hidden_states[i + 1]`` in transformers' convention).

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
        self.layers = [DecoderLayer(cfg, name=f"layers_{i}") for i in range(cfg.num_layers)]
        self.final_norm = RMSNorm(cfg.rms_norm_eps)

    def __call__(self, tokens: Array, positions: Array, cache: KVCache | None = None, tap_layers: Sequence[int] = ()):
        x = self.embed(tokens)
        taps, new_cache = {}, []
        for i, layer in enumerate(self.layers):
            x, layer_cache = layer(x, positions, None if cache is None else cache[i])
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
    """Zero KV cache: ``num_layers`` pairs of ``[batch, max_len, KV, head_dim]``."""
    dtype = dtype or cfg.compute_dtype
    shape = (batch, max_len, cfg.num_kv_heads, cfg.head_dim)
    return [(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for _ in range(cfg.num_layers)]


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


def hf_param_names(cfg: TargetConfig) -> dict[str, tuple[tuple[str, ...], bool]]:
    """Map each HF tensor name to (our param path, transpose?): PyTorch ``Linear`` weights are ``[out, in]``.

    The one place that names this module's parameters in Hugging Face's convention
    (``checkpoint.load_hf_params`` reads through it)."""
    names: dict[str, tuple[tuple[str, ...], bool]] = {"model.embed_tokens.weight": (("embedding",), False)}
    names["model.norm.weight"] = (("final_norm", "scale"), False)
    if not cfg.tie_word_embeddings:
        names["lm_head.weight"] = (("lm_head",), True)
    for i in range(cfg.num_layers):
        hf, ours = f"model.layers.{i}.", (f"layers_{i}",)
        for p in "qkvo":
            names[f"{hf}self_attn.{p}_proj.weight"] = ((*ours, "attn", f"{p}_proj"), True)
        if cfg.qkv_bias:
            for p in "qkv":
                names[f"{hf}self_attn.{p}_proj.bias"] = ((*ours, "attn", f"{p}_bias"), False)
        if cfg.o_bias:
            names[f"{hf}self_attn.o_proj.bias"] = ((*ours, "attn", "o_bias"), False)
        if cfg.qk_norm:
            names[f"{hf}self_attn.q_norm.weight"] = ((*ours, "attn", "q_norm", "scale"), False)
            names[f"{hf}self_attn.k_norm.weight"] = ((*ours, "attn", "k_norm", "scale"), False)
        for p in ("gate", "up", "down"):
            names[f"{hf}mlp.{p}_proj.weight"] = ((*ours, "mlp", f"{p}_proj"), True)
        names[f"{hf}input_layernorm.weight"] = ((*ours, "input_norm", "scale"), False)
        names[f"{hf}post_attention_layernorm.weight"] = ((*ours, "post_attn_norm", "scale"), False)
    return names
