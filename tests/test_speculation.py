"""Verifying fewer tokens when fewer pay (a plan's ``verify_lengths``) and drafting with DFlash
and prompt lookup together (``HybridStep``): both stay lossless, and each does what it says.

Greedy: token-identical to plain decoding (test_ngram's tiny target, whose output repeats itself).
Sampled: the target's distribution (exact enumeration + chi-square, test_ngram's tiny target).
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_ngram import _prompts, chi_square_p, exact_joint, sampled_joint, target, tiny  # noqa: F401

from dflash_jax.decode import (
    CALIBRATION_BINS,
    Decoder,
    calibrate,
    choose_verify_length,
    update_calibration,
)
from dflash_jax.drafter import DrafterConfig, DraftStep, init_drafter_params
from dflash_jax.ngram import HybridStep, NgramStep, ngram_match
from dflash_jax.sampling import GREEDY, Sampling
from dflash_jax.speculation import AUTO_VERIFY_LENGTHS, make_plan

P_REJECT = 1e-3


def test_choose_verify_length_maximises_expected_tokens_per_cost_row_by_row():
    conf = jnp.asarray([[0.9, 0.9, 0.9, 0.1, 0.1, 0.1, 0.1], [0.15, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1]], jnp.float32)
    lengths, costs = (1, 2, 4, 8), jnp.asarray([1.0, 1.2, 1.5, 1.8])
    num = jnp.asarray([7, 7], jnp.int32)

    def expected(c, n, length):  # 1 + sum over k < length of P(the first k accepted)
        return 1 + sum(np.prod(c[:k]) for k in range(1, min(length - 1, n) + 1))

    want = [int(np.argmax([expected(np.asarray(conf[b]), 7, n) / c for n, c in zip(lengths, costs)])) for b in range(2)]
    assert want == [2, 0]  # row 0: 4 tokens pay; row 1: a plain step
    for active, batch in (([True, False], 2), ([False, True], 0), ([True, True], 2)):
        index, rows = choose_verify_length(conf, num, jnp.asarray(active), lengths, costs)
        assert int(index) == batch and rows.tolist() == [lengths[w] for w in want]  # a row's pick is its own
    # a short real draft caps the expectation: nothing past num_draft counts
    index, rows = choose_verify_length(jnp.ones((1, 7)), jnp.asarray([1]), jnp.asarray([True]), lengths, costs)
    assert int(index) == 1 and rows.tolist() == [2]


def test_calibration_counts_what_the_target_checked_and_corrects_the_confidence():
    """``update_calibration`` counts a checked offset only when every earlier one was accepted;
    ``calibrate`` starts at the step's confidence and moves to the row's observed acceptance, and
    the verify length follows it: a row whose confident drafts keep failing falls back to a plain step."""
    conf = jnp.asarray([[0.95, 0.95, 0.95, 0.55], [0.35, 0.35, 0.35, 0.35]], jnp.float32)
    stats = jnp.zeros((2, CALIBRATION_BINS, 2), jnp.float32)
    np.testing.assert_allclose(calibrate(conf, stats), conf, rtol=1e-6)  # no history: the step's own
    # row 0 checked 4 offsets, accepted 2 (offset 3 rejected, offset 4 unseen); row 1 checked 1, accepted 1
    after = update_calibration(stats, conf, jnp.asarray([2, 1]), jnp.asarray([4, 1]))
    assert after[0, 9].tolist() == [3.0, 2.0] and after[0, 5].tolist() == [0.0, 0.0]
    assert after[1, 3].tolist() == [1.0, 1.0] and float(after.sum()) == 7.0
    got = calibrate(conf, after)
    np.testing.assert_allclose(got[0, :3], (2 + 4 * 0.95) / (3 + 4), rtol=1e-6)
    np.testing.assert_allclose(got[1], (1 + 4 * 0.35) / (1 + 4), rtol=1e-6)
    lengths, costs, num = (1, 2, 4), jnp.asarray([1.0, 1.6, 2.3]), jnp.asarray([4, 4])
    one = conf[:1]
    assert choose_verify_length(one, num[:1], jnp.asarray([True]), lengths, costs)[1].tolist() == [4]
    failing = stats[:1]
    for _ in range(10):  # every round: offset 1 checked and rejected
        failing = update_calibration(failing, one, jnp.asarray([0]), jnp.asarray([3]))
    index, rows = choose_verify_length(calibrate(one, failing), num[:1], jnp.asarray([True]), lengths, costs)
    assert rows.tolist() == [1] and int(index) == 0


def test_calibration_changes_no_token(target):  # noqa: F811
    """An over-confident step (prompt lookup trusted fully) with and without online calibration:
    the same greedy tokens as plain decoding, and calibration verifies fewer tokens per round."""
    ck, plain = target
    prompts = _prompts(3)
    want = [r.token_ids for r in plain.generate(prompts, 40)]
    step = NgramStep(block_size=8, confidence=0.99)
    kw = dict(block_size=8, verify_lengths=(1, 2, 4), verify_costs=(1.0, 1.6, 2.3, 2.6))
    trusting = Decoder(ck.params, ck.cfg, make_plan(step, calibrate=False, **kw)).generate(prompts, 40)
    calibrated = Decoder(ck.params, ck.cfg, make_plan(step, **kw)).generate(prompts, 40)
    assert [r.token_ids for r in trusting] == want == [r.token_ids for r in calibrated]
    rounds = [sum(len(r.acceptance_lengths) for r in out) for out in (trusting, calibrated)]
    assert rounds[0] != rounds[1], rounds  # the calibrated policy chose other verify lengths


DFLASH2 = dict(conv_kernel_size=2, conv_group_size=16, selector_rank=4, selector_top_k=3)


def _dflash(ck, bs=8, **dflash2):
    dcfg = DrafterConfig.for_target(ck.cfg, num_layers=1, block_size=bs, mask_token_id=3, **dflash2)
    return init_drafter_params(dcfg, seed=0), dcfg


@pytest.mark.parametrize(
    "which", ["ngram", "dflash", "hybrid", "hybrid_dflash2", "hybrid_drafter_block", "hybrid_dflash2_drafter_block"]
)
def test_greedy_is_lossless_whatever_length_is_verified(target, which):  # noqa: F811
    ck, plain = target
    prompts = _prompts(8)
    want = [r.token_ids for r in plain.generate(prompts, 40, stop_token_ids=(5,))]
    params, dcfg = _dflash(ck, **(DFLASH2 if which.startswith("hybrid_dflash2") else {}))
    drafter_block = 4 if which.endswith("drafter_block") else None  # the drafter at 4 in rounds of 8
    hybrid = HybridStep(DraftStep(dcfg, ck.cfg), NgramStep(block_size=8, confidence=0.7), drafter_block=drafter_block)
    step, params = {
        "ngram": (NgramStep(block_size=8, confidence=0.7), None),
        "dflash": (DraftStep(dcfg, ck.cfg), params),
    }.get(which, (hybrid, params))
    full = Decoder(ck.params, ck.cfg, make_plan(step, params, block_size=8))
    short_plan = make_plan(
        step, params, block_size=8, verify_lengths=(1, 2), verify_costs=(1, 1.2, 2.5), calibrate=False
    )
    short = Decoder(ck.params, ck.cfg, short_plan)
    cheap = Decoder(
        ck.params, ck.cfg, make_plan(step, params, block_size=8, verify_lengths=(1, 4), verify_costs=(1, 1, 1))
    )
    assert short.verify_lengths == (1, 2, 8) and cheap.verify_lengths == (1, 4, 8)
    got_full, got_short, got_cheap = (d.generate(prompts, 40, (5,)) for d in (full, short, cheap))
    assert [r.token_ids for r in got_full] == want and [r.token_ids for r in got_short] == want
    assert [r.token_ids for r in got_cheap] == want
    # At equal costs the longest verify always pays at least as much: the rounds of the full loop.
    assert [r.acceptance_lengths for r in got_cheap] == [r.acceptance_lengths for r in got_full]
    # With lengths (1, 2, 8) at costs (1, 1.2, 2.5), verifying 2 beats 8 for confidence-0.7 (or lower)
    # drafts (1.7 / 1.2 > 3.14 / 2.5), so no round commits more than 2 tokens, though the full loop
    # commits more on these prompts (the confidences as the step gives them: calibrate=False).
    assert max(a for r in got_short for a in r.acceptance_lengths) <= 2
    if which != "dflash":  # (a random drafter's draft is rejected anyway)
        assert max(a for r in got_full for a in r.acceptance_lengths) > 2


def test_verify_lengths_are_checked(target, tmp_path, monkeypatch):  # noqa: F811
    from dflash_jax import decode

    monkeypatch.setenv("DFLASH_JAX_VERIFY_COSTS", str(tmp_path / "costs.json"))  # the measured costs are kept here
    ck, _ = target
    with pytest.raises(ValueError, match=r"must lie in \[1, block size 8\]"):
        Decoder(ck.params, ck.cfg, make_plan(NgramStep(block_size=8), verify_lengths=(1, 9)))
    with pytest.raises(ValueError, match="one positive cost per verify length"):
        Decoder(ck.params, ck.cfg, make_plan(NgramStep(block_size=8), verify_lengths=(1, 4), verify_costs=(1, 2)))
    auto = Decoder(ck.params, ck.cfg, make_plan(NgramStep(block_size=8), verify_lengths="auto"))
    assert auto.verify_lengths == tuple(n for n in AUTO_VERIFY_LENGTHS if n <= 8)  # tests run on a CPU
    # without costs they are measured on this machine, per shape (the shortest is the unit), and
    # passed to the compiled loop as an argument: new timings never recompile it
    shape = auto.shape_for([5, 9], 16)
    costs = auto.costs_for(shape).tolist()
    assert costs[0] == 1.0 and costs == sorted(costs) and len(costs) == len(auto.verify_lengths)
    assert "verify_costs" not in repr(shape) and auto.costs_for(shape).tolist() == costs  # kept per shape
    # ... and per machine: another Decoder (another process) reads them instead of timing again
    init_cache = decode.init_cache
    kept = decode.read_verify_costs()
    assert list(kept) == [auto.cost_key(shape.batch, shape.cache_len)]
    np.testing.assert_array_equal(np.asarray(kept[list(kept)[0]], np.float32), costs)
    again = Decoder(ck.params, ck.cfg, make_plan(NgramStep(block_size=8), verify_lengths="auto"))
    monkeypatch.setattr(decode, "init_cache", lambda *a: pytest.fail("the costs were timed again"))
    assert again.costs_for(shape).tolist() == costs
    assert again.cost_key(shape.batch, 512) != again.cost_key(shape.batch, shape.cache_len)  # another shape
    # a damaged entry (not one finite positive cost per length) is timed again, not used or a crash
    for bad in (5, "abc", ["1", "x", "2"], [0] * len(costs), [1, -5] + costs[2:], [1, float("nan")] + costs[2:]):
        assert decode._valid_costs(bad, len(costs)) is None
    monkeypatch.setattr(decode, "init_cache", init_cache)  # timing allowed again
    (tmp_path / "costs.json").write_text(json.dumps({again.cost_key(shape.batch, shape.cache_len): 5}))
    timed = Decoder(ck.params, ck.cfg, make_plan(NgramStep(block_size=8), verify_lengths="auto")).costs_for(shape)
    assert timed[0] == 1.0 and len(timed) == len(costs) and decode._valid_costs(timed, len(costs)) is not None


def test_hybrid_takes_prompt_lookup_where_it_matches_and_the_drafter_elsewhere(target):  # noqa: F811
    ck, _ = target
    params, dcfg = _dflash(ck)
    dstep = DraftStep(dcfg, ck.cfg)
    step = HybridStep(dstep, NgramStep(block_size=8, confidence=0.7), min_match=2)
    tokens = jnp.asarray(
        [
            [6, 7, 8, 9, 6, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            [6, 7, 8, 9, 10, 11, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        ],
        jnp.int32,
    )
    start = jnp.asarray([5, 5], jnp.int32)
    cache = dstep.write_context(
        params,
        dstep.init_cache(2, 24),
        jnp.ones((2, 5, len(dcfg.target_layer_ids) * ck.cfg.hidden_size)),
        jnp.zeros((2,), jnp.int32),
    )
    args = (params, ck.params, cache, tokens[:, 5], start, jnp.asarray([8, 8]), 8)
    draft, num, conf, *_ = step.propose(*args, tokens=tokens, key=None, sampling=GREEDY)
    ng, ng_num, matched = ngram_match(tokens, start, 7, 4, 1)
    assert matched.tolist() == [2, 0] and ng_num.tolist() == [4, 0]
    alone, _, dconf, *_ = dstep.propose(*args, tokens=None, key=None, sampling=GREEDY)
    np.testing.assert_array_equal(draft[0, :4], [8, 9, 6, 7])  # row 0: "6 7" occurred before -> "8 9 6 7"
    np.testing.assert_array_equal(draft[1], alone[1])  # row 1: no match -> the drafter
    assert num.tolist() == [4, 7]
    np.testing.assert_allclose(conf[0], [0.7, 0.7, 0.7, 0.7, 0, 0, 0])
    np.testing.assert_allclose(conf[1], dconf[1], rtol=1e-6)
    # sampled: the n-gram row is its point mass, the drafter row the drafter's own draw and q
    keys = jax.random.split(jax.random.key(0), 2)
    sampled = step.propose(*args, tokens=tokens, key=keys, sampling=Sampling(0.8))
    own = dstep.propose(*args, tokens=None, key=keys, sampling=Sampling(0.8))
    assert sampled.num.tolist() == [4, 7] and int(jnp.argmax(sampled.q[0, 0])) == int(ng[0, 0])
    np.testing.assert_array_equal(sampled.tokens[0, :4], [8, 9, 6, 7])
    np.testing.assert_array_equal(sampled.tokens[1], own.tokens[1])
    np.testing.assert_allclose(sampled.q[1], own.q[1], rtol=1e-5, atol=1e-7)  # the same forward, fused otherwise


def test_hybrid_drafts_at_its_own_smaller_block_while_prompt_lookup_copies_the_rounds(target):  # noqa: F811
    """``drafter_block``: in a round of 8 the drafter's rows are its draft at block 4 (3 real tokens, the rest
    padding of confidence 0 that is never accepted), greedy and sampled; prompt lookup's rows copy up to 7."""
    ck, _ = target
    params, dcfg = _dflash(ck)
    dstep = DraftStep(dcfg, ck.cfg)
    step = HybridStep(dstep, NgramStep(block_size=8, confidence=0.7), min_match=2, drafter_block=4)
    tokens = (
        jnp.zeros((2, 30), jnp.int32)
        .at[:, :10]
        .set(jnp.asarray([[6, 7, 8, 9, 10, 11, 12, 13, 6, 7], [6, 7, 8, 9, 10, 11, 12, 13, 14, 15]]))
    )
    start = jnp.asarray([9, 9], jnp.int32)
    feats = jnp.ones((2, 9, len(dcfg.target_layer_ids) * ck.cfg.hidden_size))
    cache = dstep.write_context(params, dstep.init_cache(2, 28), feats, jnp.zeros((2,), jnp.int32))
    args = (params, ck.params, cache, tokens[:, 9], start, jnp.asarray([8, 8]))
    draft, num, conf, *_ = step.propose(*args, 8, tokens=tokens, key=None, sampling=GREEDY)
    alone, _, dconf, *_ = dstep.propose(*args[:5], jnp.asarray([4, 4]), 4, tokens=None, key=None, sampling=GREEDY)
    assert num.tolist() == [7, 3]  # row 0: "6 7" occurred before, its 7 next tokens copied; row 1: the drafter's 3
    np.testing.assert_array_equal(draft[0], [8, 9, 10, 11, 12, 13, 6])
    np.testing.assert_array_equal(draft[1], [*np.asarray(alone[1]), 0, 0, 0, 0])
    np.testing.assert_allclose(conf[1, :3], dconf[1], rtol=1e-6)
    np.testing.assert_array_equal(conf[1, 3:], 0.0)
    keys = jax.random.split(jax.random.key(0), 2)
    sampled = step.propose(*args, 8, tokens=tokens, key=keys, sampling=Sampling(0.8))
    own = dstep.propose(*args[:5], jnp.asarray([4, 4]), 4, tokens=None, key=keys, sampling=Sampling(0.8))
    assert sampled.num.tolist() == [7, 3] and sampled.q.shape == (2, 7, ck.cfg.vocab_size)
    np.testing.assert_array_equal(sampled.tokens[1, :3], own.tokens[1])
    np.testing.assert_allclose(sampled.q[1, :3], own.q[1], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.asarray(sampled.q).sum(-1), 1.0, rtol=1e-5)  # a distribution at every offset
    with pytest.raises(ValueError, match="drafter_block must be in \\[2, the drafter's 8\\], got 9"):
        HybridStep(dstep, NgramStep(block_size=8), drafter_block=9)


