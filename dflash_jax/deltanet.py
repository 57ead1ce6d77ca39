"""Gated DeltaNet, the linear-attention layer of Qwen3.5 (Yang et al., "Gated Delta Networks",
arXiv:2412.06464; transformers' ``Qwen3_5GatedDeltaNet``), with a state that speculative
decoding can roll back.

Per value head the layer keeps a matrix state ``S`` ``[Dk, Dv]`` and, for each token,
decays it by ``exp(g)``, writes ``v`` at key ``k`` with strength ``beta`` (the delta rule:
``S += k (beta (v - S^T k))^T``), and reads ``S^T q``. ``gated_delta_rule`` computes that in
chunks (the WY form of the delta rule: within a chunk a unit-lower-triangular solve, across
chunks a ``lax.scan`` over the state), so prefill, verification and training are matmuls.

A token with ``beta = 0`` and ``g = 0`` leaves the state as it was. That is the whole rollback
mechanism: a forward over a block on top of a cache returns a ``PendingLinear`` (the state
before the block and the block's keys, values, gates and convolution inputs), and
``commit`` replays the first ``keep`` tokens of each row into the state (the rest masked to
``beta = g = 0``) and takes the convolution window that ends at them. Prefill commits each
row's prompt length (right padding never enters the state); a verify round commits the
accepted length (the rejected draft tokens never do).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import linen as nn

from dflash_jax.layers import param

Array = jax.Array


class LinearState(NamedTuple):
    """The committed cache of one linear-attention layer."""

    conv: Array  # [B, K - 1, C] the last K - 1 convolution inputs (q, k, v channels before the conv)
    state: Array  # [B, Hv, Dk, Dv] float32 delta-rule state


class PendingLinear(NamedTuple):
    """A linear-attention layer's cache after a block of ``T`` tokens, before ``commit`` chooses how
    many of them to keep."""

    window: Array  # [B, K - 1 + T, C] the previous conv inputs, then the block's
    state: Array  # [B, Hv, Dk, Dv] the state before the block
    k: Array  # [B, T, Hv, Dk] float32, l2-normalised
    v: Array  # [B, T, Hv, Dv] float32
    g: Array  # [B, T, Hv] float32 log decay (<= 0)
    beta: Array  # [B, T, Hv] float32 write strength in (0, 1)


def l2norm(x: Array, eps: float = 1e-6) -> Array:
    """``x / sqrt(sum(x^2) + eps)`` over the last axis (the FLA / transformers form)."""
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def gated_delta_rule(q: Array, k: Array, v: Array, g: Array, beta: Array, state: Array, chunk: int = 64):
    """The gated delta rule over a sequence, in chunks of ``chunk`` tokens.

    Args:
      q, k: float32 ``[B, T, H, Dk]`` (l2-normalised; ``q`` already scaled by ``Dk ** -0.5``).
      v: float32 ``[B, T, H, Dv]``.
      g: float32 ``[B, T, H]`` log decay per token; beta: float32 ``[B, T, H]`` write strength.
      state: float32 ``[B, H, Dk, Dv]`` the state before the first token.

    Returns ``(out [B, T, H, Dv], final state [B, H, Dk, Dv])``, both float32; equal (up to float
    rounding) to the token-by-token recurrence ``S = exp(g) S; S += k (beta (v - S^T k))^T;
    out = S^T q`` (transformers' ``torch_recurrent_gated_delta_rule``).
    """
    b, t, h, dk = k.shape
    dv = v.shape[-1]
    c = min(chunk, t)
    pad = -t % c
    n = (t + pad) // c

    def chunks(x):  # [B, T, H, ...] -> [N, B, H, C, ...] (zero padding: beta = g = 0 changes nothing)
        x = jnp.pad(x, ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2))
        x = x.reshape(b, n, c, *x.shape[2:])
        return jnp.moveaxis(jnp.moveaxis(x, 3, 2), 1, 0)

    q, k, v, g, beta = map(chunks, (q, k, v, g, beta))
    cum = jnp.cumsum(g, axis=-1)  # [N, B, H, C]
    causal = jnp.tril(jnp.ones((c, c), bool))
    decay = jnp.exp(jnp.where(causal, cum[..., :, None] - cum[..., None, :], -jnp.inf))  # [.., C(i), C(j)]
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    system = jnp.einsum("...id,...jd->...ij", k_beta, k) * decay
    lower = jnp.where(jnp.tril(jnp.ones((c, c), bool), -1), system, 0) + jnp.eye(c)

    def solve(rhs):  # (I + strictly lower part of the system)^-1 rhs
        return jax.lax.linalg.triangular_solve(lower, rhs, left_side=True, lower=True, unit_diagonal=True)

    new_v = solve(v_beta)
    k_cumdecay = solve(k_beta * jnp.exp(cum)[..., None])
    intra = jnp.einsum("...id,...jd->...ij", q, k) * decay
    q_decayed = q * jnp.exp(cum)[..., None]
    k_decayed = k * jnp.exp(cum[..., -1:] - cum)[..., None]
    chunk_decay = jnp.exp(cum[..., -1])[..., None, None]

    def step(s, xs):
        new_v, k_cumdecay, intra, q_decayed, k_decayed, chunk_decay = xs
        v_new = new_v - k_cumdecay @ s
        out = q_decayed @ s + intra @ v_new
        s = s * chunk_decay + jnp.swapaxes(k_decayed, -1, -2) @ v_new
        return s, out

    state, out = jax.lax.scan(step, state, (new_v, k_cumdecay, intra, q_decayed, k_decayed, chunk_decay))
    out = jnp.moveaxis(jnp.moveaxis(out, 0, 1), 3, 2).reshape(b, n * c, h, dv)[:, :t]
    return out, state


def causal_conv(window: Array, weight: Array) -> Array:
    """Depthwise causal convolution then SiLU: ``window`` ``[B, K - 1 + T, C]`` (the ``K - 1``
    inputs before the block, then its ``T``), ``weight`` ``[C, 1, K]`` (PyTorch ``Conv1d`` layout)
    -> ``[B, T, C]``; output ``t`` reads inputs ``t .. t + K - 1`` of the window."""
    kernel = weight.shape[-1]
    t = window.shape[1] - kernel + 1
    out = sum(window[:, j : j + t] * weight[:, 0, j] for j in range(kernel))
    return nn.silu(out)


def _kept(t: int, keep: Array) -> Array:
    """``[B, T, 1]`` float mask of each row's first ``keep[b]`` block tokens (the rest get ``beta = g = 0``)."""
    return (jnp.arange(t) < keep[:, None])[..., None].astype(jnp.float32)


def _conv_after(window: Array, keep: Array, size: int) -> Array:
    """The ``size = K - 1`` convolution inputs that end at block token ``keep[b]`` (``window``
    ``[B, K - 1 + T, C]``: the inputs before the block, then the block's)."""
    return jax.vmap(lambda w, s: jax.lax.dynamic_slice_in_dim(w, s, size, axis=0))(window, keep)


def commit(pending: PendingLinear, keep: Array) -> LinearState:
    """The layer's cache after the first ``keep[b]`` tokens of row ``b``'s block (``keep`` int32 ``[B]``,
    0 .. T): the state replayed over them (later tokens masked to ``beta = g = 0``) and the
    convolution window that ends at token ``keep[b]``."""
    mask = _kept(pending.k.shape[1], keep)
    zeros = jnp.zeros_like(pending.k)
    _, state = gated_delta_rule(zeros, pending.k, pending.v, pending.g * mask, pending.beta * mask, pending.state)
    return LinearState(_conv_after(pending.window, keep, pending.window.shape[1] - pending.k.shape[1]), state)


class GatedDeltaNet(nn.Module):
    """Qwen3.5's linear-attention token mixer (``Qwen3_5GatedDeltaNet``).

    ``x`` ``[B, T, d]`` -> ``in_proj_qkv`` -> causal depthwise conv (kernel ``K``) + SiLU -> q, k, v
    (``Hk`` key heads of ``Dk``, repeated to the ``Hv`` value heads of ``Dv``; q and k l2-normalised,
    q scaled by ``Dk ** -0.5``); ``beta = sigmoid(in_proj_b x)``, ``g = -exp(A_log) softplus(in_proj_a x
    + dt_bias)``; the gated delta rule; a per-head RMSNorm gated by ``silu(in_proj_z x)``; ``out_proj``.

    ``cache``: ``None`` (the block from a zero state; training and full forwards) or a
    ``LinearState``; with a cache the layer returns a ``PendingLinear`` for ``commit``, or, given
    ``lengths`` ``[B]`` (prefill of right-padded prompts), the committed ``LinearState`` after each
    row's first ``lengths[b]`` tokens (the rest masked to ``beta = g = 0``; no replay, and no
    per-token keys and values kept).
    """

    hidden_size: int
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int
    eps: float
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: Array, cache: LinearState | None, lengths: Array | None = None):
        d, hk, hv, dk, dv = self.hidden_size, self.num_k_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim
        b, t, _ = x.shape
        channels = 2 * hk * dk + hv * dv
        dt = self.dtype

        def proj(name, out):
            return x @ param(self, name, (d, out), ("embed", "mlp")).astype(dt)

        mixed = proj("in_proj_qkv", channels)  # [B, T, C]
        z = proj("in_proj_z", hv * dv).reshape(b, t, hv, dv)
        beta = jax.nn.sigmoid(proj("in_proj_b", hv).astype(jnp.float32))
        a = proj("in_proj_a", hv).astype(jnp.float32)
        dt_bias = param(self, "dt_bias", (hv,), (None,), nn.initializers.ones)
        a_log = param(self, "A_log", (hv,), (None,), nn.initializers.zeros)
        g = -jnp.exp(a_log) * jax.nn.softplus(a + dt_bias)
        weight = param(self, "conv_weight", (channels, 1, self.conv_kernel), ("mlp", None, None)).astype(dt)

        previous = jnp.zeros((b, self.conv_kernel - 1, channels), dt) if cache is None else cache.conv.astype(dt)
        window = jnp.concatenate([previous, mixed], axis=1)
        mixed = causal_conv(window, weight)
        q, k, v = jnp.split(mixed.astype(jnp.float32), [hk * dk, 2 * hk * dk], axis=-1)
        q, k = (jnp.repeat(y.reshape(b, t, hk, dk), hv // hk, axis=2) for y in (q, k))
        q, k, v = l2norm(q) * dk**-0.5, l2norm(k), v.reshape(b, t, hv, dv)
        state = jnp.zeros((b, hv, dk, dv), jnp.float32) if cache is None else cache.state
        if cache is not None and lengths is not None:  # prefill: the state at each row's length, directly
            valid = _kept(t, lengths)
            out, final = gated_delta_rule(q, k, v, g * valid, beta * valid, state)
            new_cache = LinearState(_conv_after(window, lengths, self.conv_kernel - 1), final)
        else:
            out, _ = gated_delta_rule(q, k, v, g, beta, state)
            new_cache = None if cache is None else PendingLinear(window, state, k, v, g, beta)

        # gated RMSNorm per head (Qwen3_5RMSNormGated): normalise, cast, weight, times silu(z)
        norm_w = param(self, "norm", (dv,), (None,), nn.initializers.ones)
        out = out * jax.lax.rsqrt(jnp.mean(out * out, axis=-1, keepdims=True) + self.eps)
        out = norm_w.astype(dt) * out.astype(dt)
        out = (out.astype(jnp.float32) * nn.silu(z.astype(jnp.float32))).astype(dt)
        out = out.reshape(b, t, hv * dv) @ param(self, "out_proj", (hv * dv, d), ("mlp", "embed")).astype(dt)
        return out, new_cache
