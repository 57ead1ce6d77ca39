"""The draft gate (``Plan.draft_gate``, ``decode.gate_drafts``): a row drafts only while its drafted rounds
pay for their cost, and takes plain steps otherwise. Whatever it chooses the output is lossless (greedy:
identical to plain decoding; sampled: the target's distribution, chi-square as test_speculation's), and a
row's choice and output never depend on the rest of its batch."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from test_ngram import PROMPT, _prompts, chi_square_p, exact_joint, sampled_joint, target, tiny  # noqa: F401

from dflash_jax.decode import GATE_DECAY, GATE_EXPLORE, GATE_PRIOR, Decoder, gate_drafts, initial_gate, update_gate
from dflash_jax.drafter import DrafterConfig, DraftStep, init_drafter_params
from dflash_jax.ngram import HybridStep, NgramStep
from dflash_jax.sampling import Sampling
from dflash_jax.speculation import make_plan, parse_draft_gate
from dflash_jax.tree_step import TreeStep

P_REJECT = 1e-3
LENGTHS, COSTS = (1, 2, 4), (1.0, 1.2, 1.6, 2.4)  # fixed costs: the same rounds on any machine


def test_the_gate_drafts_while_drafting_pays_and_looks_again_after_plain_rounds():
    gate = initial_gate(3)
    assert gate.tolist() == [[*GATE_PRIOR, 0.0]] * 3
    active = jnp.asarray([True, True, False])
    assert gate_drafts(gate, active).tolist() == [True, True, False]  # a new row drafts; a finished one never
    # row 0 committed 1 token in a round that cost 3 plain steps, row 1 committed 6 for 3
    drafted = jnp.asarray([True, True, False])
    after = update_gate(gate, drafted, active, jnp.asarray([1, 6, 0]), jnp.asarray([3.0, 3.0, 3.0]))
    want = GATE_DECAY * np.asarray(GATE_PRIOR) + [[1, 3], [6, 3]]
    np.testing.assert_allclose(np.asarray(after)[:2, :2], want, rtol=1e-6)
    assert gate_drafts(after, active).tolist() == [False, True, False]
    for k in range(1, GATE_EXPLORE + 1):  # plain rounds: row 0 counts them, then drafts again to look
        after = update_gate(after, jnp.asarray([False, True, False]), active, jnp.asarray([1, 6, 0]), jnp.full(3, 3.0))
        assert after[0, 2] == k and after[1, 2] == 0 and after[2, 2] == 0
        assert bool(gate_drafts(after, active)[0]) == (k >= GATE_EXPLORE)


def _dflash(ck, bs=8):
    dcfg = DrafterConfig.for_target(ck.cfg, num_layers=1, block_size=bs, mask_token_id=3)
    return init_drafter_params(dcfg, seed=0), dcfg


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_greedy_with_a_gate_is_identical_to_plain_decoding(target, tree):  # noqa: F811
    """A random drafter beside prompt lookup (chains, or a tree with its branches): with a cheap draft the gate
    drafts on where prompt lookup pays, with a dear one it takes plain steps and looks again every GATE_EXPLORE
    rounds (so more rounds); the tokens are plain decoding's either way, from ``generate`` and ``as_completed``."""
    ck, plain = target
    prompts = _prompts(8)
    want = [r.token_ids for r in plain.generate(prompts, 40, stop_token_ids=(5,))]
    params, dcfg = _dflash(ck)
    ngram = NgramStep(block_size=8, confidence=0.7)
    step = (
        TreeStep(DraftStep(dcfg, ck.cfg), 6, ngram, min_match=1) if tree else HybridStep(DraftStep(dcfg, ck.cfg), ngram)
    )
    rounds = {}
    for draft_cost in (0.3, 50.0):
        kw = dict(block_size=8, verify_lengths=LENGTHS, verify_costs=COSTS, draft_gate=True, draft_cost=draft_cost)
        dec = Decoder(ck.params, ck.cfg, make_plan(step, params, **kw))
        assert dec.costs_for(dec.shape_for([5], 40)).tolist() == pytest.approx([*COSTS, draft_cost])
        got = dec.generate(prompts, 40, (5,))
        assert [r.token_ids for r in got] == want
        if draft_cost > 1 and not tree:  # rows refilled as they finish (``insert``): the same tokens
            done = dict(dec.as_completed(prompts, 40, (5,), batch_size=2))
            assert [done[i].token_ids for i in range(len(prompts))] == want
        rounds[draft_cost] = sum(len(r.acceptance_lengths) for r in got)
        streak = np.asarray(_final_state(dec, prompts, 40, (5,)).gate[: len(prompts), 2])
        assert (streak <= GATE_EXPLORE).all(), streak  # a gated row looks again after GATE_EXPLORE plain rounds
        if draft_cost > 1:
            assert (streak > 0).any(), streak
    assert rounds[50.0] > rounds[0.3], rounds


