"""A draft vocabulary (``drafter.with_draft_vocab``): the drafter's head over a list of tokens.

The whole vocabulary as the list changes nothing; a cut list scores exactly the listed tokens and
each offset's prompt-lookup token (the copy column), stays lossless greedy and sampled, and the
list travels with the drafter folder (``draft_vocab.json``).
"""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_close
from test_ngram import (  # noqa: F401
    VG,
    _copy_drafter,
    _prompts,
    chi_square_p,
    exact_joint,
    expected_rounds,
    sampled_joint,
    target,
    tiny,
)
from test_speculation import DFLASH2, P_REJECT

from dflash_jax.decode import Decoder
from dflash_jax.drafter import (
    DRAFT_VOCAB,
    DrafterConfig,
    DraftStep,
    draft_scores,
    init_drafter_params,
    with_draft_vocab,
)
from dflash_jax.ngram import HybridStep, NgramStep
from dflash_jax.sampling import Sampling
from dflash_jax.speculation import make_plan


def _copy_bias_case(tgt, seed=0):
    """A drafter with an n-gram block input and a random copy-bias table, random final hidden
    states ``[4, 5, d]`` and blocks whose offsets ``1 .. num`` hold proposed tokens."""
    dcfg = DrafterConfig.for_target(tgt.cfg, 1, 6, 3, block_input="ngram", ngram_max=3, copy_bias=1.0)
    rs = np.random.RandomState(seed)
    params = dict(init_drafter_params(dcfg), copy_bias=jnp.asarray(rs.randn(3, 5).astype(np.float32)))
    hidden = jnp.asarray(rs.randn(4, 5, tgt.cfg.hidden_size).astype(np.float32))
    block = rs.randint(4, VG, (4, 6)).astype(np.int32)
    num, matched = np.array([0, 2, 5, 3]), np.array([0, 1, 3, 2])
    block[:, 1:] = np.where(np.arange(5) < num[:, None], block[:, 1:], 3)  # mask tokens past the continuation
    return dcfg, params, hidden, jnp.asarray(block), jnp.asarray(num), jnp.asarray(matched)


@pytest.mark.parametrize("copy_bias, dtype", [(True, "float32"), (False, "float32"), (True, "bfloat16")])
def test_the_whole_vocabulary_as_the_list_scores_as_the_full_head(target, copy_bias, dtype):  # noqa: F811
    """... in the target's compute dtype, as ``Target.logits`` runs the full head, whatever the
    drafter's (a bfloat16 drafter's hidden states, a float32 target)."""
    tgt, _ = target
    dcfg, params, hidden, block, num, matched = _copy_bias_case(tgt)
    if not copy_bias:
        dcfg = DrafterConfig.for_target(tgt.cfg, 1, 6, 3)
        params = init_drafter_params(dcfg)
    dcfg = dataclasses.replace(dcfg, dtype=dtype)
    hidden = hidden.astype(dcfg.compute_dtype)
    full = draft_scores(hidden, params, tgt.params, tgt.cfg, dcfg, block, num, matched)
    perm = np.random.RandomState(1).permutation(VG)  # any order
    cut = draft_scores(
        hidden, with_draft_vocab(params, perm, tgt.params, tgt.cfg), tgt.params, tgt.cfg, dcfg, block, num, matched
    )
    assert cut.logits.shape[-1] == VG + copy_bias  # the copy column
    assert_close(cut.dense(VG), full.logits, rel=1e-5)
    np.testing.assert_array_equal(cut.tokens(jnp.argmax(cut.logits, -1)), full.tokens(jnp.argmax(full.logits, -1)))


def test_a_cut_list_scores_the_listed_tokens_and_the_copy_token_only(target):  # noqa: F811
    tgt, _ = target
    dcfg, params, hidden, block, num, matched = _copy_bias_case(tgt, seed=2)
    full = np.asarray(draft_scores(hidden, params, tgt.params, tgt.cfg, dcfg, block, num, matched).logits)
    ids = np.array([5, 9, 4, 17, 3])
    cut = draft_scores(
        hidden, with_draft_vocab(params, ids, tgt.params, tgt.cfg), tgt.params, tgt.cfg, dcfg, block, num, matched
    )
    dense = np.asarray(cut.dense(VG))
    scored = np.isin(np.arange(VG), ids) & np.ones((4, 5, 1), bool)
    copies = 0
    for b in range(4):
        for k in range(num[b]):
            scored[b, k, block[b, k + 1]] = True
            copies += int(block[b, k + 1]) not in ids
    assert copies > 3  # the copy column carried tokens the list lacks
    # the full head's score (copy bonus included) on the listed and copied tokens, -inf elsewhere
    np.testing.assert_array_equal(np.isfinite(dense), scored)
    np.testing.assert_allclose(dense[scored], full[scored], rtol=0, atol=1e-5 * np.abs(full).max())
    top = np.asarray(cut.tokens(jnp.argmax(cut.logits, -1)))
    np.testing.assert_array_equal(top, dense.argmax(-1))


