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
    # computed once, before the loop: without the barrier XLA (CPU) moved the top-k into the loop's
    # reads of it, 145 ms instead of 1.6 ms for one row of 15 offsets over a 49152-token vocabulary
    vals, ids = jax.lax.optimization_barrier((vals, ids.astype(jnp.int32)))
    rows = jnp.arange(vals.shape[0])

    def children(token, depth):  # the same candidates below every node of a depth
        del token
        d = jnp.minimum(depth, vals.shape[1] - 1)
        return vals[rows, d], ids[rows, d]

    return build_tree_with(children, budget, vals.shape[1], jnp.zeros(vals.shape[:1], jnp.int32))


def build_tree_with(children, budget: int, max_depth: int, anchor: Array) -> Tree:
    """The best-first tree of ``budget`` nodes when a node's children depend on the node (DFlash 2's
    selector scores each candidate given its predecessor token, SPEC "DFlash 2" 2).

    Args:
      children: ``(token int32 [B], depth int32 [B]) -> (logp float32 [B, W], ids int32 [B, W])``:
        the candidates below a node holding ``token`` at ``depth`` (0: the anchor), their
        log-probabilities given it, best first (``-inf``: none). Called once per node added.
      max_depth: static, the deepest a node can be (the block's draft offsets).
      anchor: int32 ``[B]``, each row's anchor token (the root's ``token``).

    Returns:
      ``Tree`` of ``budget`` nodes: pop the best prefix (its parent's score plus its own
      log-probability, capped at 0 so that no child scores above its parent), add it, push its
      next-ranked sibling and its best child; padding once a row runs out. Of equal scores the
      entry pushed first wins (``tests/test_tree.py``'s heap).
    """
    b = anchor.shape[0]
    root_v, root_i = children(anchor, jnp.zeros((b,), jnp.int32))
    width = root_v.shape[1]
    slots = 2 * budget + 1  # the first candidate, then at most a sibling and a child per node added
    neg = jnp.float32(-jnp.inf)
    rows = jnp.arange(b)
    # candidate tables: row 0 the anchor's children, row i + 1 node i's
    cv = jnp.full((b, budget + 1, width), neg).at[:, 0].set(root_v)
    ci = jnp.zeros((b, budget + 1, width), jnp.int32).at[:, 0].set(root_i)
    # the frontier: per slot, the parent's score ("base"), the parent node, depth (1-based), rank
    base = jnp.zeros((b, slots), jnp.float32)
    parent = jnp.full((b, slots), -1, jnp.int32)
    depth = jnp.zeros((b, slots), jnp.int32).at[:, 0].set(1)
    rank = jnp.zeros((b, slots), jnp.int32)
    live = jnp.zeros((b, slots), bool).at[:, 0].set(jnp.isfinite(root_v[:, 0]))
    nodes = (
        jnp.zeros((b, budget), jnp.int32),
        jnp.full((b, budget), -1, jnp.int32),
        jnp.zeros((b, budget), jnp.int32),
        jnp.full((b, budget), neg),
        jnp.zeros((b, budget), bool),
    )

    def add(i, carry):
        (cv, ci, base, parent, depth, rank, live), (tok, par, dep, sc, ok) = carry
        flat = (parent + 1) * width + jnp.minimum(rank, width - 1)  # each slot's entry in the tables
        # a log-probability is <= 0, but XLA's CPU exp/log can make a near-certain one a few 1e-8 above 0; a child
        # scored above its parent would be sorted before it (sort_tree), and the one-pass mask and accept walk
        # that read parents first would cut the path there
        own = jnp.minimum(jnp.take_along_axis(cv.reshape(b, -1), flat, axis=1), 0.0)
        scores = jnp.where(live, base + own, neg)
        j = jnp.argmax(scores, axis=1)  # the first of equal scores: the entry pushed first
        s = scores[rows, j]
        found = live[rows, j] & jnp.isfinite(s)
        d, r, p = depth[rows, j], rank[rows, j], parent[rows, j]
        token = ci.reshape(b, -1)[rows, flat[rows, j]]
        tok = tok.at[:, i].set(jnp.where(found, token, 0))
        par = par.at[:, i].set(jnp.where(found, p, -1))
        dep = dep.at[:, i].set(jnp.where(found, d, 0))
        sc = sc.at[:, i].set(jnp.where(found, s, neg))
        ok = ok.at[:, i].set(found)
        kv, ki = children(token, d)  # below the new node, at depth d + 1
        deeper = found & (d < max_depth)
        cv = cv.at[:, i + 1].set(jnp.where(deeper[:, None], kv, neg))
        ci = ci.at[:, i + 1].set(ki)
        live = live.at[rows, j].set(False)
        # its next-ranked sibling (same parent, same depth), then its best child
        sib, kid = 2 * i + 1, 2 * i + 2
        base = base.at[:, sib].set(base[rows, j]).at[:, kid].set(s)
        parent = parent.at[:, sib].set(p).at[:, kid].set(i)
        depth = depth.at[:, sib].set(d).at[:, kid].set(d + 1)
        rank = rank.at[:, sib].set(r + 1).at[:, kid].set(0)
        live = live.at[:, sib].set(found & (r + 1 < width)).at[:, kid].set(deeper)
        return (cv, ci, base, parent, depth, rank, live), (tok, par, dep, sc, ok)

    _, nodes = jax.lax.fori_loop(0, budget, add, ((cv, ci, base, parent, depth, rank, live), nodes))
    return Tree(*nodes)