def _final_state(dec, prompts, max_new, stops, seed=0, gate=None):
    """Run ``dec``'s compiled prefill and loop by hand, the draft-gate record of each row replaced by ``gate``
    first (``[B, 3]``), and return the loop's final state."""
    shape = dec.shape_for([len(p) for p in prompts], max_new)
    stop_ids = np.asarray(list(stops) or [-1], np.int32)
    pre, loop, _ = dec.compile(shape, len(stop_ids))
    tok = np.zeros((shape.batch, shape.prompt_len), np.int32)
    lens = np.ones((shape.batch,), np.int32)
    for i, p in enumerate(prompts):
        tok[i, : len(p)], lens[i] = p, len(p)
    budget = np.full((shape.batch,), max_new, np.int32)
    budget[len(prompts) :] = 1
    seeds = np.zeros((shape.batch,), np.int32)
    seeds[: len(prompts)] = seed
    state = pre(dec.params, dec.drafter_params, tok, lens, budget, stop_ids, seeds)
    if gate is not None:
        state = state._replace(gate=jnp.asarray(gate, jnp.float32))
    return loop(dec.params, dec.drafter_params, state, stop_ids, dec.costs_for(shape), np.int32(2**31 - 1))


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_a_gated_row_samples_the_same_tokens_whether_or_not_its_batch_drafts(target, tree):  # noqa: F811
    """Row 0 starts gated (it looks again only every GATE_EXPLORE rounds). Beside a row that drafts on, its rounds
    without a draft are drafted rounds that check none of its tokens; beside a gated row they are plain steps (the
    loop's other branch). Its sampled tokens are the same both ways: the plain step draws its token with the key
    the drafted round uses (the rejection rule's after no draft token; a tree walk's at the anchor)."""
    ck, _ = target
    params, dcfg = _dflash(ck)
    ngram = NgramStep(block_size=8, confidence=0.7)
    step = (
        TreeStep(DraftStep(dcfg, ck.cfg), 6, ngram, min_match=1) if tree else HybridStep(DraftStep(dcfg, ck.cfg), ngram)
    )
    lengths = (1, 2, 4) if tree else LENGTHS
    costs = (1.0, 1.2, 1.6, 2.0) if tree else COSTS
    plan = make_plan(
        step, params, block_size=8, verify_lengths=lengths, verify_costs=costs, draft_gate=True, draft_cost=0.2
    )
    dec = Decoder(ck.params, ck.cfg, plan, sampling=Sampling(0.8))
    prompts = _prompts(3)[:2]
    stuck, keen = [0.0, 1.0, 0.0], [1e9, 1.0, 0.0]  # a gated row; a row whose record keeps it drafting
    beside_keen = _final_state(dec, prompts, 30, (), seed=7, gate=[stuck, keen])
    beside_stuck = _final_state(dec, prompts, 30, (), seed=7, gate=[stuck, stuck])
    row = lambda s: np.asarray(s.tokens[0, : int(s.start[0]) + 1]).tolist()  # noqa: E731
    assert row(beside_keen) == row(beside_stuck)
    assert int(beside_keen.start[0]) > len(prompts[0]) + GATE_EXPLORE  # it decoded past a look-again round
    assert row(beside_keen)[len(prompts[0]) :] != row(_final_state(dec, prompts, 30, (), seed=8))[len(prompts[0]) :]