def test_hybrid_drafts_a_dflash2_drafters_rows_through_its_selector_walk(target):  # noqa: F811
    """A DFlash 2 drafter's rows take its selector's walk (``DraftStep.propose``), not the argmax of
    its logits; under sampling its rows take the walk's draw and q, the n-gram rows a point mass."""
    ck, _ = target
    params, dcfg = _dflash(ck, **DFLASH2)
    rs = np.random.RandomState(1)  # a selector strong enough that its walk leaves the unary argmax
    for name in ("predecessor_codebook", "successor_codebook", "hidden_projection"):
        params[name] = jnp.asarray(10.0 * rs.randn(*np.shape(params[name])), jnp.float32)
    dstep = DraftStep(dcfg, ck.cfg)
    step = HybridStep(dstep, NgramStep(block_size=8, confidence=0.7), min_match=2)
    tokens = jnp.zeros((2, 26), jnp.int32).at[:, :6].set(jnp.asarray([[6, 7, 8, 9, 6, 7], [6, 7, 8, 9, 10, 11]]))
    start = jnp.asarray([5, 5], jnp.int32)
    feats = jnp.asarray(rs.randn(2, 5, len(dcfg.target_layer_ids) * ck.cfg.hidden_size), jnp.float32)
    cache = dstep.write_context(params, dstep.init_cache(2, 24), feats, jnp.zeros((2,), jnp.int32))
    args = (params, ck.params, cache, tokens[:, 5], start, jnp.asarray([8, 8]), 8)
    greedy = dict(key=None, sampling=GREEDY)
    walk, _, walk_conf, *_ = dstep.propose(*args, tokens=None, **greedy)
    argmax = jnp.argmax(dstep.logits(*args), -1)
    assert not np.array_equal(walk[1], argmax[1])  # the walk is not the logits' argmax here
    draft, num, conf, *_ = step.propose(*args, tokens=tokens, **greedy)
    np.testing.assert_array_equal(draft[0, :4], [8, 9, 6, 7])  # row 0: prompt lookup
    np.testing.assert_array_equal(draft[1], walk[1])  # row 1: the selector's walk
    assert num.tolist() == [4, 7]
    np.testing.assert_allclose(conf[1], walk_conf[1], rtol=1e-6)
    keys = jax.random.split(jax.random.key(0), 2)
    sampled, num, conf, q, _ = step.propose(*args, tokens=tokens, key=keys, sampling=Sampling(0.8))
    alone, all_seven, conf_alone, q_alone, _ = dstep.propose(*args, tokens=None, key=keys, sampling=Sampling(0.8))
    np.testing.assert_array_equal(sampled[1], alone[1])
    np.testing.assert_allclose(q[1], q_alone[1], rtol=1e-6)
    np.testing.assert_allclose(conf[1], conf_alone[1], rtol=1e-6)
    np.testing.assert_array_equal(sampled[0, :4], [8, 9, 6, 7])
    np.testing.assert_array_equal(q[0, jnp.arange(4), sampled[0, :4]], 1.0)  # the n-gram rows: a point mass
    assert float(q[0].sum()) == 7.0 and num.tolist() == [4, 7] and all_seven.tolist() == [7, 7]
    # The confidence (which picks the verify length) must not depend on the draws: q at offset j + 1
    # follows the token drawn at j, and a length chosen from it biases the output (the rejection rule
    # is exact for a length fixed before the draws). Other keys: other draws and q, the same confidence.
    # (with a weaker selector, whose walks differ between the keys; the cache does not read the selector)
    weak = dict(params, **{n: params[n] / 100 for n in ("predecessor_codebook", "successor_codebook")})
    other = jax.random.split(jax.random.key(7), 2)
    hot = Sampling(5.0)
    walk_a, _, conf_a, q_a, _ = dstep.propose(weak, *args[1:], tokens=None, key=keys, sampling=hot)
    walk_b, _, conf_b, q_b, _ = dstep.propose(weak, *args[1:], tokens=None, key=other, sampling=hot)
    assert not np.array_equal(np.asarray(walk_a), np.asarray(walk_b)) and not np.allclose(q_a, q_b)
    np.testing.assert_array_equal(conf_a, conf_b)
    hybrid_a, hybrid_b = (step.propose(weak, *args[1:], tokens=tokens, key=k, sampling=hot) for k in (keys, other))
    np.testing.assert_array_equal(hybrid_a.confidence, hybrid_b.confidence)


