"""The best-first draft tree (``tree.build_tree``) equals a plain-Python statement of the rule
(SPEC "Tree verification" 1), and its nodes are the best prefixes of all."""

from __future__ import annotations

import dataclasses
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


@pytest.mark.parametrize("family", ["qwen3", "gpt_oss", "qwen3_moe", "gemma3", "deepseek_v3", "gemma4"])
def test_a_tree_block_gives_each_node_the_logits_of_its_own_path(tiny_models, family):
    """One verify of a tree block (``Target(tree=...)``: slots by node, positions by depth, each node
    seeing the cache and its ancestors) gives every node the target's logits after its own path,
    as a causal forward of prompt + path computes them: dense, sliding window with sinks (gpt-oss,
    prompt longer than its window of 8), mixture of experts. A padding node changes nothing."""
    import jax.numpy as jnp
    from helpers import target_forward

    from dflash_jax import checkpoint
    from dflash_jax.target import init_cache

    ck = checkpoint.load_target(tiny_models[family][2])
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
    _, _, _, cache = target_forward(ck, np.asarray([prompt]), cache=init_cache(ck.cfg, 1, 64))
    block = np.asarray([[anchor, *tokens]])
    positions = len(prompt) + np.asarray([[0, *depth]])
    got = target_forward(ck, block, positions, cache, tree=jnp.asarray(mask[None]))[0][0]
    assert np.isfinite(got).all()  # the padding node too
    # each node's path after prompt + anchor, all in one causal forward (a row's padding at its end
    # is after the position read, so it changes nothing: test_target's padding test)
    seqs = []
    for i in range(-1, real):
        path, node = [], i
        while node >= 0:
            path.insert(0, tokens[node])
            node = parents[node]
        seqs.append([*prompt, anchor, *path])
    width = max(map(len, seqs))
    padded = np.asarray([s + [0] * (width - len(s)) for s in seqs])
    logits = target_forward(ck, padded)[0]
    for i, seq in zip(range(-1, real), seqs):
        want = logits[i + 1, len(seq) - 1]
        np.testing.assert_allclose(got[i + 1], want, rtol=1e-4, atol=1e-4 * np.abs(want).max(), err_msg=f"node {i}")


def test_a_tree_block_is_refused_by_a_recurrent_target(tiny_models):
    import jax.numpy as jnp

    from dflash_jax import checkpoint
    from dflash_jax.target import Target, init_cache

    ck = checkpoint.load_target(tiny_models["qwen3_5"][2])
    block, tree = jnp.zeros((1, 3), jnp.int32), jnp.ones((1, 3, 3), bool)
    with pytest.raises(ValueError, match="not supported with linear-attention .Gated DeltaNet. layers"):
        Target(ck.cfg).apply({"params": ck.params}, block, jnp.arange(3)[None], init_cache(ck.cfg, 1, 16), tree=tree)


# --- the pieces of a tree round, against plain-Python statements of SPEC "Tree verification" ---


def _random_tree(rng, b=3, n=10, k=4, vocab=6):
    from dflash_jax.tree import build_tree

    logits = rng.normal(size=(b, k, vocab)).astype(np.float32) * 2
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return build_tree(logp, n)


def _nodes(tree, row):
    t = [np.asarray(x)[row] for x in tree]
    return [(int(t[0][i]), int(t[1][i]), int(t[2][i]), bool(t[4][i])) for i in range(len(t[0]))]


def test_a_branch_follows_the_tree_and_adds_only_what_it_lacks():
    """Prompt lookup's continuation merged into a tree: the tokens the tree holds are followed, the
    rest hang below them as new nodes, none twice, none past the branch's length."""
    import jax.numpy as jnp

    from dflash_jax.tree import add_branch

    rng = np.random.default_rng(0)
    tree = _random_tree(rng)
    for row in range(3):
        nodes = _nodes(tree, row)
        # a branch that starts along the tree's best path for two tokens, then leaves it
        first = next(i for i, n in enumerate(nodes) if n[1] == -1 and n[3])
        second = next(i for i, n in enumerate(nodes) if n[1] == first and n[3])
        branch = [nodes[first][0], nodes[second][0], 5, 5]
        for num in (0, 1, 3, 4):
            merged = add_branch(tree, jnp.asarray([branch] * 3), jnp.asarray([num] * 3), 4)
            got = _nodes(merged, row)
            assert got[:10] == nodes  # the tree is kept as it was
            new = [n for n in got[10:] if n[3]]
            # plain statement: walk the branch down the tree, add what no child holds
            want, at = [], -1
            for j, token in enumerate(branch[:num]):
                kids = [i for i, n in enumerate(nodes + want) if n[3] and n[1] == at and n[0] == token]
                if kids:
                    at = kids[0]
                else:
                    want.append((token, at, j + 1, True))
                    at = 10 + j
            assert new == want, (row, num)
            assert [got[10 + j] for j in range(4) if got[10 + j][3]] == want  # each at slot 10 + its depth - 1