def test_sampling_with_a_gate_keeps_the_target_distribution(tiny):  # noqa: F811
    """The hybrid under sampling with a gate that stops drafting after a round that verified 2 or more positions
    and committed one token (costs below): a row's first round drafts, its second is a plain step; the first three
    tokens have the target's distribution. (Rows that draft beside rows that do not: the batch test above.)"""
    cfg, params = tiny
    s = Sampling(0.8)
    dcfg = DrafterConfig.for_target(cfg, num_layers=1, block_size=4, mask_token_id=0, target_layer_ids=(0,))
    step = HybridStep(DraftStep(dcfg, cfg), NgramStep(block_size=4, confidence=0.7), min_match=1)
    # after a drafted round that committed one token the record is (0.9 * 2 + 1, 0.9 * 1 + 0.8 + verify cost):
    # 2.8 against 2.9 or more after a verify of 2 or more positions: a plain step next
    plan = make_plan(
        step,
        init_drafter_params(dcfg, seed=0),
        verify_lengths=(1, 2),
        verify_costs=(1.0, 1.2, 1.6),
        draft_gate=True,
        draft_cost=0.8,
    )
    dec = Decoder(params, cfg, plan, sampling=s)
    counts, multi = sampled_joint(dec)
    assert multi > 0  # drafts were accepted
    state = _final_state(dec, [PROMPT] * 64, 3, (), seed=np.arange(64))
    second = np.asarray(state.rounds) == 2  # rows whose first round committed one token of the two
    streak = np.asarray(state.gate[:, 2])
    assert second.any() and (streak[second] == 1).all(), streak  # their second round was a plain step
    assert chi_square_p(counts, exact_joint(cfg, params, s)) > P_REJECT
    assert chi_square_p(counts, exact_joint(cfg, params, Sampling(1.2))) < P_REJECT  # the check has teeth


def test_a_gate_needs_plain_steps_among_its_verify_lengths(target, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("DFLASH_JAX_VERIFY_COSTS", str(tmp_path / "costs.json"))
    ck, _ = target
    step = NgramStep(block_size=8)
    with pytest.raises(ValueError, match="verify lengths that start at 1"):
        make_plan(step, block_size=8, draft_gate=True)
    with pytest.raises(ValueError, match="verify lengths that start at 1"):
        make_plan(step, block_size=8, verify_lengths=(2, 4), draft_gate=True)
    with pytest.raises(ValueError, match="give a positive draft cost with the verify costs"):
        make_plan(step, block_size=8, verify_lengths=LENGTHS, verify_costs=COSTS, draft_gate=True)
    with pytest.raises(ValueError, match="on, off or auto"):
        parse_draft_gate("yes")
    plan = make_plan(step, block_size=8, verify_lengths=LENGTHS, draft_gate=True)  # costs measured, draft's too
    dec = Decoder(ck.params, ck.cfg, plan, sampling=Sampling(1.0))
    shape = dec.shape_for([4], 8)
    costs = dec.costs_for(shape)
    assert len(costs) == len(plan.verify_lengths) + 1 and costs[0] == 1.0 and costs[-1] >= 0.01
    assert "draft gate on" in plan.describe()
    # the verify costs are the same plan's without a gate (one timing, kept in the file), the draft's its own
    ungated = Decoder(ck.params, ck.cfg, make_plan(step, block_size=8, verify_lengths=LENGTHS), sampling=Sampling(1.0))
    assert ungated.costs_for(shape).tolist() == costs[:-1].tolist()
    again = Decoder(ck.params, ck.cfg, plan, sampling=Sampling(1.0))
    assert again.costs_for(shape).tolist() == costs.tolist()


def test_the_gate_is_asked_for_by_name(tiny_models):
    """``plan_for``'s ``draft_gate``: ``on`` gates (with verify lengths that start at 1), ``off`` does not, and
    ``auto`` is off everywhere: no machine has measured it faster yet (sampled on a CPU it was slower)."""
    from dflash_jax import checkpoint
    from dflash_jax.speculation import plan_for

    ck = checkpoint.load_target(tiny_models["qwen3"][2])
    tok = ck.tokenizer()
    gated = lambda **kw: plan_for(ck, "random", tok, **kw).draft_gate  # noqa: E731
    assert not any(gated(sampled=t, backend=b) for t in (False, True) for b in ("cpu", "gpu"))
    assert gated(sampled=True, backend="cpu", draft_gate="on") and gated(sampled=False, backend="cpu", draft_gate="on")
    assert not gated(sampled=True, backend="cpu", draft_gate="off")
    with pytest.raises(ValueError, match="verify lengths that start at 1"):
        plan_for(ck, "random", tok, backend="gpu", draft_gate="on")  # an accelerator verifies the block