def test_hybrid_skips_the_drafter_when_every_row_has_a_match(target):  # noqa: F811
    ck, _ = target
    params, dcfg = _dflash(ck)
    dstep = DraftStep(dcfg, ck.cfg)
    step = HybridStep(dstep, NgramStep(block_size=8), min_match=1)
    tokens = jnp.asarray([[6, 7, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]], jnp.int32)
    start = jnp.asarray([2], jnp.int32)
    calls = []
    real = DraftStep._forward  # the drafter's forward, which propose and logits run

    def counted(self, *a, **k):
        calls.append(1)
        return real(self, *a, **k)

    DraftStep._forward = counted
    try:
        jaxpr = str(
            jax.make_jaxpr(
                lambda t: step.propose(
                    params,
                    ck.params,
                    dstep.init_cache(1, 16),
                    t[:, 2],
                    start,
                    jnp.asarray([8]),
                    8,
                    tokens=t,
                    key=None,
                    sampling=GREEDY,
                )
            )(tokens)
        )
    finally:
        DraftStep._forward = real
    assert "cond" in jaxpr and calls  # the drafter sits in a branch the loop takes only when a row needs it
    # ... and the branch is skipped exactly when no row needs the drafter
    assert bool(step._lookup(tokens, start, jnp.asarray([8]), 7)[4])  # the last token (6) occurred before
    miss = tokens.at[0, 2].set(5)  # 5 never occurred before: this row needs the drafter
    assert not bool(step._lookup(miss, start, jnp.asarray([8]), 7)[4])
    assert bool(step._lookup(miss, start, jnp.asarray([1]), 7)[4])  # unless the row is finished