def test_lookup_branches_hold_each_earlier_occurrences_continuation():
    """``TreeStep(lookup_branches=2)``: where the last tokens occurred twice before, the tree holds
    both continuations as paths below the anchor (the latest first), sharing the prefix they share;
    with one branch only the latest's; with ``periodic`` a continuation goes on past the anchor."""
    import jax.numpy as jnp

    from dflash_jax.ngram import NgramStep
    from dflash_jax.tree import Tree
    from dflash_jax.tree_step import TreeStep

    # "5 6" occurred ending at 4 (then 9 5 6) and at 1 (then 7 5 6); the anchor is the last 6
    tokens = jnp.asarray([[5, 6, 7, 5, 6, 9, 5, 6, 0, 0, 0, 0]], jnp.int32)
    start = jnp.asarray([7], jnp.int32)
    zero = jnp.zeros((1, 1), jnp.int32)
    empty = Tree(zero, zero - 1, zero, jnp.zeros((1, 1), jnp.float32), jnp.zeros((1, 1), bool))  # no valid node

    def paths(branches):
        step = TreeStep(None, 8, NgramStep(4, 1, 4), min_match=2, ngram_nodes=3, lookup_branches=branches)
        tree = step.best(step.with_branch(empty, *step.lookup(tokens, start, 3), 3))
        tok, par, ok = (np.asarray(x)[0].tolist() for x in (tree.tokens, tree.parent, tree.valid))
        out = []
        for i in range(len(tok)):
            if ok[i] and i not in [par[j] for j in range(len(tok)) if ok[j]]:  # a leaf: its path
                path, at = [], i
                while at >= 0:
                    path.insert(0, tok[at])
                    at = par[at]
                out.append(path)
        return out

    assert paths(1) == [[9, 5, 6]]
    assert paths(2) == [[9, 5, 6], [7, 5, 6]]
    # TreeStep.periodic: a continuation that reaches the anchor goes on with the match's period
    loop = jnp.asarray([[5, 6, 5, 6, 0, 0, 0, 0]], jnp.int32)  # "5 6" ended at 1; the anchor is the 6 at 3
    for periodic, want in ((False, [5, 6]), (True, [5, 6, 5])):
        step = TreeStep(None, 8, NgramStep(4, 1, 4), min_match=2, ngram_nodes=3, periodic=periodic)
        tree = step.best(step.with_branch(empty, *step.lookup(loop, jnp.asarray([3], jnp.int32), 3), 3))
        assert np.asarray(tree.tokens)[0][np.asarray(tree.valid)[0]].tolist() == want, periodic


def test_the_ancestor_mask_and_the_walk_follow_the_parents():
    """``ancestor_mask``: a token sees the anchor, its ancestors and itself, padding sees nothing;
    ``accept_walk``: the path a plain walk from the anchor takes, its slots by depth, the bonus."""
    from dflash_jax.tree import accept_walk, ancestor_mask

    rng = np.random.default_rng(1)
    tree = _random_tree(rng, b=4, n=12, k=4, vocab=4)
    mask = np.asarray(ancestor_mask(tree))
    for row in range(4):
        nodes = _nodes(tree, row)
        for i, (_, parent, _, ok) in enumerate(nodes):
            want = np.zeros(13, bool)
            if ok:
                want[0] = want[i + 1] = True
                while parent >= 0:
                    want[parent + 1], parent = True, nodes[parent][1]
            np.testing.assert_array_equal(mask[row, i + 1], want)
        assert mask[row, 0].tolist() == [True] + [False] * 12
    for _ in range(20):
        # target tokens: mostly the tree's own children, sometimes not
        target = rng.integers(0, 4, (4, 13)).astype(np.int32)
        walk = accept_walk(tree, target, 4)
        for row in range(4):
            nodes = _nodes(tree, row)
            slot, path = 0, [0]
            while True:
                kids = [i for i, n in enumerate(nodes) if n[3] and n[1] == slot - 1 and n[0] == target[row, slot]]
                if not kids:
                    break
                slot = kids[0] + 1
                path.append(slot)
            a = len(path) - 1
            assert int(walk.length[row]) == a
            assert np.asarray(walk.path)[row, : a + 1].tolist() == path
            assert int(walk.bonus[row]) == target[row, slot]