def test_a_draft_vocabulary_is_checked(target):  # noqa: F811
    tgt, _ = target
    params = init_drafter_params(DrafterConfig.for_target(tgt.cfg, 1, 6, 3))
    for ids, msg in [([], "non-empty"), ([3, 3], "repeat"), ([0, VG], r"lie in \[0, 24\)"), ([[1]], "non-empty")]:
        with pytest.raises(ValueError, match=msg):
            with_draft_vocab(params, np.asarray(ids, np.int32), tgt.params, tgt.cfg)
    vocab = with_draft_vocab(params, [7, 2], tgt.params, tgt.cfg)[DRAFT_VOCAB]
    assert vocab["head"].shape == (tgt.cfg.hidden_size, 2)  # gathered once, [d, N]


@pytest.mark.parametrize("which", ["dflash", "dflash2-hybrid"])
def test_greedy_is_lossless_with_a_cut_list(target, which):  # noqa: F811
    tgt, plain = target
    prompts = _prompts(11)
    want = [r.token_ids for r in plain.generate(prompts, 30, stop_token_ids=(5,))]
    dcfg = DrafterConfig.for_target(tgt.cfg, 1, 8, 3, **(DFLASH2 if which != "dflash" else {}))
    params = with_draft_vocab(init_drafter_params(dcfg, seed=3), [4, 6, 8, 10, 12, 14], tgt.params, tgt.cfg)
    step = DraftStep(dcfg, tgt.cfg)
    step = step if which == "dflash" else HybridStep(step, NgramStep(block_size=8))
    for lengths, costs in [(None, None), ((1, 2), (1.0, 1.2, 2.5))]:
        dec = Decoder(tgt.params, tgt.cfg, make_plan(step, params, verify_lengths=lengths, verify_costs=costs))
        assert [r.token_ids for r in dec.generate(prompts, 30, (5,))] == want


def test_the_copy_column_drafts_prompt_lookup_whatever_the_list(target):  # noqa: F811
    """A drafter built to copy its n-gram block input, with a large copy bias and a list holding
    only the mask token: its rounds are exactly prompt lookup's, padded with mask tokens (every
    proposed token reaches the draft through the copy column), and the output is plain decoding's."""
    tgt, _ = target
    bs, n_new, mask = 8, 30, 3
    dcfg = DrafterConfig.for_target(tgt.cfg, 1, bs, mask, block_input="ngram", copy_bias=1e3)
    params, dparams = _copy_drafter(tgt, dcfg)
    dparams = with_draft_vocab(dparams, [mask], params, tgt.cfg)
    plain, dec = Decoder(params, tgt.cfg), Decoder(params, tgt.cfg, make_plan(DraftStep(dcfg, tgt.cfg), dparams))
    prompts = _prompts(5)
    want, got = plain.generate(prompts, n_new), dec.generate(prompts, n_new)
    free = [p + r.token_ids for p, r in zip(prompts, plain.generate(prompts, n_new + bs))]
    for p, seq, w, g in zip(prompts, free, want, got):
        assert g.token_ids == w.token_ids
        assert g.acceptance_lengths == expected_rounds(seq, len(p), bs, n_new, 4, 1, pad=mask)
    assert sum(a > 1 for g in got for a in g.acceptance_lengths) >= 10


COPY = dict(block_input="ngram", ngram_max=2, copy_bias=2.0)


@pytest.mark.parametrize(
    "dflash2, ids, copy",
    [(False, [1, 2, 5, 6, 7], False), (True, [1, 2, 5, 6, 7], False), (True, [5], True)],
    ids=["dflash", "dflash2", "dflash2-copy-fewer-than-top-k"],
)
def test_sampling_keeps_the_target_distribution_with_a_cut_list(tiny, dflash2, ids, copy):  # noqa: F811
    """q is the distribution drawn from, on the list only (DFlash: the head's softmax over it;
    DFlash 2: the selector walk over the top candidates among it, all of them when the list and
    the copy column hold fewer than ``selector_top_k``: then a -inf candidate, q 0, can name the
    same token as a real one, and q must still sum per token), so the rejection rule stays exact."""
    cfg, params = tiny
    s = Sampling(0.8)
    kw = {**(DFLASH2 if dflash2 else {}), **(COPY if copy else {})}
    dcfg = DrafterConfig.for_target(cfg, num_layers=1, block_size=4, mask_token_id=0, target_layer_ids=(0,), **kw)
    rs = np.random.RandomState(3)
    dparams = jax.tree.map(lambda x: np.asarray(x) * 3.0 + 0.2 * rs.randn(*np.shape(x)), init_drafter_params(dcfg))
    dparams = with_draft_vocab(dparams, ids, params, cfg)  # some of the 8 tokens
    dec = Decoder(params, cfg, make_plan(DraftStep(dcfg, cfg), dparams), sampling=s)
    counts, multi = sampled_joint(dec)
    assert multi > 0  # drafts were accepted
    assert chi_square_p(counts, exact_joint(cfg, params, s)) > P_REJECT
    assert chi_square_p(counts, exact_joint(cfg, params, Sampling(1.2))) < P_REJECT  # the check has teeth


