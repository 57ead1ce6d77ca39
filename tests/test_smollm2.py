"""The embedded SmolLM2-135M-Instruct: our JAX target against transformers on real prompts.

Floating-point rule (SPEC.md): float32 logits agree to ~1e-4; greedy outputs are equal, or
the first divergence is at a position whose top-2 logit gap (from transformers' own
computation) is below 5e-4, and it is reported.
"""

import numpy as np
import pytest
import torch
from conftest import eval_prompts
from helpers import REAL_REL, assert_close

from dflash_jax.decode import Decoder
from dflash_jax.speculation import make_plan
from dflash_jax.target import Target
from dflash_jax.tokens import encode, stop_ids

pytestmark = pytest.mark.slow

NEAR_TIE = 5e-4  # SPEC: a greedy divergence is allowed only where the top-2 gap is below this


def test_logits_equal_transformers_on_real_prompts(smollm2):
    ck, tok, hf = smollm2
    model = Target(ck.cfg)
    for text in eval_prompts(3):
        ids = np.array([encode(tok, text, chat=True)])
        with torch.no_grad():
            out = hf(torch.as_tensor(ids), output_hidden_states=True)
        hidden, taps, _ = model.apply({"params": ck.params}, ids, np.arange(ids.shape[1])[None], None, (0, 28))
        ours = np.asarray(model.apply({"params": ck.params}, hidden, method="logits"))
        assert_close(ours, out.logits.numpy(), REAL_REL, "logits")
        d = ck.cfg.hidden_size
        assert_close(np.asarray(taps)[..., :d], out.hidden_states[1].numpy(), REAL_REL, "layer-0 tap")
        assert_close(np.asarray(taps)[..., d:], out.hidden_states[29].numpy(), REAL_REL, "layer-28 tap")


def test_greedy_decoding_equals_transformers(smollm2):
    ck, tok, hf = smollm2
    dec = Decoder(ck.params, ck.cfg)
    prompts = [encode(tok, t, chat=True) for t in eval_prompts(3)]
    ours = dec.generate(prompts, 48, stop_ids(tok))
    for p, r in zip(prompts, ours):
        with torch.no_grad():
            out = hf.generate(
                torch.tensor([p]),
                max_new_tokens=48,
                do_sample=False,
                output_scores=True,
                return_dict_in_generate=True,
                eos_token_id=stop_ids(tok),
                pad_token_id=2,
            )
        ref = out.sequences[0, len(p) :].tolist()
        if r.token_ids != ref:
            k = next(i for i, (a, b) in enumerate(zip(r.token_ids, ref)) if a != b)
            top2 = torch.topk(out.scores[k][0], 2).values
            gap = float(top2[0] - top2[1])
            print(f"divergence at new token {k}: ours {r.token_ids[k]} transformers {ref[k]}, top-2 gap {gap:.2e}")
            assert gap < NEAR_TIE, f"divergence at token {k} with a clear top-2 gap {gap}"
        else:
            assert len(ref) >= 1


def _plain_gap(ck, seq) -> float:
    """Top-2 logit gap of the target's plain (full-sequence) computation at the next position."""
    model = Target(ck.cfg)
    ids = np.array([seq])
    hidden, _, _ = model.apply({"params": ck.params}, ids, np.arange(len(seq))[None])
    top2 = np.sort(np.asarray(model.apply({"params": ck.params}, hidden[:, -1], method="logits"))[0])[-2:]
    return float(top2[1] - top2[0])


def _same_or_near_tie(ck, prompt, plain, spec):
    if spec == plain:
        return
    k = next((i for i, (a, b) in enumerate(zip(spec, plain)) if a != b), min(len(spec), len(plain)))
    gap = _plain_gap(ck, prompt + plain[:k])
    print(f"speculative/plain divergence at new token {k}: top-2 gap {gap:.2e}")
    assert gap < NEAR_TIE, f"divergence at token {k} with a clear top-2 gap {gap}"


def test_speculative_equals_plain_on_real_prompts(smollm2):
    """Random drafter (tau ~1) and an oracle drafter (the plain output with errors every 5th
    position: rounds of 1..B tokens) on GSM8K prompts: the SPEC floating-point rule."""
    from helpers import OracleDraft, oracle_params

    from dflash_jax.speculation import plan_for

    ck, tok, _ = smollm2
    prompts = [encode(tok, t, chat=True) for t in eval_prompts(3)]
    plain = [r.token_ids for r in Decoder(ck.params, ck.cfg).generate(prompts, 48, stop_ids(tok))]
    random = plan_for(ck, "random", tok, prompt_lookup=False, block_size=8, verify_lengths=None)
    spec = Decoder(ck.params, ck.cfg, random)
    for p, want, r in zip(prompts, plain, spec.generate(prompts, 48, stop_ids(tok))):
        _same_or_near_tie(ck, p, want, r.token_ids)
    errors = [{len(p) + i for i in range(1, 60) if i % 5 == 0} for p in prompts]
    oracle = Decoder(
        ck.params, ck.cfg, make_plan(OracleDraft(ck.cfg.vocab_size, 8), oracle_params(prompts, plain, errors))
    )
    results = oracle.generate(prompts, 48, stop_ids(tok))
    for p, want, r in zip(prompts, plain, results):
        _same_or_near_tie(ck, p, want, r.token_ids)
    assert max(a for r in results for a in r.acceptance_lengths) >= 4  # multi-token blocks really verified


