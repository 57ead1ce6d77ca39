"""Sampling settings, the tempered distribution, and speculative rejection sampling (SPEC "Sampling").

The target's distribution ``p`` and the drafter's ``q`` are built the same way, in float32,
in this order (as ``dflash==0.1.0``'s ``_sampling_probs``): logits / temperature; top-k on
the scaled logits (exactly k tokens survive); softmax; top-p (keep a token while the
probability mass sorted before it is < top_p); renormalise. Temperature 0 is argmax.

Verification (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
Decoding", Algorithm 1; Chen et al. 2023): draft ``x_k ~ q_k`` is accepted while
``u_k * q_k(x_k) < p_{k-1}(x_k)`` (``u_k`` uniform); at the first rejection the bonus token
comes from ``norm(max(p - q, 0))`` at that offset (or ``p`` if that is all zero); after a
fully accepted block it comes from ``p``. The committed tokens are then distributed exactly
as sampling from the target alone.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

Array = jax.Array


MIN_TEMPERATURE = 1e-4  # logits of |x| <= ~1e30 stay finite in float32 after / T; 1e-4 is far inside that


@dataclasses.dataclass(frozen=True)
class Sampling:
    """Static sampling settings (part of the compiled decoder's key).

    ``temperature`` 0 is greedy (``top_p`` and ``top_k`` are then ignored); ``top_k`` 0 or
    >= vocabulary size keeps every token; ``top_p`` 1 keeps every token.

    Raises:
      ValueError: temperature < 0 or in (0, ``MIN_TEMPERATURE``) (``logits / T`` overflows float32
        there and the distribution turns to NaN), top_p outside (0, 1], or top_k < 0 (the
        reference's ranges).
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self):
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise ValueError(
                f"temperature {self.temperature} is too small to compute in float32; use 0 for greedy "
                f"decoding or at least {MIN_TEMPERATURE}"
            )
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if int(self.top_k) != self.top_k or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


GREEDY = Sampling()


def probs(logits: Array, s: Sampling) -> Array:
    """The tempered, top-k / top-p filtered distribution ``[..., V]`` (float32) of ``logits [..., V]``.

    Needs ``s.temperature > 0``. Tokens filtered out get probability exactly 0.
    """
    scores = logits.astype(jnp.float32) / s.temperature
    vocab = scores.shape[-1]
    indices = None
    if 0 < s.top_k < vocab:
        scores, indices = jax.lax.top_k(scores, s.top_k)  # sorted, exactly k survive
    p = jax.nn.softmax(scores, axis=-1)
    if s.top_p < 1.0:
        if indices is None:  # top-k output is already sorted; otherwise sort here
            order = jnp.argsort(-p, axis=-1)
            sp = jnp.take_along_axis(p, order, axis=-1)
        else:
            sp = p
        keep = jnp.cumsum(sp, axis=-1) - sp < s.top_p
        sp = jnp.where(keep, sp, 0.0)
        sp = sp / jnp.sum(sp, axis=-1, keepdims=True)
        if indices is None:
            p = _unsort(sp, order)
        else:
            p = sp
    if indices is not None:
        full = jnp.zeros(logits.shape, jnp.float32)
        p = jnp.put_along_axis(full, indices, p, axis=-1, inplace=False)
    return p


def _unsort(sorted_values: Array, order: Array) -> Array:
    """Values back in vocabulary order: ``out[..., order[i]] = sorted_values[..., i]``."""
    return jnp.put_along_axis(jnp.zeros_like(sorted_values), order, sorted_values, axis=-1, inplace=False)


def sample(key: Array, p: Array) -> Array:
    """One token per row of ``p [..., V]`` (int32 ``[...]``), drawn with ``key``."""
    return jax.random.categorical(key, jnp.log(p), axis=-1).astype(jnp.int32)


def accept(key: Array, draft: Array, q: Array, p: Array, num_valid: Array) -> tuple[Array, Array]:
    """Speculative rejection sampling for a batch of blocks.

    Args:
      key: one PRNG key per row ``[B]`` (typed keys).
      draft: int32 ``[B, K]`` draft tokens at block offsets 1..K, ``draft[:, j] ~ q[:, j]``.
      q: float32 ``[B, K, V]`` the drafter's distributions.
      p: float32 ``[B, K + 1, V]`` the target's distributions at block offsets 0..K
        (``p[:, j]`` is the distribution of the token at offset ``j + 1``).
      num_valid: int32 ``[B]``: only drafts at offsets ``1..num_valid`` count (the block is
        shorter near the length limit).

    Returns:
      ``(a, bonus)``: accepted drafts ``[B]`` and the bonus token ``[B]`` (offset ``a + 1``).
    """
    k = draft.shape[1]

    def row(key, draft, q, p, n):
        k_u, k_b = jax.random.split(key)
        u = jax.random.uniform(k_u, (k,), jnp.float32)
        px = jnp.take_along_axis(p[:k], draft[:, None], axis=-1)[:, 0]
        qx = jnp.take_along_axis(q, draft[:, None], axis=-1)[:, 0]
        ok = (u * qx < px) & (jnp.arange(k) < n)
        a = jnp.sum(jnp.cumprod(ok.astype(jnp.int32)))
        p_a = p[a]
        residual = jnp.maximum(p_a - q[jnp.minimum(a, k - 1)], 0.0)
        total = jnp.sum(residual)
        rejected = a < n
        dist = jnp.where(rejected & (total > 0), residual / jnp.maximum(total, jnp.finfo(jnp.float32).tiny), p_a)
        return a, sample(k_b, dist)

    return jax.vmap(row)(key, draft, q, p, num_valid)