def test_the_list_travels_with_the_drafter_folder(tiny_models, tmp_path, capsys):
    from dflash_jax import checkpoint
    from dflash_jax.drafter_io import (
        DRAFT_VOCAB_FILE,
        drafter_for,
        export_released,
        read_draft_vocab,
        write_draft_vocab,
    )
    from dflash_jax.errors import CheckpointError, ConfigError
    from dflash_jax.speculation import plan_for

    ck = checkpoint.load_target(tiny_models["qwen3"][2])
    tok = ck.tokenizer()
    dcfg = DrafterConfig.for_target(ck.cfg, num_layers=1, block_size=8, mask_token_id=3)
    folder = export_released(init_drafter_params(dcfg), dcfg, tmp_path / "d")
    assert read_draft_vocab(folder) is None and DRAFT_VOCAB not in drafter_for(str(folder), ck, tok)[0]
    with pytest.raises(ConfigError, match="stores no draft vocabulary .draft_vocab.json.; pass 0"):
        drafter_for(str(folder), ck, tok, draft_vocab=2)
    with pytest.raises(CheckpointError, match="not a drafter folder"):
        write_draft_vocab(tmp_path, [1, 2])
    write_draft_vocab(folder, [9, 4, 7, 1], counted_on="a test")
    np.testing.assert_array_equal(read_draft_vocab(folder), [9, 4, 7, 1])
    params, _ = drafter_for(str(folder), ck, tok)  # the stored list, whole
    np.testing.assert_array_equal(params[DRAFT_VOCAB]["ids"], [9, 4, 7, 1])
    np.testing.assert_array_equal(drafter_for(str(folder), ck, tok, draft_vocab=2)[0][DRAFT_VOCAB]["ids"], [9, 4])
    assert DRAFT_VOCAB not in drafter_for(str(folder), ck, tok, draft_vocab=0)[0]
    with pytest.raises(ConfigError, match="stores 4 tokens"):
        drafter_for(str(folder), ck, tok, draft_vocab=5)
    # import-drafter and export-drafter carry the list (ids and metadata) with the weights
    from dflash_jax.cli import main

    main(["import-drafter", "--drafter", str(folder), "--out", str(tmp_path / "ours"), "--target", str(ck.path)])
    main(["export-drafter", "--drafter", str(tmp_path / "ours"), "--out", str(tmp_path / "back")])
    stored = json.loads((folder / DRAFT_VOCAB_FILE).read_text())
    for d in ("ours", "back"):
        assert json.loads((tmp_path / d / DRAFT_VOCAB_FILE).read_text()) == stored
        np.testing.assert_array_equal(drafter_for(str(tmp_path / d), ck, tok)[0][DRAFT_VOCAB]["ids"], [9, 4, 7, 1])
    # a bad stored list is a one-line error before anything is written (no --out without its list)
    good = (folder / DRAFT_VOCAB_FILE).read_text()
    for bad, msg in (('{"ids": [5, 5]}', "these repeat"), (f'{{"ids": [{ck.cfg.vocab_size}]}}', "lie in")):
        (folder / DRAFT_VOCAB_FILE).write_text(bad)
        with pytest.raises(SystemExit, match=msg):
            main(["import-drafter", "--drafter", str(folder), "--out", str(tmp_path / "never")])
        assert not (tmp_path / "never").exists()
    (folder / DRAFT_VOCAB_FILE).write_text(good)
    hybrid = plan_for(ck, str(folder), tok, draft_vocab=3)
    assert isinstance(hybrid.step, HybridStep) and hybrid.params[DRAFT_VOCAB]["ids"].shape == (3,)
    # the plan's label says how many tokens the drafter proposes (what demo, bench and generate print)
    assert hybrid.label == "DFlash over 3 tokens + prompt lookup"
    assert plan_for(ck, str(folder), tok, prompt_lookup=False).label == "DFlash over 4 tokens alone"
    # generate logs it, so that --draft-vocab N can be confirmed
    args = [
        "generate",
        "--target",
        str(ck.path),
        "--drafter",
        str(folder),
        "--prompt",
        "t5 t6",
        "--max-new-tokens",
        "2",
    ]
    main([*args, "--draft-vocab", "3"])
    assert "(DFlash over 3 tokens + prompt lookup, block size 8" in capsys.readouterr().err
    for bad in ('{"ids": "oops"}', "[1, 2, 3]", '{"ids": [true, 7]}', '{"ids": [5, 99999999999]}'):
        (folder / DRAFT_VOCAB_FILE).write_text(bad)
        with pytest.raises(CheckpointError, match="no list of token ids"):
            read_draft_vocab(folder)
    for ids in ([1, 1], [-1], [ck.cfg.vocab_size], []):
        with pytest.raises(ValueError, match="distinct token ids"):
            write_draft_vocab(folder, ids)
    for n in (-1, 2.5):
        with pytest.raises(ConfigError, match="a number of tokens >= 0"):
            drafter_for(str(folder), ck, tok, draft_vocab=n)
    with pytest.raises(ConfigError, match="random drafter has no draft vocabulary"):
        drafter_for("random", ck, tok, draft_vocab=5)