@pytest.mark.parametrize(
    "lengths, dflash2, drafter_block",
    [(None, {}, None), ((1, 2), {}, None), (None, DFLASH2, None), ((1, 3), DFLASH2, None), (None, {}, 2)],
    ids=["full", "short", "dflash2", "dflash2-short", "drafter-block-2"],
)
def test_sampling_keeps_the_target_distribution(tiny, lengths, dflash2, drafter_block):  # noqa: F811
    """The hybrid under sampling: n-gram rows a point mass, DFlash rows the drafter's q (DFlash 2:
    its selector walk's draw and q, over 3 candidates of the 8 tokens, a confident head and a
    selector strong enough that the walk's q moves with its draws; with verify lengths, chosen
    from a confidence that does not)."""
    cfg, params = tiny
    s = Sampling(0.8)
    dcfg = DrafterConfig.for_target(cfg, num_layers=1, block_size=4, mask_token_id=0, target_layer_ids=(0,), **dflash2)
    dparams = init_drafter_params(dcfg, seed=0)
    if dflash2:
        rs = np.random.RandomState(3)
        dparams = jax.tree.map(lambda x: np.asarray(x) * 3.0 + 0.2 * rs.randn(*np.shape(x)), dparams)
        for name in ("predecessor_codebook", "successor_codebook", "hidden_projection"):
            dparams[name] = rs.randn(*np.shape(dparams[name])).astype(np.float32)
    step = HybridStep(DraftStep(dcfg, cfg), NgramStep(block_size=4, confidence=0.7), 1, drafter_block=drafter_block)
    # fixed costs, not timed: the test sees the same rounds anywhere
    costs = None if not lengths else (1.0, 1.8, 1.8) if dflash2 else (1.0, 1.2, 1.6)
    dec = Decoder(params, cfg, make_plan(step, dparams, verify_lengths=lengths, verify_costs=costs), sampling=s)
    counts, multi = sampled_joint(dec)
    assert multi > 0  # drafts were accepted
    assert chi_square_p(counts, exact_joint(cfg, params, s)) > P_REJECT
    assert chi_square_p(counts, exact_joint(cfg, params, Sampling(1.2))) < P_REJECT  # the check has teeth