def add_branch(tree: Tree, branch: Array, num: Array, nodes: int, logp: Array | None = None) -> Tree:
    """``tree`` with a chain of draft tokens below the anchor merged in (SPEC "Tree verification" 1:
    another draft as a branch, e.g. prompt lookup's continuation), as ``nodes`` more nodes.

    The branch's tokens ``branch[b, :num[b]]`` (int32 ``[B, K]``, ``num`` int32 ``[B]``) follow the
    tree from the anchor as far as a node holds them; the rest become new nodes, each the child of
    the one before. A token the tree already holds is not added twice (no two children of one node
    hold the same token: the accept walk relies on it), so the new nodes that shadow existing ones,
    and those past ``num`` or past ``nodes``, are padding. Parents still come before children.

    Args:
      logp: optional float32 ``[B, K]``, the log-probability that the branch's token ``j`` is right
        given the ones before were (default 0: certain). A branch node scores its parent's score plus
        its own; a node the branch follows keeps the larger of its score and the branch's, so every
        child still scores at most its parent (``sort_tree`` keeps parents first).

    Returns:
      ``Tree`` of ``N + nodes`` nodes.
    """
    b, n = tree.tokens.shape
    r = min(nodes, branch.shape[1])
    logp = jnp.zeros(branch.shape, jnp.float32) if logp is None else jnp.minimum(logp, 0.0)  # as build_tree_with's
    rows = jnp.arange(b)
    extra = (
        jnp.zeros((b, nodes), jnp.int32),
        jnp.full((b, nodes), -1, jnp.int32),
        jnp.zeros((b, nodes), jnp.int32),
        jnp.full((b, nodes), -jnp.inf, jnp.float32),
        jnp.zeros((b, nodes), bool),
    )
    tok, par, dep, sc, ok = (jnp.concatenate(pair, axis=1) for pair in zip(tree, extra))
    at = jnp.full((b,), -1, jnp.int32)  # the node the branch has reached (-1: the anchor)
    for j in range(r):
        want = branch[:, j]
        same = ok & (par == at[:, None]) & (tok == want[:, None])  # a child of `at` holding the token
        found = jnp.any(same, axis=1) & (j < num)
        new = (j < num) & ~found
        i = n + j
        mine = jnp.where(at >= 0, sc[rows, jnp.maximum(at, 0)], 0.0) + logp[:, j]  # the branch's score here
        old = jnp.argmax(same, axis=1)
        sc = sc.at[rows, old].set(jnp.where(found, jnp.maximum(sc[rows, old], mine), sc[rows, old]))
        tok = tok.at[:, i].set(jnp.where(new, want, 0))
        par = par.at[:, i].set(jnp.where(new, at, -1))
        dep = dep.at[:, i].set(jnp.where(new, j + 1, 0))
        sc = sc.at[:, i].set(jnp.where(new, mine, -jnp.inf))
        ok = ok.at[:, i].set(new)
        at = jnp.where(found, old.astype(jnp.int32), jnp.where(new, i, at))
    return Tree(tok, par, dep, sc, ok)