def test_shipped_drafter_is_the_default_and_equals_the_reference(smollm2, monkeypatch):
    """The drafter shipped in the package (dflash_jax/assets) is what --drafter auto picks for SmolLM2;
    the reference dflash==0.1.0 loads the same files (``DFlashDraftModel``, or ``DFlash2DraftModel``
    for a DFlash 2 drafter) and gives the same tokens and per-round acceptance lengths when both draft
    from mask tokens (a drafter whose block input is the prompt-lookup continuation is a dflash-jax
    extension the reference does not read; nor does it read a draft vocabulary); speculative output,
    as shipped (draft vocabulary and all), follows the floating-point rule against plain decoding."""
    import dataclasses
    import time

    import dflash.model
    from dflash.model import DFlash2DraftModel, DFlashDraftModel, dflash_generate

    from dflash_jax.drafter import DraftStep
    from dflash_jax.drafter_io import drafter_for as load_drafter
    from dflash_jax.drafter_io import resolve_drafter
    from dflash_jax.hub import SHIPPED_DRAFTERS, SMOLLM2

    ck, tok, hf = smollm2
    folder = SHIPPED_DRAFTERS[SMOLLM2]
    assert (folder / "model.safetensors").stat().st_size < 40 * 2**20
    assert resolve_drafter("auto", ck) == str(folder)
    monkeypatch.setattr(dflash.model, "_cuda_time", time.perf_counter)  # return_stats on CPU
    params, cfg = load_drafter(str(folder), ck, tok, draft_vocab=0)  # the head over the whole vocabulary
    as_shipped = load_drafter(str(folder), ck, tok)  # with the draft vocabulary stored beside it
    assert as_shipped[0]["draft_vocab"]["ids"].shape[0] >= 4096
    ref = (DFlash2DraftModel if cfg.dflash2 else DFlashDraftModel).from_pretrained(folder, dtype=torch.float32).eval()
    as_reference = make_plan(  # what the reference reads of it: mask-token blocks, no copy bias
        DraftStep(dataclasses.replace(cfg, block_input="mask", copy_bias=None, ngram_periodic=False), ck.cfg),
        {k: v for k, v in params.items() if k != "copy_bias"},
        block_size=16,
    )
    dec = Decoder(ck.params, ck.cfg, as_reference)
    shipped = Decoder(ck.params, ck.cfg, make_plan(DraftStep(cfg, ck.cfg), as_shipped[0], block_size=16))
    plain = Decoder(ck.params, ck.cfg)
    stops = stop_ids(tok)
    for text in eval_prompts(2):
        ids = encode(tok, text, chat=True)
        ours = dec.generate([ids], 48, stops)[0]
        with torch.no_grad():
            out = dflash_generate(
                ref, hf, torch.tensor([ids]), max_new_tokens=48, stop_token_ids=stops, block_size=16, return_stats=True
            )
        assert ours.token_ids == out.output_ids[0, len(ids) :].tolist()
        assert ours.acceptance_lengths == list(out.acceptance_lengths)
        want = plain.generate([ids], 48, stops)[0].token_ids
        _same_or_near_tie(ck, ids, want, ours.token_ids)
        _same_or_near_tie(ck, ids, want, shipped.generate([ids], 48, stops)[0].token_ids)


def test_the_shipped_drafters_trees_equal_plain_decoding(smollm2):
    """The shipped DFlash 2 drafter's trees on real prompts (16 nodes with prompt lookup's branches and
    the width chosen per round; 3 nodes at block 8, fewer than the block's offsets, the whole tree
    verified): the floating-point rule against plain decoding, and trees that commit more than one
    token a round after the first (a drafter context spoiled by the first commit drafts nothing right
    again). (Whole trees of other budgets on tiny targets: test_tree.py.)"""
    from dflash_jax.speculation import plan_for

    ck, tok, _ = smollm2
    prompts = [encode(tok, t, chat=True) for t in eval_prompts(2)]
    plain = [r.token_ids for r in Decoder(ck.params, ck.cfg).generate(prompts, 48, stop_ids(tok))]
    for plan in (
        plan_for(ck, "auto", tok, tree=16, verify_costs=(1.0, 1.1, 1.3, 1.7, 2.9, 3.1)),
        plan_for(ck, "auto", tok, tree=3, prompt_lookup=False, verify_lengths=None, block_size=8),
    ):
        results = Decoder(ck.params, ck.cfg, plan).generate(prompts, 48, stop_ids(tok))
        for p, want, r in zip(prompts, plain, results):
            _same_or_near_tie(ck, p, want, r.token_ids)
        assert max(a for r in results for a in r.acceptance_lengths[1:]) >= 4