def test_prompt_lookup_confidence_by_matched_length():
    step = NgramStep(ngram_max=2, ngram_min=1, block_size=5, confidence=((0.2, 0.5), (0.9, 0.95)))
    conf = np.asarray(step.token_confidence(jnp.asarray([1, 2, 2, 0]), jnp.asarray([4, 4, 2, 0]), 4))
    np.testing.assert_allclose(conf, [[0.2, 0.5, 0.5, 0.5], [0.9, 0.95, 0.95, 0.95], [0.9, 0.95, 0, 0], [0, 0, 0, 0]])
    with pytest.raises(ValueError, match="2 \\(first, later\\) probability pairs"):
        NgramStep(ngram_max=2, confidence=((0.2, 0.5),))


def test_the_plans_users_ask_for(tiny_models, tmp_path):
    """``plan_for``: what each ``--drafter`` value and the prompt-lookup flag give, with its label."""
    from dflash_jax import checkpoint
    from dflash_jax.drafter_io import export_released
    from dflash_jax.speculation import plan_for

    ck = checkpoint.load_target(tiny_models["qwen3"][2])
    tok = ck.tokenizer()
    auto = plan_for(ck, "auto", tok)  # with no drafter shipped: prompt lookup alone
    assert isinstance(auto.step, NgramStep) and len(auto.step.confidence) == auto.step.ngram_max == 4
    assert auto.label == "prompt lookup alone" and auto.params is None and auto.block_size == 16
    hybrid = plan_for(ck, "random", tok)  # a DFlash drafter named: with prompt lookup
    assert isinstance(hybrid.step, HybridStep) and hybrid.params is not None
    assert hybrid.label == "DFlash + prompt lookup"
    alone = plan_for(ck, "random", tok, prompt_lookup=False)
    assert isinstance(alone.step, DraftStep) and alone.block_size == 16 and alone.label == "DFlash alone"
    assert plan_for(ck, "none", tok) is None and plan_for(ck, "auto", tok, prompt_lookup=False) is None
    with pytest.raises(ValueError, match="--block-size 4 with --drafter none: plain decoding"):
        plan_for(ck, "none", tok, block_size=4)
    with pytest.raises(
        ValueError, match="--drafter auto decodes plainly here .no drafter is shipped for this target and"
    ):
        plan_for(ck, "auto", tok, prompt_lookup=False, block_size=4)
    # a drafter reading the prompt-lookup continuation itself is used alone
    dcfg = DrafterConfig.for_target(ck.cfg, num_layers=1, block_size=8, mask_token_id=3, block_input="ngram")
    folder = export_released(init_drafter_params(dcfg), dcfg, tmp_path / "ngram_drafter")
    reading = plan_for(ck, str(folder), tok)
    assert isinstance(reading.step, DraftStep) and reading.step.cfg.block_input == "ngram"
    assert reading.label == "DFlash reading prompt lookup"
    # a DFlash 2 drafter: beside prompt lookup too (its rows through the selector's walk)
    d2 = DrafterConfig.for_target(ck.cfg, num_layers=1, block_size=8, mask_token_id=3, **DFLASH2)
    two = plan_for(ck, str(export_released(init_drafter_params(d2), d2, tmp_path / "d2")), tok)
    assert isinstance(two.step, HybridStep) and two.step.cfg.dflash2 and two.label == "DFlash 2 + prompt lookup"
    assert len(plan_for(ck, "ngram", tok, ngram_max=6).step.confidence) == 6
    from helpers import OracleDraft

    assert make_plan(OracleDraft(ck.cfg.vocab_size, 8)).label == "OracleDraft"  # a step of another kind
    # what a user asks is checked before any model loads, each in one place
    from dflash_jax.errors import ConfigError
    from dflash_jax.speculation import check_request

    with pytest.raises(ConfigError, match="--drafter nowhere does not exist"):
        check_request("nowhere")
    with pytest.raises(ValueError, match="ngram_min <= ngram_max"):
        check_request("auto", ngram_max=1, ngram_min=2)
    with pytest.raises(ValueError, match="auto, full or positive numbers"):
        check_request("auto", verify_lengths="1,x")
    for bad in (1, 0, 4.7):  # before any model loads, whatever the drafter
        with pytest.raises(ValueError, match=f"block size {bad}: a block holds the anchor"):
            check_request("ngram", block_size=bad)
    with pytest.raises(ValueError, match="auto, full or positive numbers"):
        check_request("auto", verify_lengths=(1, 2.5))
    # costs as the array Decoder.costs_for gives; a folder as a Path
    as_array = make_plan(NgramStep(block_size=8), verify_lengths=(1, 8), verify_costs=np.asarray([1.0, 2.0]))
    assert as_array.verify_costs == (1.0, 2.0)
    assert plan_for(ck, folder, tok).label == plan_for(ck, str(folder), tok).label


