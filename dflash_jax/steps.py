"""The draft-step protocol: what the decoding loop asks of whatever proposes a round's tokens.

A *draft step* is a static, hashable object (its parameters are passed in, so it can be a
``jax.jit`` static argument). The loop (``decode.decode_loop``) calls it the same way whatever it
is: the trained DFlash drafter (``drafter.DraftStep``), prompt lookup (``ngram.NgramStep``), both
row by row (``ngram.HybridStep``), or a test's oracle. Every proposal is one ``Draft``.

A step has:

- ``tap_layers``: the target layer ids whose outputs it reads (``()``: none);
- ``max_block_size`` and ``default_block_size``: the largest block it drafts, and the block a
  plan takes when none is asked for (``speculation.make_plan``);
- ``init_cache(batch, cache_len)`` and ``write_context(params, cache, feats, start)``: its own
  context cache (``None`` for a step that keeps none), written with the target features of the
  committed positions every round;
- ``tree_size``: optional, the nodes of the tree it drafts each round (a step that drafts trees,
  ``Draft.tree``); absent or 0: chains;
- ``propose(params, target_params, cache, anchor, start, block_valid, block_len, *, tokens, key,
  sampling) -> Draft``: the round's draft. ``anchor``/``start`` int32 ``[B]``: each row's last
  committed token and its position; ``block_valid`` int32 ``[B]``: how many block positions the
  round can verify (1 for a finished row, which a step may skip); ``block_len``: static block
  length; ``tokens`` int32 ``[B, S + block]``: the loop's token buffer (committed tokens at
  positions ``0 .. start``, stale slots after); ``key``: one PRNG key per row ``[B]`` (sampling);
  ``sampling``: the static ``Sampling`` settings.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from dflash_jax.sampling import Sampling, probs, sample

Array = jax.Array


class Draft(NamedTuple):
    """One round's proposal, for every row of the batch (``K = block_len - 1``).

    Fields:
      tokens: int32 ``[B, K]``, the proposed tokens at block offsets ``1 .. K``.
      num: int32 ``[B]``, how many of them are real (offsets ``1 .. num``); the loop never
        accepts a token past it (prompt lookup's continuation may be short, or absent).
      confidence: float32 ``[B, K]``, the step's estimate that offset ``k``'s token is right
        given offsets ``1 .. k - 1`` were (0 past ``num``); what the verify-length choice reads
        (``decode.choose_verify_length``). It must not depend on sampled tokens (SPEC
        "Sampling": the rejection rule is exact only for a verify length fixed before the draws).
      q: float32 ``[B, K, V]`` under sampling, the distribution each token was drawn from (the
        rejection rule's ``q``); ``None`` when greedy.
      tree: a ``tree.Tree`` of ``N`` nodes per row from a step that drafts trees (``tree_step``): the
        loop then verifies the anchor and the ``N`` nodes in one pass and walks the tree (SPEC "Tree
        verification"); ``tokens``, ``num`` and ``confidence`` describe its best chain, and ``q`` is
        not used (the walk needs none). ``None``: one chain, ``tokens``.
    """

    tokens: Array
    num: Array
    confidence: Array
    q: Array | None = None
    tree: Any = None


class OnDrafter:
    """A mixin for a draft step built around a DFlash drafter's step (its field ``dflash``, a
    ``drafter.DraftStep``): its config, taps, largest block and context cache are the drafter's."""

    @property
    def cfg(self):
        """The drafter's ``DrafterConfig``."""
        return self.dflash.cfg

    @property
    def tap_layers(self):
        return self.dflash.tap_layers

    @property
    def max_block_size(self) -> int:
        return self.dflash.max_block_size

    def init_cache(self, batch: int, cache_len: int):
        return self.dflash.init_cache(batch, cache_len)

    def write_context(self, params, cache, feats, start):
        return self.dflash.write_context(params, cache, feats, start)


def all_real(tokens: Array) -> Array:
    """int32 ``[B]``: every one of the ``K`` tokens of ``tokens [B, K]`` is real."""
    return jnp.full(tokens.shape[:1], tokens.shape[1], jnp.int32)


def point_mass(tokens: Array, vocab_size: int) -> Array:
    """float32 ``[B, K, V]``: the one-hot ``q`` of a deterministic draft ``tokens [B, K]``.

    Under sampling a draft token ``x`` is then accepted with probability ``p(x)`` and the first
    rejection resamples from ``norm(p with x removed)`` (SPEC "N-gram (prompt-lookup) drafting")."""
    return jax.nn.one_hot(tokens, vocab_size, dtype=jnp.float32)


def sampled(key: Array, logits: Array, sampling: Sampling) -> tuple[Array, Array]:
    """``(tokens int32 [B, K], q float32 [B, K, V])``: one independent sample per offset from the
    tempered, filtered distribution of ``logits [B, K, V]`` (``sampling.probs``), one key per row."""
    q = probs(logits, sampling)
    return jax.vmap(sample)(key, q), q
