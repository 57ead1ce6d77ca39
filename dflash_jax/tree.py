"""Draft trees: the best-first tree of a block drafter's per-offset distributions (SPEC "Tree verification").

A block drafter gives, in one forward, a distribution over the token at each block offset. A tree
of draft tokens below the anchor holds many continuations at once: node ``(t_1 .. t_d)`` is the
prefix whose token at depth ``j`` is ``t_j``, scored by the sum of its tokens' log-probabilities
(offset ``j``'s distribution for the token at depth ``j``). ``build_tree`` keeps the ``budget`` best
prefixes, best first (DDTree, arXiv 2604.12989): pop the best prefix, add it, push its next-ranked
sibling and its best child. Since every log-probability is <= 0 a child never scores above its
parent, and siblings come in rank order, so this enumerates the top prefixes in order.

Static shapes: the budget is compiled; a row whose distributions run out (a depth past the block, or
ranks past the ``width`` kept per depth) pads its tree with nodes marked invalid (they see nothing
and are never accepted). Nodes are listed in the order they were added, so a parent always comes
before its children. Ties between equal scores go to the entry pushed first (a reference in plain
Python, a heap ordered by (-score, push order), gives the same tree: tests/test_tree.py).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

Array = jax.Array


class Tree(NamedTuple):
    """A batch of draft trees of ``N`` nodes each (node ``i`` of row ``b`` at ``[b, i]``).

    Fields:
      tokens: int32 ``[B, N]``, each node's token (0 on padding).
      parent: int32 ``[B, N]``, the index of its parent node, -1 for a child of the anchor (and padding).
      depth: int32 ``[B, N]``, its depth below the anchor: 1 .. K (0 on padding); its position is
        ``start + depth``.
      score: float32 ``[B, N]``, the summed log-probability of its prefix (-inf on padding).
      valid: bool ``[B, N]``, a real node (padding nodes see nothing and are never accepted).
    """

    tokens: Array
    parent: Array
    depth: Array
    score: Array
    valid: Array


def build_tree(logprobs: Array, budget: int, width: int | None = None) -> Tree:
    """The ``budget`` best prefixes of every row's per-offset distributions, best first.

    Args:
      logprobs: float32 ``[B, K, V]``, log-probabilities of the token at depths 1 .. K (block offsets
        1 .. K) of each row; ``-inf`` for tokens a row never proposes.
      budget: static, the nodes per tree (``N``).
      width: static, candidates kept per depth (default ``min(budget, V)``): a tree of ``N`` nodes never
        uses a token ranked past ``N`` at any depth, so the default loses nothing.

    Returns:
      ``Tree`` with ``N = budget`` nodes per row.

    Raises:
      ValueError: ``budget < 1`` or ``width < 1``.
    """
    if budget < 1:
        raise ValueError(f"a tree needs a budget of at least 1 node, got {budget}")
    width = min(budget, logprobs.shape[-1]) if width is None else min(width, logprobs.shape[-1])
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    vals, ids = jax.lax.top_k(logprobs.astype(jnp.float32), width)  # [B, K, W], best first
    return jax.vmap(lambda v, i: _build_row(v, i, budget))(vals, ids.astype(jnp.int32))


def _build_row(vals: Array, ids: Array, budget: int) -> Tree:
    """One row's tree from its top ``W`` log-probabilities ``vals [K, W]`` (and token ids) per depth."""
    depth_max, width = vals.shape
    slots = 2 * budget + 1  # the first candidate, then at most a sibling and a child per node added
    neg = jnp.float32(-jnp.inf)
    # the frontier: per slot, the parent's score ("base"), the parent node, depth (1-based), rank
    base = jnp.zeros((slots,), jnp.float32)
    parent = jnp.full((slots,), -1, jnp.int32)
    depth = jnp.zeros((slots,), jnp.int32).at[0].set(1)
    rank = jnp.zeros((slots,), jnp.int32)
    live = jnp.zeros((slots,), bool).at[0].set(jnp.isfinite(vals[0, 0]))
    nodes = (
        jnp.zeros((budget,), jnp.int32),
        jnp.full((budget,), -1, jnp.int32),
        jnp.zeros((budget,), jnp.int32),
        jnp.full((budget,), neg),
        jnp.zeros((budget,), bool),
    )

    def score_of(b, d, r):  # a frontier entry's prefix score: its parent's plus its own token's
        return b + vals[jnp.maximum(d - 1, 0), r]

    def add(i, carry):
        (base, parent, depth, rank, live), (tok, par, dep, sc, ok) = carry
        scores = jnp.where(live, score_of(base, depth, rank), neg)
        j = jnp.argmax(scores)  # the first of equal scores: the entry pushed first
        found = live[j] & jnp.isfinite(scores[j])
        d, r, s = depth[j], rank[j], scores[j]
        tok = tok.at[i].set(jnp.where(found, ids[d - 1, r], 0))
        par = par.at[i].set(jnp.where(found, parent[j], -1))
        dep = dep.at[i].set(jnp.where(found, d, 0))
        sc = sc.at[i].set(jnp.where(found, s, neg))
        ok = ok.at[i].set(found)
        live = live.at[j].set(False)
        # its next-ranked sibling (same parent, same depth), then its best child
        sib, kid = 2 * i + 1, 2 * i + 2
        base = base.at[sib].set(base[j]).at[kid].set(s)
        parent = parent.at[sib].set(parent[j]).at[kid].set(i)
        depth = depth.at[sib].set(d).at[kid].set(d + 1)
        rank = rank.at[sib].set(r + 1).at[kid].set(0)
        live = live.at[sib].set(found & (r + 1 < width)).at[kid].set(found & (d < depth_max))
        return (base, parent, depth, rank, live), (tok, par, dep, sc, ok)

    _, nodes = jax.lax.fori_loop(0, budget, add, ((base, parent, depth, rank, live), nodes))
    return Tree(*nodes)