def test_the_walks_path_stays_inside_a_tree_smaller_than_the_block():
    """A tree of fewer nodes than the block has draft offsets (``--tree 3`` at block 8): past the
    accepted depth the path points at slots that exist, so the loop's gathers along it (the target
    features written to the drafter's context) read verified rows, not out-of-range fill (a NaN that
    spoiled every later draft)."""
    from dflash_jax.tree import accept_walk

    rng = np.random.default_rng(2)
    tree = _random_tree(rng, b=4, n=3, k=3, vocab=3)
    for _ in range(10):
        walk = accept_walk(tree, rng.integers(0, 3, (4, 4)).astype(np.int32), 7)
        path = np.asarray(walk.path)
        assert path.shape == (4, 8) and path.min() >= 0 and path.max() <= 3
        for row in range(4):  # past the walk's end: the depth, capped at the last slot
            a = int(walk.length[row])
            assert path[row, a + 1 :].tolist() == [min(d, 3) for d in range(a + 1, 8)]


# --- trees in the decoding loop ---

FAMILIES = ["qwen3", "gpt_oss", "qwen3_moe"]  # dense; sliding window with sinks; mixture of experts
# own RoPE per layer kind; latent attention (latent rows compacted); layers reading others' caches
LATER = ["gemma3", "deepseek_v3", "gemma4"]
_TARGETS = {}


def _target(tiny_models, family):
    """``(checkpoint, plain Decoder)`` of a tiny family, made once per session."""
    from dflash_jax import checkpoint
    from dflash_jax.decode import Decoder

    if family not in _TARGETS:
        ck = checkpoint.load_target(tiny_models[family][2])
        _TARGETS[family] = ck, Decoder(ck.params, ck.cfg)
    return _TARGETS[family]


@pytest.fixture(params=FAMILIES + LATER)
def target(request, tiny_models):
    return _target(tiny_models, request.param)


def test_an_oracle_tree_accepts_its_second_branch_whole(target):
    """A tree whose first branch is wrong at once and whose second holds the target's continuation
    (with chosen errors): every round accepts what a chain oracle accepts, so the nodes of the second
    branch saw the right cache and ancestors at the right positions, and the commit moved their keys,
    values into place (a wrong slot corrupts every later round). Ragged batch, stop token, limit."""
    from helpers import OracleTree, expected_rounds, oracle_params

    from dflash_jax.decode import Decoder
    from dflash_jax.speculation import make_plan

    ck, plain = target
    bs, rs = 5, np.random.RandomState(11)
    prompts = [rs.randint(4, 96, n).tolist() for n in (5, 19, 11, 3)]
    greedy = [r.token_ids for r in plain.generate(prompts, 40)]
    errors = [{len(p) + 3, len(p) + 9, len(p) + 10} for p in prompts]
    stop = greedy[1][22]
    step = OracleTree(ck.cfg.vocab_size, bs)
    dec = Decoder(ck.params, ck.cfg, make_plan(step, oracle_params(prompts, greedy, errors)))
    want = plain.generate(prompts, 33, stop_token_ids=[stop])
    got = dec.generate(prompts, 33, stop_token_ids=[stop])
    for p, g, e, w, r in zip(prompts, greedy, errors, want, got):
        assert r.token_ids == w.token_ids
        assert r.acceptance_lengths == expected_rounds(len(p), g, e, bs, 33, stop_ids=(stop,))
    assert sum(bs in r.acceptance_lengths for r in got) >= 2  # whole branches were accepted
    assert got[1].token_ids[-1] == stop