def ancestor_mask(tree: Tree) -> Array:
    """bool ``[B, N + 1, N + 1]``: which block token sees which, for a block of the anchor (slot 0)
    then the nodes (node ``i`` at slot ``i + 1``): every real token sees the anchor, its ancestors and
    itself; a padding node sees nothing (SPEC "Tree verification" 2; ``target.tree_mask`` adds the
    cache)."""
    b, n = tree.tokens.shape
    if n == 0:  # the anchor alone
        return jnp.ones((b, 1, 1), bool)
    eye = jnp.eye(n + 1, dtype=bool)
    # parent as a one-hot over slots; a node's ancestors are its parent's plus its parent
    par_slot = jnp.where(tree.parent >= 0, tree.parent + 1, 0)
    mask = jnp.broadcast_to(eye, (b, n + 1, n + 1))
    mask = mask.at[:, 1:, 0].set(True)

    def row(i, m):  # parents come before children: one pass in node order
        p = par_slot[:, i]
        return m.at[:, i + 1].set(m[:, i + 1] | jnp.take_along_axis(m, p[:, None, None], axis=1)[:, 0])

    mask = jax.lax.fori_loop(0, n, row, mask)
    valid = jnp.concatenate([jnp.ones((b, 1), bool), tree.valid], axis=1)
    return mask & valid[:, :, None] & valid[:, None, :]


class Accepted(NamedTuple):
    """What the accept walk of a verified tree found, per row.

    Fields:
      length: int32 ``[B]``, the accepted draft tokens ``a`` (the path's depth; 0: none).
      path: int32 ``[B, D + 1]``, the block slot of the path's token at each depth ``0 .. D`` (slot 0,
        the anchor, at depth 0; past ``a`` the depth itself, capped at the tree's last slot ``N``: a
        slot that exists, which nothing reads).
      bonus: int32 ``[B]``, the target's token after the path (its token at the path's last slot).
    """

    length: Array
    path: Array
    bonus: Array


def accept_walk(tree: Tree, target_tokens: Array, max_depth: int) -> Accepted:
    """The accept walk (SPEC "Tree verification" 3): from the anchor, take the target's token at
    the current node; go on to the child holding it, else it is the bonus token and the walk ends.

    ``target_tokens``: int32 ``[B, N + 1]``, the target's token at each block slot (anchor at 0):
    its argmax (greedy), or one sample from its tempered distribution there (sampling; lossless
    with no draft distribution, since every emitted token is the target's own at its true context).
    Since no two children of a node hold the same token (``build_tree``, ``add_branch``), the path is
    unique: it ends at the deepest node whose every ancestor's target token is the next node's.
    ``max_depth``: static, the deepest a node can be (the block's draft offsets).
    """
    b, n = tree.tokens.shape
    par_slot = jnp.where(tree.parent >= 0, tree.parent + 1, 0)
    follows = tree.valid & (tree.tokens == jnp.take_along_axis(target_tokens, par_slot, axis=1))

    def node(i, acc):  # parents come before children: one pass in node order
        p = tree.parent[:, i]
        parent_ok = (p < 0) | jnp.take_along_axis(acc, jnp.maximum(p, 0)[:, None], axis=1)[:, 0]
        return acc.at[:, i].set(follows[:, i] & parent_ok)

    acc = jax.lax.fori_loop(0, n, node, jnp.zeros((b, n), bool))
    reach = jnp.where(acc, tree.depth, 0)
    best = jnp.argmax(reach, axis=1).astype(jnp.int32)  # the path's end (any node when none: length 0)
    length = jnp.max(reach, axis=1).astype(jnp.int32)
    rows = jnp.arange(b)
    # past the path, depth d points at slot min(d, N): in range even when the block is deeper than the tree
    # has nodes (a gather of the verify's N + 1 rows along it, such as the target features, stays finite)
    path = jnp.broadcast_to(jnp.minimum(jnp.arange(max_depth + 1, dtype=jnp.int32), n), (b, max_depth + 1))
    at = jnp.where(length > 0, best, -1)
    for _ in range(max_depth):  # from the end up to the anchor
        d = jnp.where(at >= 0, tree.depth[rows, jnp.maximum(at, 0)], 0)
        path = path.at[rows, d].set(jnp.where(at >= 0, at + 1, path[rows, d]))
        at = jnp.where(at >= 0, tree.parent[rows, jnp.maximum(at, 0)], -1)
    last = jnp.where(length > 0, best + 1, 0)
    return Accepted(length, path, target_tokens[rows, last])