def test_auto_on_a_cpu_is_the_shipped_drafter_beside_prompt_lookup_at_block_8(tiny_models, tmp_path, monkeypatch):
    """``--drafter auto`` on a CPU with a drafter shipped: ``HybridStep`` (also for a drafter that
    reads the prompt-lookup continuation itself) at block ``CPU_BLOCK_SIZE`` by default and any
    block up to the drafter's when asked; a drafter named by folder keeps its own."""
    from dflash_jax import checkpoint, hub, speculation
    from dflash_jax.drafter_io import export_released
    from dflash_jax.speculation import CPU_BLOCK_SIZE, plan_for

    assert jax.default_backend() == "cpu"
    ck = checkpoint.load_target(tiny_models["qwen3"][2])
    tok = ck.tokenizer()
    dcfg = DrafterConfig.for_target(ck.cfg, num_layers=1, block_size=16, mask_token_id=3, block_input="ngram")
    folder = export_released(init_drafter_params(dcfg), dcfg, tmp_path / "shipped")
    monkeypatch.setattr(hub, "shipped_drafter", lambda identity: folder)
    plan = plan_for(ck, "auto", tok, tree="off")  # chains (as the default, --tree auto, today: test_tree)
    step, params = plan.step, plan.params
    assert isinstance(step, HybridStep) and step.min_match == 2
    assert plan.block_size == step.default_block_size == CPU_BLOCK_SIZE == 8 and step.max_block_size == 16
    assert plan.verify_lengths == (1, 2, 4, 8)
    assert plan_for(ck, "auto", tok, block_size=16, tree="off").block_size == 16
    auto = plan_for(ck, "auto", tok)  # generate's default, --tree auto: these chains (no tree measured faster)
    assert type(auto.step) is HybridStep and auto.block_size == 8 and auto.verify_lengths == (1, 2, 4, 8)
    # explicit verify lengths longer than the default block raise it (up to the drafter's)
    assert make_plan(step, params, verify_lengths=[1, 4, 16]).block_size == 16
    with pytest.raises(ValueError, match="must lie in \\[1, block size 8\\]; pass lengths from 1 to 16, the longest"):
        make_plan(step, params, verify_lengths=[1, 32])  # no block size can hold 32
    with pytest.raises(
        ValueError, match="block size 4\\]; pass shorter ones or a larger --block-size \\(this drafter's"
    ):
        make_plan(step, params, block_size=4, verify_lengths=[1, 8])
    with pytest.raises(ValueError, match="block size 17 not in \\[2, 16\\]"):
        plan_for(ck, "auto", tok, block_size=17)
    assert isinstance(plan_for(ck, str(folder), tok).step, DraftStep)  # named: the drafter as it is
    assert plan_for(ck, "auto", tok, prompt_lookup=False).block_size == 16  # the drafter alone
    # a drafter loaded once (demo, bench) is used as given, not read from its folder again
    from dflash_jax import drafter_io

    loaded = speculation.load("auto", ck, tok)
    assert loaded.shipped and all(isinstance(x, jax.Array) for x in jax.tree.leaves(loaded.params))  # placed once
    with monkeypatch.context() as m:
        m.setattr(drafter_io, "load_drafter", lambda *a: pytest.fail("the drafter was loaded twice"))
        again = plan_for(ck, loaded, tok, tree="off")
        assert again.params is loaded.params and isinstance(again.step, HybridStep)
        assert again.block_size == CPU_BLOCK_SIZE
    with monkeypatch.context() as m:  # on an accelerator (nothing compiles here: only the choices)
        m.setattr(jax, "default_backend", lambda: "gpu")
        alone = plan_for(ck, "auto", tok)  # it reads the prompt-lookup continuation itself: alone
        assert isinstance(alone.step, DraftStep) and alone.block_size == 16
        assert alone.verify_lengths == ()  # the whole block, every round
        mask_cfg = DrafterConfig.for_target(ck.cfg, num_layers=1, block_size=16, mask_token_id=3)
        mask_folder = export_released(init_drafter_params(mask_cfg), mask_cfg, tmp_path / "mask")
        m.setattr(hub, "shipped_drafter", lambda identity: mask_folder)
        hybrid = plan_for(ck, "auto", tok)  # a mask-token drafter: beside prompt lookup, its own block
        assert isinstance(hybrid.step, HybridStep) and hybrid.step.default_block is None and hybrid.block_size == 16
    assert plan_for(ck, "auto", tok, backend="gpu").verify_lengths == ()  # the backend can be named too
    small = DrafterConfig.for_target(ck.cfg, num_layers=1, block_size=4, mask_token_id=3)
    small_folder = export_released(init_drafter_params(small), small, tmp_path / "b4")
    monkeypatch.setattr(hub, "shipped_drafter", lambda identity: small_folder)
    assert plan_for(ck, "auto", tok).block_size == 4  # never above the drafter's block (a tree's too)
    assert plan_for(ck, "auto", tok, tree="off").block_size == 4
    with pytest.raises(ValueError, match="default_block must be in \\[2, the drafter's 16\\], got 17"):
        HybridStep(step.dflash, NgramStep(), default_block=17)


def test_a_sampled_request_does_not_depend_on_its_batch(target):  # noqa: F811
    """Each row picks its own verify length, so the rest of the batch never changes how much of
    its draft is checked: the same prompt and seed give the same sampled tokens in any batch."""
    ck, _ = target
    prompts = _prompts(5)
    step = NgramStep(block_size=8, confidence=((0.3, 0.6), (0.5, 0.8), (0.7, 0.9), (0.9, 0.95)))
    plan = make_plan(step, verify_lengths=(1, 2, 4), verify_costs=(1.0, 1.3, 1.7, 2.5))
    dec = Decoder(ck.params, ck.cfg, plan, sampling=Sampling(0.8))
    alone = [dec.generate([prompts[0]], 30, seed=s)[0].token_ids for s in range(6)]
    together = [
        dec.generate([prompts[0], prompts[1], prompts[3]], 30, seed=[s, 100 + s, 200 + s])[0].token_ids
        for s in range(6)
    ]
    assert alone == together