TREE_CASES = [  # budget, prompt lookup, verify widths, skip_drafter, lookup branches
    (3, False, None, False, 1),
    (12, False, None, False, 1),
    (12, True, (1, 2, 5, 13), False, 3),
    (8, True, None, True, 1),
]


# The dense target runs every case (budgets below, at and above the block); each other family the case
# with every part (three lookup branches, widths chosen per round) and one more: the sliding window the
# tree with no drafter, the experts the tree smaller than the block.
CASES_OF = {"qwen3": (0, 1, 2, 3), "gpt_oss": (2, 3), "qwen3_moe": (0, 2), "deepseek_v3": (2,), "gemma4": (2,)}


@pytest.mark.parametrize(
    "family,budget,ngram,widths,skip,branches", [(f, *TREE_CASES[i]) for f, cases in CASES_OF.items() for i in cases]
)
def test_random_drafter_trees_are_token_identical_to_plain(tiny_models, family, budget, ngram, widths, skip, branches):
    """A random DFlash drafter's best-first trees (and prompt lookup's branches; a verify width chosen
    per round from costs): greedy output equals plain decoding, batch of 1 and a ragged batch of 4, at
    the length limit and at a stop token. DeepSeek-V3 and Gemma 4 run the case with every part (three
    lookup branches, widths chosen per round)."""
    from dflash_jax.decode import Decoder
    from dflash_jax.drafter import DrafterConfig, DraftStep, init_drafter_params
    from dflash_jax.ngram import NgramStep
    from dflash_jax.speculation import make_plan
    from dflash_jax.tree_step import TreeStep

    ck, plain = _target(tiny_models, family)
    dcfg = DrafterConfig.for_target(ck.cfg, num_layers=1, block_size=4, mask_token_id=3)
    ngram_step = NgramStep(ngram_max=3) if ngram else None
    step = TreeStep(
        DraftStep(dcfg, ck.cfg), budget, ngram_step, min_match=1, skip_drafter=skip, lookup_branches=branches
    )
    costs = None if widths is None else (1.0, 1.1, 1.3, 2.0)
    plan = make_plan(step, init_drafter_params(dcfg, seed=1), verify_lengths=widths, verify_costs=costs)
    dec = Decoder(ck.params, ck.cfg, plan)
    rs = np.random.RandomState(budget)
    # repetitive prompts, so that prompt lookup finds matches
    prompts = [(rs.randint(4, 12, n).tolist() * 3)[: 3 * n] for n in (4, 9, 2, 6)]
    stop = plain.generate(prompts[1:2], 20)[0].token_ids[12]
    for batch in (prompts[:1], prompts):
        want = plain.generate(batch, 20, stop_token_ids=[stop])
        got = dec.generate(batch, 20, stop_token_ids=[stop])
        for w, g in zip(want, got):
            assert g.token_ids == w.token_ids
            assert sum(g.acceptance_lengths) == len(g.token_ids) - 1
            # each round's verify width: a compiled width (the whole tree without widths), never below its tokens
            assert set(g.verify_widths) <= set(widths or [budget + 1])
            assert len(g.verify_widths) == len(g.acceptance_lengths)
            assert all(a <= v for a, v in zip(g.acceptance_lengths, g.verify_widths))


def test_a_tree_is_refused_by_a_recurrent_target_decoder(tiny_models, monkeypatch):
    from dflash_jax import checkpoint
    from dflash_jax.decode import Decoder
    from dflash_jax.drafter import DrafterConfig, DraftStep, init_drafter_params
    from dflash_jax.speculation import make_plan
    from dflash_jax.tree_step import TreeStep

    ck = checkpoint.load_target(tiny_models["qwen3_5"][2])
    dcfg = DrafterConfig.for_target(ck.cfg, num_layers=1, block_size=4, mask_token_id=3)
    plan = make_plan(TreeStep(DraftStep(dcfg, ck.cfg), 4), init_drafter_params(dcfg, seed=1))
    with pytest.raises(ValueError, match="not supported with linear-attention"):
        Decoder(ck.params, ck.cfg, plan)
    # --tree auto never builds one there, even for a shipped drafter on a CPU: chains
    from dflash_jax import speculation

    assert ck.cfg.has_linear_layers
    monkeypatch.setattr(speculation, "CPU_TREE_BUDGET", 7)  # where a tree is measured faster (0 today)
    shipped = dataclasses.replace(speculation.load("random", ck, ck.tokenizer()), shipped=True)
    assert type(speculation.plan_for(ck, shipped, ck.tokenizer(), tree="auto").step).__name__ == "HybridStep"


