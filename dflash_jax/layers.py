"""Building blocks shared by the target and the drafter: RMSNorm, RoPE (plain, Llama 3, YaRN), SwiGLU, attention.

All parameters are created with logical axis names (see ``sharding.py``); all
matmuls run in the module's compute ``dtype`` with float32 master weights cast
at use. Conventions follow Hugging Face Llama/Qwen exactly (``rotate_half``
RoPE, RMSNorm in float32 cast back before the weight multiply).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import flax.errors
import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

Array = jax.Array

# Additive value for masked attention logits (finite, so fully-masked rows stay NaN-free).
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)


def param(module: nn.Module, name: str, shape: Sequence[int], axes: Sequence[str | None], init=None):
    """Declare a float32 parameter carrying logical axis names ``axes``.

    When the parameter is given (``apply``), it is returned after a check of its shape against
    ``shape``; Flax's own ``Module.param`` makes that check by tracing the initializer
    (``jax.eval_shape``) at every call, which was a third of the time to trace the decoding loop of
    a 30-layer target (docs/BENCHMARKS.md "Start-up").

    Raises:
      flax.errors.ScopeParamShapeError: the given parameter's shape is not ``shape``.
    """
    if module.has_variable("params", name):
        value = nn.meta.unbox(module.get_variable("params", name))
        if np.shape(value) != tuple(shape):
            raise flax.errors.ScopeParamShapeError(name, module.scope.path_text, np.shape(value), tuple(shape))
        return value
    init = init or nn.initializers.normal(0.02)
    return module.param(name, nn.with_logical_partitioning(init, tuple(axes)), tuple(shape), jnp.float32)


class RMSNorm(nn.Module):
    """RMSNorm over the last axis: float32 statistics, cast back, then ``* weight``.

    Matches ``LlamaRMSNorm`` / ``Qwen3RMSNorm`` in transformers; ``zero_centered``: Qwen3.5's and Gemma
    3's (the weight stored as w, applied as 1 + w, the product in float32); ``product_f32``: Gemma 4's
    (the weight applied as stored, the product in float32); ``scaled=False``: no weight at all (Gemma 4's
    value norm).
    """

    eps: float
    axis_name: str = "norm"
    zero_centered: bool = False
    product_f32: bool = False
    scaled: bool = True

    @nn.compact
    def __call__(self, x: Array) -> Array:
        dtype = x.dtype
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        if not self.scaled:
            return x32.astype(dtype)
        init = nn.initializers.zeros if self.zero_centered else nn.initializers.ones
        scale = param(self, "scale", (x.shape[-1],), (self.axis_name,), init)
        if self.zero_centered:  # one rounding, as Qwen3_5RMSNorm and Gemma3RMSNorm
            return (x32 * (1.0 + scale.astype(jnp.float32))).astype(dtype)
        if self.product_f32:
            return (x32 * scale.astype(jnp.float32)).astype(dtype)
        return scale.astype(dtype) * x32.astype(dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None = None) -> np.ndarray:
    """Inverse RoPE frequencies, float32 ``[head_dim // 2]``.

    ``scaling`` is ``None`` (plain RoPE), a Llama-3 dict with ``factor``, ``low_freq_factor``,
    ``high_freq_factor``, ``original_max_position_embeddings`` (the ``llama3`` rope type of
    transformers' ``modeling_rope_utils``), or ``{"factor": f}`` alone (its ``linear`` type, Gemma 3's
    global layers: every frequency divided by ``f``).
    """
    inv = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim))
    inv = inv.astype(np.float32)
    if scaling is None:
        return inv
    if set(scaling) == {"factor"}:  # linear position interpolation
        return (inv / np.float32(scaling["factor"])).astype(np.float32)
    factor = float(scaling["factor"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_ctx = float(scaling["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def yarn_inv_freq(head_dim: int, theta: float, yarn: dict) -> tuple[np.ndarray, float]:
    """YaRN RoPE (arXiv:2309.00071): inverse frequencies float32 ``[head_dim // 2]`` and the cos/sin scale.

    ``yarn`` holds ``factor``, ``original_max_position_embeddings`` and optionally ``beta_fast``
    (32), ``beta_slow`` (1), ``truncate`` (1.0 = true), ``attention_factor``, ``mscale``,
    ``mscale_all_dim``, with the meanings and defaults of the ``yarn`` rope type in transformers'
    ``modeling_rope_utils`` (gpt-oss: factor 32, betas 32 / 1, not truncated).
    """
    factor, old_ctx = float(yarn["factor"]), float(yarn["original_max_position_embeddings"])

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    scale = yarn.get("attention_factor")
    if scale is None:
        m, m_all = yarn.get("mscale"), yarn.get("mscale_all_dim")
        scale = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)

    def correction_dim(rotations: float) -> float:
        return head_dim * math.log(old_ctx / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(float(yarn.get("beta_fast") or 32)), correction_dim(float(yarn.get("beta_slow") or 1))
    if yarn.get("truncate", 1.0):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # as transformers: no division by zero
    ramp = np.clip((np.arange(head_dim // 2, dtype=np.float32) - low) / (high - low), 0, 1).astype(np.float32)
    pos_freqs = (theta ** (np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim)).astype(np.float32)
    extrapolate = 1 - ramp
    inv = (1.0 / (factor * pos_freqs)) * (1 - extrapolate) + (1.0 / pos_freqs) * extrapolate
    return inv.astype(np.float32), float(scale)


def apply_rope(x: Array, positions: Array, inv_freq: np.ndarray, scale: float = 1.0) -> Array:
    """Rotate ``x`` ``[B, T, N, D]`` by absolute ``positions`` ``[B, T]`` (HF ``rotate_half``).

    ``scale`` multiplies cos and sin (YaRN's attention factor; 1 for plain and Llama 3 RoPE)."""
    freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [B, T, D/2]
    emb = jnp.concatenate([freqs, freqs], axis=-1)[:, :, None, :]
    cos, sin = jnp.cos(emb), jnp.sin(emb)
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    cos, sin = cos.astype(x.dtype), sin.astype(x.dtype)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


ACTIVATIONS = {
    "silu": nn.silu,
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),  # transformers' gelu_pytorch_tanh (Gemma)
}


class SwiGLU(nn.Module):
    """``down(act(gate(x)) * up(x))``, the gated MLP of Llama/Qwen (``act`` SiLU: SwiGLU) and Gemma
    (``act`` tanh-approximated GELU: GeGLU); no biases. ``activation``: a key of ``ACTIVATIONS``."""

    hidden_size: int
    intermediate_size: int
    dtype: jnp.dtype = jnp.float32
    activation: str = "silu"

    @nn.compact
    def __call__(self, x: Array) -> Array:
        d, f = self.hidden_size, self.intermediate_size
        gate = param(self, "gate_proj", (d, f), ("embed", "mlp")).astype(self.dtype)
        up = param(self, "up_proj", (d, f), ("embed", "mlp")).astype(self.dtype)
        down = param(self, "down_proj", (f, d), ("mlp", "embed")).astype(self.dtype)
        h = ACTIVATIONS[self.activation](x @ gate) * (x @ up)
        h = nn.with_logical_constraint(h, ("batch", "length", "act_mlp"))
        return h @ down


def attend(q: Array, k: Array, v: Array, mask: Array, sinks: Array | None = None, scale: float | None = None) -> Array:
    """Grouped-query softmax attention.

    Args:
      q: ``[B, T, H, D]`` queries (not yet scaled: ``scale`` is applied here).
      k, v: ``[B, S, KV, D]`` keys and ``[B, S, KV, Dv]`` values, ``H % KV == 0``.
      mask: bool, broadcastable to ``[B, T, S]``; True where the query may see the key.
      sinks: optional ``[H]`` attention-sink logits (gpt-oss): one extra key per head that every
        query sees, with no value; it joins the softmax's denominator and is then dropped.
      scale: the logits' scale, ``1/sqrt(D)`` when None (Gemma 3: ``query_pre_attn_scalar ** -0.5``).

    Returns:
      ``[B, T, H, Dv]`` (``Dv``: the values' size, ``D`` but for MLA's latent values) in ``q.dtype``;
      logits and softmax in float32.
    """
    b, t, h, d = q.shape
    kv = k.shape[2]
    qg = q.reshape(b, t, kv, h // kv, d)
    logits = jnp.einsum("btkgd,bskd->bkgts", qg, k, preferred_element_type=jnp.float32)
    logits = logits * (1.0 / math.sqrt(d) if scale is None else scale)
    logits = jnp.where(mask[:, None, None, :, :], logits, MASK_VALUE)
    if sinks is None:
        probs = jax.nn.softmax(logits, axis=-1)
    else:
        sink = jnp.broadcast_to(sinks.astype(jnp.float32).reshape(1, kv, h // kv, 1, 1), (*logits.shape[:-1], 1))
        probs = jax.nn.softmax(jnp.concatenate([logits, sink], axis=-1), axis=-1)[..., :-1]
    probs = probs.astype(v.dtype)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, v)
    return out.reshape(b, t, h, v.shape[-1])
