"""The best-first draft tree (``tree.build_tree``) equals a plain-Python statement of the rule
(SPEC "Tree verification" 1), and its nodes are the best prefixes of all."""

from __future__ import annotations

import heapq
import itertools

import jax
import numpy as np
import pytest

from dflash_jax.tree import build_tree


def reference_tree(logprobs: np.ndarray, budget: int):
    """One row, by the rule: a heap of (-score, push order) prefixes; pop the best, add it, push its
    next-ranked sibling and its best child. Returns (tokens, parents, depths, scores) of the nodes added."""
    k, v = logprobs.shape
    order = [np.argsort(-logprobs[d], kind="stable") for d in range(k)]  # ranks per depth
    pushes = itertools.count()
    heap = [(-logprobs[0, order[0][0]], next(pushes), np.float32(0), -1, 1, 0)]
    nodes = []
    while heap and len(nodes) < budget:
        neg, _, base, parent, depth, rank = heapq.heappop(heap)
        score = np.float32(-neg)
        if not np.isfinite(score):
            break
        nodes.append((int(order[depth - 1][rank]), parent, depth, score))
        me = len(nodes) - 1
        if rank + 1 < min(budget, v):
            heapq.heappush(
                heap,
                (
                    -(base + logprobs[depth - 1, order[depth - 1][rank + 1]]),
                    next(pushes),
                    base,
                    parent,
                    depth,
                    rank + 1,
                ),
            )
        if depth < k:
            heapq.heappush(heap, (-(score + logprobs[depth, order[depth][0]]), next(pushes), score, me, depth + 1, 0))
    return nodes


def _logprobs(rng, b, k, v, blocked=0.0):
    x = rng.normal(size=(b, k, v)).astype(np.float32) * rng.uniform(0.5, 4.0)
    if blocked:  # some tokens never proposed (a draft vocabulary): -inf
        x[rng.uniform(size=x.shape) < blocked] = -np.inf
        x[..., 0] = np.maximum(x[..., 0], -1.0)  # keep every depth non-empty
    return np.asarray(jax.nn.log_softmax(x, axis=-1), np.float32)


@pytest.mark.parametrize(
    "b, k, v, budget, blocked", [(3, 4, 6, 8, 0.0), (2, 7, 32, 16, 0.0), (4, 3, 5, 40, 0.5), (2, 16, 50, 32, 0.3)]
)
def test_the_tree_equals_the_rule(b, k, v, budget, blocked):
    rng = np.random.default_rng(b * 1000 + k * 10 + v)
    lp = _logprobs(rng, b, k, v, blocked)
    tree = jax.device_get(build_tree(lp, budget))
    for row in range(b):
        want = reference_tree(lp[row], budget)
        n = len(want)
        assert tree.valid[row].tolist() == [True] * n + [False] * (budget - n)
        assert tree.tokens[row, :n].tolist() == [t for t, _, _, _ in want]
        assert tree.parent[row, :n].tolist() == [p for _, p, _, _ in want]
        assert tree.depth[row, :n].tolist() == [d for _, _, d, _ in want]
        np.testing.assert_array_equal(tree.score[row, :n], np.asarray([s for *_, s in want], np.float32))
        # padding sees nothing: no token, no parent, depth 0, score -inf
        assert not tree.tokens[row, n:].any() and (tree.parent[row, n:] == -1).all() and not tree.depth[row, n:].any()
        assert np.isneginf(tree.score[row, n:]).all()
        # a parent comes before its child, one depth up, and the child's score is the parent's plus its token's
        for i, (tok, par, dep, sc) in enumerate(want):
            if par >= 0:
                assert par < i and tree.depth[row, par] == dep - 1
                assert sc == np.float32(tree.score[row, par] + lp[row, dep - 1, tok])
            else:
                assert dep == 1 and sc == lp[row, 0, tok]