def test_a_sorted_tree_lists_its_best_nodes_first_with_parents_before_children():
    """``sort_tree`` (after a prompt-lookup branch scored by its confidence): scores descending,
    padding last, every parent before its children and the same parent-child pairs as before;
    ``path_probability`` is the product of ``node_probability`` along each path."""
    import jax.numpy as jnp

    from dflash_jax.tree import add_branch, node_probability, path_probability, sort_tree

    rng = np.random.default_rng(4)
    tree = _random_tree(rng, b=3, n=9, k=4, vocab=5)
    branch = jnp.asarray(rng.integers(0, 5, (3, 4)), jnp.int32)
    merged = add_branch(tree, branch, jnp.asarray([4, 2, 0]), 4, jnp.log(jnp.full((3, 4), 0.6)))
    out = sort_tree(merged)
    for row in range(3):
        before, after = _nodes(merged, row), _nodes(out, row)
        score = np.asarray(out.score)[row]
        valid = np.asarray(out.valid)[row]
        assert valid.sum() == sum(n[3] for n in before)
        assert not valid[valid.sum() :].any() and np.all(np.diff(score[valid]) <= 0)
        paths = lambda nodes: {  # noqa: E731
            tuple(_path(nodes, i)) for i, n in enumerate(nodes) if n[3]
        }
        assert paths(before) == paths(after)  # the same prefixes
        assert all(n[1] < i for i, n in enumerate(after) if n[3])  # parents first
        p = np.asarray(path_probability(out, node_probability(out)))[row]
        np.testing.assert_allclose(p[valid], np.exp(score[valid]), rtol=1e-5)


def test_a_child_never_sorts_before_its_parent_when_a_log_probability_rounds_above_zero():
    """XLA's CPU exp/log can make a near-certain log-probability a few 1e-8 above 0 (seen in a shipped
    drafter's trees at ``tree_temperature`` 1.5). ``build_tree_with`` caps it at 0, so no child outscores
    its parent; the sorted tree keeps parents first and the accept walk takes the whole chain (before the
    cap, a deep node sorted before its parent and the walk stopped there, losslessly but short).
    ``add_branch`` caps a branch's log-probabilities the same way."""
    import jax.numpy as jnp

    from dflash_jax.tree import Tree, accept_walk, add_branch, build_tree, sort_tree

    k, v = 6, 5
    logp = np.full((1, k, v), -9.0, np.float32)
    logp[0, :, 1] = 4e-8  # the chain 1 1 1 ..., each step "certain" and rounded above 0
    logp[0, :, 2] = -2.0
    tree = sort_tree(build_tree(jnp.asarray(logp), 8))
    nodes = _nodes(tree, 0)
    assert all(n[1] < i for i, n in enumerate(nodes) if n[3])  # parents first
    score, parent = np.asarray(tree.score)[0], np.asarray(tree.parent)[0]
    assert all(score[i] <= score[parent[i]] for i in range(8) if parent[i] >= 0)
    target = jnp.ones((1, 9), jnp.int32)  # the target agrees with the chain everywhere
    assert int(accept_walk(tree, target, k).length[0]) == k
    # add_branch caps a branch's log-probabilities too: a branch that follows node 0 (raising it to 0) and
    # goes on with a token "certain" above 0 must not outscore the node it hangs from
    one = Tree(*(jnp.asarray(x) for x in ([[3]], [[-1]], [[1]], np.asarray([[-0.5]], np.float32), [[True]])))
    merged = add_branch(one, jnp.asarray([[3, 4]]), jnp.asarray([2]), 2, jnp.asarray([[0.0, 1e-7]], jnp.float32))
    out = sort_tree(merged)
    assert [(n[0], n[1]) for n in _nodes(out, 0) if n[3]] == [(3, -1), (4, 0)]  # the parent first