def sort_tree(tree: Tree) -> Tree:
    """``tree`` with its nodes in best-first order: by score, highest first, padding last (a stable
    sort, so of equal scores the node listed first stays first). Parents stay before children, since
    no child scores above its parent. The first ``n`` nodes are then the best ``n``-node tree it holds
    (what a verify of ``n`` nodes checks: ``decode.choose_tree_width``)."""
    key = jnp.where(tree.valid, -tree.score, jnp.inf)
    order = jnp.argsort(key, axis=1, stable=True).astype(jnp.int32)  # new position -> old node
    where = jnp.argsort(order, axis=1).astype(jnp.int32)  # old node -> new position
    take = lambda x: jnp.take_along_axis(x, order, axis=1)  # noqa: E731
    parent = take(tree.parent)
    parent = jnp.where(parent >= 0, jnp.take_along_axis(where, jnp.maximum(parent, 0), axis=1), -1)
    return Tree(take(tree.tokens), parent, take(tree.depth), take(tree.score), take(tree.valid))


def node_probability(tree: Tree) -> Array:
    """float32 ``[B, N]``: each node's probability of being right given its parent was, from the
    scores (``exp(score - parent's score)``; 0 on padding)."""
    parent_score = jnp.where(
        tree.parent >= 0, jnp.take_along_axis(tree.score, jnp.maximum(tree.parent, 0), axis=1), 0.0
    )
    return jnp.where(tree.valid, jnp.exp(jnp.minimum(tree.score - parent_score, 0.0)), 0.0)


def path_probability(tree: Tree, node_p: Array) -> Array:
    """float32 ``[B, N]``: each node's probability of being accepted, the product of ``node_p`` (each
    node's given its parent, ``[B, N]``) along its path (parents before children: one pass)."""

    def node(i, acc):
        p = tree.parent[:, i]
        up = jnp.where(p >= 0, jnp.take_along_axis(acc, jnp.maximum(p, 0)[:, None], axis=1)[:, 0], 1.0)
        return acc.at[:, i].set(node_p[:, i] * up)

    return jax.lax.fori_loop(0, tree.tokens.shape[1], node, jnp.zeros_like(node_p))


def on_path(walk: Accepted, nodes: int) -> Array:
    """bool ``[B, N]``: the nodes the accept walk took (``walk.path``'s slots at depths ``1 .. a``)."""
    d = jnp.arange(walk.path.shape[1])
    slots = jnp.where((d >= 1) & (d <= walk.length[:, None]), walk.path, 0)  # 0: none (the anchor's slot)
    return jnp.any(slots[:, :, None] == jnp.arange(1, nodes + 1)[None, None, :], axis=1)