def test_the_nodes_are_the_best_prefixes_of_all():
    """Brute force over every prefix of a small tree: the ``budget`` nodes are the best ``budget``."""
    rng = np.random.default_rng(7)
    k, v, budget = 3, 4, 11
    lp = _logprobs(rng, 1, k, v)[0]
    every = [
        float(sum(np.float64(lp[d, t]) for d, t in enumerate(prefix)))
        for depth in range(1, k + 1)
        for prefix in itertools.product(range(v), repeat=depth)
    ]
    tree = jax.device_get(build_tree(lp[None], budget))
    np.testing.assert_allclose(sorted(tree.score[0], reverse=True), sorted(every, reverse=True)[:budget], rtol=1e-5)
    assert list(tree.score[0]) == sorted(tree.score[0], reverse=True)  # best first


def test_bad_budgets_are_refused():
    with pytest.raises(ValueError, match="budget of at least 1"):
        build_tree(np.zeros((1, 2, 3), np.float32), 0)


@pytest.mark.parametrize("family", ["qwen3", "gpt_oss", "qwen3_moe"])
def test_a_tree_block_gives_each_node_the_logits_of_its_own_path(tiny_models, family):
    """One verify of a tree block (``Target(tree=...)``: slots by node, positions by depth, each node
    seeing the cache and its ancestors) gives every node the target's logits after its own path,
    as a causal forward of prompt + path computes them: dense, sliding window with sinks (gpt-oss,
    prompt longer than its window of 8), mixture of experts. A padding node changes nothing."""
    import jax.numpy as jnp

    from dflash_jax import checkpoint
    from dflash_jax.target import Target, init_cache

    ck = checkpoint.load_target(tiny_models[family][2])
    model, params = Target(ck.cfg), {"params": ck.params}
    rng = np.random.default_rng(3)
    prompt = rng.integers(4, 90, 13).tolist()
    anchor = 17
    parents = [-1, -1, 0, 0, 2, 4, 1, -1]  # node i's parent (-1: the anchor); the last node is padding
    tokens = rng.integers(4, 90, len(parents)).tolist()
    real = len(parents) - 1
    depth = []
    for p in parents:
        depth.append(1 if p < 0 else depth[p] + 1)
    t = len(parents) + 1  # the anchor, then the nodes
    mask = np.zeros((t, t), bool)
    mask[0, 0] = True
    for i in range(real):
        node, mask[i + 1, 0] = i, True
        while node >= 0:
            mask[i + 1, node + 1] = True
            node = parents[node]
    cache = init_cache(ck.cfg, 1, 64)
    _, _, cache = model.apply(params, jnp.asarray([prompt]), jnp.arange(len(prompt))[None], cache)
    block = jnp.asarray([[anchor, *tokens]])
    positions = len(prompt) + jnp.asarray([[0, *depth]])
    hidden, _, _ = model.apply(params, block, positions, cache, tree=jnp.asarray(mask[None]))
    got = np.asarray(model.apply(params, hidden, method="logits"))[0]
    assert np.isfinite(got).all()  # the padding node too
    for i in range(-1, real):
        path, node = [], i
        while node >= 0:
            path.insert(0, tokens[node])
            node = parents[node]
        seq = [*prompt, anchor, *path]
        h, _, _ = model.apply(params, jnp.asarray([seq]), jnp.arange(len(seq))[None])
        want = np.asarray(model.apply(params, h[:, -1], method="logits"))[0]
        np.testing.assert_allclose(got[i + 1], want, rtol=1e-4, atol=1e-4 * np.abs(want).max(), err_msg=f"node {i}")


def test_a_tree_block_is_refused_by_a_recurrent_target(tiny_models):
    import jax.numpy as jnp

    from dflash_jax import checkpoint
    from dflash_jax.target import Target, init_cache

    ck = checkpoint.load_target(tiny_models["qwen3_5"][2])
    block, tree = jnp.zeros((1, 3), jnp.int32), jnp.ones((1, 3, 3), bool)
    with pytest.raises(ValueError, match="not supported with linear-attention .Gated DeltaNet. layers"):
        Target(ck.cfg).apply({"params": ck.params}, block, jnp.arange(3)[None], init_cache(ck.cfg, 1, 16), tree=tree)