def _path(nodes, i):
    path = []
    while i >= 0:
        path.insert(0, nodes[i][0])
        i = nodes[i][1]
    return path


def test_a_dflash2_tree_scores_children_by_the_selector_and_is_lossless(tiny_models):
    """A DFlash 2 drafter's tree: each node's children are scored by the selector given the node's
    token, so following the best child from the anchor is the selector's greedy walk (``select``), at
    any ``tree_temperature`` (which tempers the greedy tree's scores: ``selector_tree``'s temperature; a
    DFlash drafter's log-probabilities likewise; a sampled tree reads the sampling temperature alone);
    decoding with its trees is token-identical to plain, batch of 3 (gpt-oss: sliding window)."""
    import dataclasses

    import jax
    import jax.numpy as jnp

    from dflash_jax import checkpoint
    from dflash_jax.decode import Decoder
    from dflash_jax.drafter import DrafterConfig, DraftStep, init_drafter_params, select, selector_tree
    from dflash_jax.sampling import Sampling
    from dflash_jax.speculation import make_plan
    from dflash_jax.tree_step import TreeStep

    ck = checkpoint.load_target(tiny_models["gpt_oss"][2])
    base = DrafterConfig.for_target(ck.cfg, num_layers=1, block_size=5, mask_token_id=3)
    dcfg = dataclasses.replace(base, conv_kernel_size=2, conv_group_size=16, selector_rank=4, selector_top_k=6)
    rs = np.random.RandomState(0)
    dparams = jax.tree.map(lambda x: np.asarray(x) + 0.3 * rs.randn(*np.shape(x)), init_drafter_params(dcfg, seed=3))
    step = DraftStep(dcfg, ck.cfg)
    b, s = 2, 64
    cache = step.init_cache(b, s)
    feats = jnp.asarray(rs.randn(b, 12, len(dcfg.target_layer_ids) * ck.cfg.hidden_size), jnp.float32)
    cache = step.write_context(dparams, cache, feats, jnp.zeros((b,), jnp.int32))
    anchor, start, valid = jnp.asarray([5, 9]), jnp.asarray([12, 12]), jnp.asarray([5, 5])
    tokens = jnp.zeros((b, s + 5), jnp.int32)
    hidden, scores = step._forward(dparams, ck.params, cache, anchor, start, valid, 5, tokens)
    walk = np.asarray(select(dparams, dcfg, hidden, scores, anchor, 0.0)[0])
    trees = {}
    for t in (1.0, 1.7):  # a tree temperature tempers the scores (the tree's shape), never the walk
        tempered = DraftStep(dataclasses.replace(dcfg, tree_temperature=t), ck.cfg)
        trees[t] = tree = tempered.tree(
            dparams, ck.params, cache, anchor, start, valid, 5, 60, tokens=tokens, sampling=None
        )
        want = selector_tree(dparams, dcfg, hidden, scores, anchor, 60, t)
        assert all(np.array_equal(x, y) for x, y in zip(tree, want))
        for row in range(b):
            nodes, at, best = _nodes(tree, row), -1, []
            while True:  # the best child: the first one added (children are added best first)
                kids = [i for i, n in enumerate(nodes) if n[3] and n[1] == at]
                if not kids:
                    break
                at = kids[0]
                best.append(nodes[at][0])
            assert best == walk[row, : len(best)].tolist() and len(best) >= 3, (best, walk[row])
    # a DFlash drafter's greedy tree reads its log-probabilities at the tree temperature too
    from dflash_jax.tree import build_tree

    plain_params = init_drafter_params(base, seed=5)
    flat = DraftStep(dataclasses.replace(base, tree_temperature=2.0), ck.cfg)
    pcache = flat.write_context(plain_params, flat.init_cache(b, s), feats, jnp.zeros((b,), jnp.int32))
    pargs = (plain_params, ck.params, pcache, anchor, start, valid, 5)
    got = flat.tree(*pargs, 12, tokens=tokens, sampling=None)
    logits = DraftStep(base, ck.cfg).logits(*pargs, tokens=tokens)
    want = build_tree(jax.nn.log_softmax(logits / 2.0, -1), 12)
    assert all(np.array_equal(x, y) for x, y in zip(got, want))
    assert not np.array_equal(got.score, build_tree(jax.nn.log_softmax(logits, -1), 12).score)
    # a sampled tree is scored at the sampling temperature, whatever the drafter's tree_temperature
    hot = Sampling(temperature=0.7)
    tempered = DraftStep(dataclasses.replace(dcfg, tree_temperature=1.7), ck.cfg)
    args = (dparams, ck.params, cache, anchor, start, valid, 5, 60)
    sampled = [x.tree(*args, tokens=tokens, sampling=hot) for x in (step, tempered)]
    assert all(np.array_equal(x, y) for x, y in zip(*sampled))
    # node 0 is the anchor's best child, the walk's first token at either temperature: a flatter q gives the
    # top candidate less (the top of softmax(s / T) falls as T grows)
    assert np.array_equal(trees[1.0].tokens[:, 0], trees[1.7].tokens[:, 0])
    assert (np.asarray(trees[1.7].score[:, 0]) < np.asarray(trees[1.0].score[:, 0])).all()
    plain = Decoder(ck.params, ck.cfg)
    dec = Decoder(ck.params, ck.cfg, make_plan(TreeStep(step, 8), dparams))
    prompts = [rs.randint(4, 96, n).tolist() for n in (6, 13, 3)]
    for w, g in zip(plain.generate(prompts, 24), dec.generate(prompts, 24)):
        assert g.token_ids == w.token_ids


def test_choose_tree_width_counts_the_best_nodes_per_cost_row_by_row():
    """A verify of the anchor and the first n nodes commits 1 + the sum of their acceptance
    probabilities in expectation; each row picks its own width, the batch the widest active pick."""
    import jax.numpy as jnp

    from dflash_jax.decode import choose_tree_width

    path_p = jnp.asarray([[0.9, 0.8, 0.7, 0.6, 0.5, 0.1, 0.1], [0.1, 0.05, 0, 0, 0, 0, 0]], jnp.float32)
    widths, costs = (1, 2, 4, 8), jnp.asarray([1.0, 1.2, 1.6, 2.4])
    want = []
    for row in np.asarray(path_p):
        gain = [(1 + row[: w - 1].sum()) / c for w, c in zip(widths, np.asarray(costs))]
        want.append(widths[int(np.argmax(gain))])
    assert want == [4, 1]
    for active, batch in (([True, True], 2), ([False, True], 0)):
        index, rows = choose_tree_width(path_p, jnp.asarray(active), widths, costs)
        assert int(index) == batch and rows.tolist() == want


def test_tree_plans_and_their_checks(tiny_models, tmp_path, monkeypatch):
    """``plan_for(tree=N)``: a DFlash drafter's tree with prompt lookup's branch (or without), verify
    widths up to the whole tree on a CPU (its costs timed on the tree verify); bad requests refused
    in one line naming the fix."""
    from transformers import AutoTokenizer

    from dflash_jax import checkpoint, speculation
    from dflash_jax.decode import Decoder
    from dflash_jax.ngram import NgramStep
    from dflash_jax.speculation import make_plan, parse_tree, plan_for
    from dflash_jax.tree_step import TreeStep

    monkeypatch.setenv("DFLASH_JAX_VERIFY_COSTS", str(tmp_path / "costs.json"))
    _, hf_dir, path = tiny_models["qwen3"]
    ck, tok = checkpoint.load_target(path), AutoTokenizer.from_pretrained(str(hf_dir))
    plan = plan_for(ck, "random", tok, tree=12)
    assert isinstance(plan.step, TreeStep) and plan.step.ngram is not None and plan.step.tree_size == 12
    assert plan.verify_lengths == (1, 2, 4, 8, 13) and "tree of 12 nodes with prompt-lookup branches" in plan.label
    assert plan.step.skip_drafter  # on a CPU a row with a match takes the branch alone
    assert plan.step.lookup_branches == speculation.TREE_LOOKUP_BRANCHES == 3
    both = plan_for(ck, "random", tok, tree=12, skip_drafter=False)  # bench's tree16+lookup: both in every row
    assert both.step.ngram is not None and not both.step.skip_drafter
    alone = plan_for(ck, "random", tok, tree="12", prompt_lookup=False, verify_lengths=None)
    assert alone.step.ngram is None and alone.verify_lengths == ()
    assert plan_for(ck, "random", tok, tree="off").step.__class__.__name__ == "HybridStep"
    dec = Decoder(ck.params, ck.cfg, plan)
    costs = dec.costs_for(dec.shape_for([7], 8)).tolist()  # timed on the tree verify at each width
    assert len(costs) == 5 and costs[0] == 1.0 and costs == sorted(costs)
    assert parse_tree(None) == parse_tree("off") == 0 and parse_tree("16") == 16 and parse_tree("auto") == "auto"
    # --tree auto: a tree where one is measured faster (the shipped drafter on a CPU, with prompt lookup, greedy):
    # today nowhere (CPU_TREE_BUDGET 0), so chains; the rule, with the 7 nodes stage 6 was measured faster at
    shipped = dataclasses.replace(speculation.load("random", ck, tok), shipped=True)
    assert speculation.CPU_TREE_BUDGET == 0 and type(plan_for(ck, shipped, tok).step).__name__ == "HybridStep"
    asked = plan_for(ck, shipped, tok, tree=7)  # the tree stage 6 verified by default: the chains' block and widths
    assert asked.block_size == min(speculation.CPU_BLOCK_SIZE, shipped.cfg.block_size) and asked.step.skip_drafter
    assert asked.verify_lengths == (1, 2, 4, 8)
    monkeypatch.setattr(speculation, "CPU_TREE_BUDGET", 7)
    auto = plan_for(ck, shipped, tok, tree="auto")
    assert isinstance(auto.step, TreeStep) and auto.step.tree_size == 7 and auto.step.skip_drafter
    assert (auto.block_size, auto.verify_lengths) == (asked.block_size, asked.verify_lengths)
    assert type(plan_for(ck, shipped, tok, tree="auto", backend="tpu").step).__name__ == "HybridStep"
    assert type(plan_for(ck, shipped, tok, tree="auto", prompt_lookup=False).step).__name__ == "DraftStep"
    assert type(plan_for(ck, shipped, tok, tree="auto", sampled=True).step).__name__ == "HybridStep"  # greedy only
    for asked in (dict(block_size=16), dict(verify_lengths=[1, 4, 16])):  # the user's block or widths: chains
        assert type(plan_for(ck, shipped, tok, tree="auto", **asked).step).__name__ == "HybridStep"
    assert type(plan_for(ck, "random", tok, tree="auto").step).__name__ == "HybridStep"  # not the shipped one
    assert plan_for(ck, "none", tok, tree="auto") is None
    for bad in ("1", "many", 2.5):
        with pytest.raises(ValueError, match="--tree takes off, auto or a node budget of 2 or more"):
            parse_tree(bad)
    import argparse

    from dflash_jax.cli import _tree_arm  # bench --tree-arms

    assert _tree_arm("16") == (16, False) and _tree_arm("32+lookup") == (32, True)
    for bad in ("16+ngram", "1+lookup", "+lookup", "x", "auto", "auto+lookup"):
        with pytest.raises(argparse.ArgumentTypeError, match="alone .16. or as 16\\+lookup"):
            _tree_arm(bad)
    with pytest.raises(ValueError, match="a draft tree is built from a DFlash drafter.*or --tree off"):
        plan_for(ck, "ngram", tok, tree=8)
    with pytest.raises(ValueError, match="--tree 8: --drafter none decodes plainly here; pass a drafter or --tree off"):
        plan_for(ck, "none", tok, tree=8)
    assert plan_for(ck, "none", tok, tree="off") is None
    with pytest.raises(ValueError, match=r"must lie in \[1, 9\] for a tree of 8 nodes"):
        make_plan(plan_for(ck, "random", tok, tree=8).step, verify_lengths=(1, 12))
    with pytest.raises(ValueError, match="the prompt-lookup branch needs at least 1 node"):
        TreeStep(plan.step.dflash, 3, NgramStep(), ngram_nodes=0)
    with pytest.raises(ValueError, match="a budget of at least 1 node"):
        TreeStep(plan.step.dflash, 0)
