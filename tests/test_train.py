"""The drafter trainer: masks, train/inference consistency, real learning, exact resume, bad input."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import TINY_REL, assert_close, stale_scratch, target_forward

from dflash_jax import checkpoint, data, dflash_format, loss, masks, pipeline, prepare
from dflash_jax.decode import Decoder
from dflash_jax.drafter import DrafterConfig, DraftStep, init_drafter_params
from dflash_jax.errors import ConfigError, DataError
from dflash_jax.speculation import make_plan
from dflash_jax.train import Trainer
from dflash_jax.train_config import load_config

ROOT = Path(__file__).resolve().parents[1]


def _compiled(fn):
    """``fn`` as one compiled program per shape and setting (its keyword-only settings static, except
    ``feats``, an array): the tests here call the training forward many times, and run op by op every op
    compiles for its own shapes."""
    import inspect

    kinds = inspect.signature(fn).parameters
    return jax.jit(fn, static_argnames=[k for k, v in kinds.items() if v.kind is v.KEYWORD_ONLY and k != "feats"])


block_loss, block_logits = _compiled(loss.block_loss), _compiled(loss.block_logits)
context_kv = jax.jit(loss.context_kv, static_argnames="cfg")


CONFIG = str(ROOT / "configs" / "smollm2_135m.py")
STAGES = ROOT / "experiments" / "smollm2"  # the SmolLM2 drafter's training stages and studies


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """A tiny Qwen3 target and a dataset of its own greedy responses to random prompts.

    Its weights have std 0.1 (the other tests use 0.2): a smoother random function, so that a
    small drafter trained for a few hundred steps reaches real multi-token acceptance.
    """
    from helpers import make_hf_model

    root = tmp_path_factory.mktemp("learn")
    hf = make_hf_model("qwen3", root / "hf", std=0.1, tie_word_embeddings=True)
    ck = checkpoint.load_target(checkpoint.convert_hf(root / "hf", root / "ck"))
    rs = np.random.RandomState(0)
    prompts = [rs.randint(4, 96, rs.randint(4, 12)).tolist() for _ in range(1024)]
    seqs, lm = prepare.regenerate(
        Decoder(ck.params, ck.cfg), prompts, max_new_tokens=64, batch_size=256, progress=False
    )
    folder = data.write_dataset(root / "data", seqs, lm, meta={"tokenizer_sha256": ck.identity["tokenizer_sha256"]})
    ck.hf = hf  # the same weights in transformers, for the reference loop
    return ck, folder


def tiny_overrides(ck, folder, out, *extra):
    return [
        f"target={ck.path}",
        f"data={folder}",
        f"out_dir={out}",
        "drafter.num_layers=2",
        "drafter.target_layer_ids=(1, 2)",
        "drafter.block_size=8",
        "train.gamma=4.0",
        "train.max_len=80",
        "train.num_anchors=16",
        "train.anchor_chunk=8",
        "train.batch_size=16",
        "train.lr=3e-3",
        "eval.val_size=32",
        "eval.decode_prompts=0",
        *extra,
    ]


def tiny_config(ck, folder, out, *extra):
    return load_config(CONFIG, tiny_overrides(ck, folder, out, *extra))


# --- masks ------------------------------------------------------------------------------------


def dense_oracle(sliding, window, seq_len, anchors, valid, bs):
    """The SPEC rule written out query by query (independent of dflash_jax.masks)."""
    n = len(anchors) * bs
    m = np.zeros((n, seq_len + n), bool)
    for a, (p, ok) in enumerate(zip(anchors, valid)):
        for k in range(bs):
            if not ok:
                continue
            q, qpos = a * bs + k, p + k
            for j in range(seq_len):
                m[q, j] = j < p and (not sliding or j >= qpos - window + 1)
            for k2 in range(bs):
                m[q, seq_len + a * bs + k2] = not sliding or (k2 <= k and k - k2 < window)
    return m


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_training_masks_equal_dense_spec_rule(seed):
    rs = np.random.RandomState(seed)
    t, a, bs, w = 40, 6, 5, 3
    anchors = np.sort(rs.choice(t - 1, a, replace=False))
    valid = rs.rand(a) < 0.7
    valid[0] = True
    anchors = np.where(valid, anchors, 0)
    got = masks.training_masks(
        ("full_attention", "sliding_attention"), w, t, jnp.asarray(anchors[None]), jnp.asarray(valid[None]), bs
    )
    for sliding, m in zip((False, True), got):
        np.testing.assert_array_equal(np.asarray(m[0]), dense_oracle(sliding, w, t, anchors, valid, bs))
    assert not np.asarray(got[0][0]).reshape(a, bs, -1)[~valid].any()  # padding blocks see nothing


def test_anchors_are_sorted_unique_and_supervised():
    rs = np.random.RandomState(0)
    lm = rs.rand(3, 50) < 0.6
    lm[2, :] = False
    lm[2, 10:13] = True  # only anchors 10 and 11 are possible
    anc = loss.sample_anchors(jax.random.PRNGKey(0), jnp.asarray(lm), 8)
    pos, valid = np.asarray(anc.positions), np.asarray(anc.valid)
    for r in range(3):
        p = pos[r][valid[r]]
        assert (np.diff(p) > 0).all() and lm[r, p].all() and lm[r, p + 1].all()
    assert pos[2][valid[2]].tolist() == [10, 11] and valid[2].sum() == 2
    counts = np.zeros(50)
    for s in range(300):  # uniform: every allowed position drawn about equally often
        a = loss.sample_anchors(jax.random.PRNGKey(s), jnp.asarray(lm[:1]), 4)
        counts[np.asarray(a.positions[0])] += 1
    ok = lm[0, :-1] & lm[0, 1:]
    allowed = counts[:-1][ok]
    assert counts[:-1][~ok].sum() == 0 and allowed.min() > 0.4 * allowed.mean()


# --- train / inference consistency ------------------------------------------------------------


def _consistency(ck, dparams, dcfg, tokens, anchor_list):
    tcfg = ck.cfg
    toks = jnp.asarray([tokens])
    feats = target_forward(ck, toks, taps=dcfg.target_layer_ids)[2]
    anchors = loss.Anchors(jnp.asarray([anchor_list + [0]]), jnp.asarray([[True] * len(anchor_list) + [False]]))

    @jax.jit  # each piece one compiled program, not every op compiled alone
    def train_logits_of(dparams):
        ctx = context_kv(dparams, feats, dcfg)
        return block_logits(dparams, ck.params, ctx, toks, anchors, tcfg=tcfg, cfg=dcfg)

    step, bs = DraftStep(dcfg, tcfg), dcfg.block_size
    buffer = jnp.pad(toks, ((0, 0), (0, bs)))  # the loop's token buffer (read up to the anchor)

    @jax.jit
    def step_logits(dparams, ctx_feats, p):
        cache = step.write_context(dparams, step.init_cache(1, 128), ctx_feats, jnp.zeros((1,), jnp.int32))
        return step.logits(dparams, ck.params, cache, toks[:, p], p[None], jnp.array([bs]), bs, tokens=buffer)

    train_logits = train_logits_of(dparams)
    worst = 0.0
    for a, p in enumerate(anchor_list):
        ref = step_logits(dparams, feats[:, :p], jnp.asarray(p))
        # offsets 1..B-1, relative to the logits' scale (SPEC: scale-relative in float32)
        worst = max(worst, float(jnp.max(jnp.abs(ref[0] - train_logits[0, a])) / jnp.max(jnp.abs(ref[0]))))
    return worst


@pytest.mark.parametrize(
    "layer_types, block_input, copy_bias",
    [
        (("full_attention", "full_attention"), "mask", None),
        (("full_attention", "sliding_attention"), "mask", None),
        (("full_attention", "full_attention"), "ngram", None),
        (("full_attention", "full_attention"), "ngram", 2.0),
    ],
)
def test_training_forward_equals_decoder_drafter_random(tiny, layer_types, block_input, copy_bias):
    """The training forward's logits at each anchor equal the draft step's on the same context; with
    n-gram block inputs, the blocks built from the sequence equal those built from the loop's buffer;
    with a copy bias (a random table, so each matched length and offset has its own), the bonus
    lands on the same tokens in both."""
    ck, folder = tiny
    dcfg = DrafterConfig.for_target(
        ck.cfg,
        num_layers=2,
        block_size=8,
        mask_token_id=3,
        layer_types=layer_types,
        sliding_window=5 if "sliding_attention" in layer_types else None,
        block_input=block_input,
        copy_bias=copy_bias,
    )
    tokens, _ = data.TokenDataset(folder)[0]
    anchors = [3, 9, 10, 30]
    if block_input == "ngram":  # the blocks carry proposals, and not at every anchor the same number
        from dflash_jax.ngram import ngram_match

        t = jnp.asarray([tokens.tolist() + [0] * 8] * len(anchors))
        _, num, matched = ngram_match(t, jnp.asarray(anchors), 7, dcfg.ngram_max, dcfg.ngram_min)
        assert int(num.max()) > 0 and len(set(num.tolist())) > 1 and len(set(matched.tolist())) > 1, (num, matched)
    params = init_drafter_params(dcfg, seed=1)
    if copy_bias is not None:
        assert params["copy_bias"].shape == (dcfg.ngram_max, 7) and float(params["copy_bias"].min()) == copy_bias
        params = dict(params, copy_bias=3.0 * jax.random.normal(jax.random.key(5), params["copy_bias"].shape))
    worst = _consistency(ck, params, dcfg, tokens.tolist(), anchors)
    assert worst < TINY_REL, worst


# --- a real training run: learns, decodes with tau > 2, equals the reference ------------------


@pytest.fixture(scope="session")
def trained(tiny, tmp_path_factory):
    ck, folder = tiny
    out = tmp_path_factory.mktemp("run") / "r"
    c = tiny_config(ck, folder, out, "train.steps=500", "eval.every=250", "ckpt.every=250", "eval.decode_prompts=4")
    trainer = Trainer(c, log=lambda *_: None)
    last = trainer.run()
    return ck, folder, out, trainer, last


def test_trained_drafter_consistent_with_decoder(trained):
    ck, folder, _, trainer, _ = trained
    tokens, _ = data.TokenDataset(folder)[1]
    assert _consistency(ck, trainer.params, trainer.dcfg, tokens.tolist(), [4, 12, 13, 40]) < TINY_REL


def test_anchor_acceptance_predicts_the_decoders_rounds(trained):
    """experiments/anchor_acceptance.py: rounds simulated from the training forward's per-anchor greedy
    acceptance are the decoder's rounds on the same answer (the target's own greedy answer); and
    experiments/study_tau.py's rounds, the last one cut where the answer ends, are all of them, for the
    drafter (over the whole vocabulary and over a draft vocabulary) and for prompt lookup."""
    sys.path.insert(0, str(ROOT / "experiments"))
    from anchor_acceptance import acceptance_at_anchors, simulated_rounds
    from study_tau import drafter_rounds, ngram_rounds

    from dflash_jax.drafter import with_draft_vocab
    from dflash_jax.ngram import NgramStep

    ck, folder, out, trainer, _ = trained
    ds = data.TokenDataset(folder)
    dec = Decoder(ck.params, ck.cfg, make_plan(DraftStep(trainer.dcfg, ck.cfg), trainer.params))
    bs = trainer.dcfg.block_size
    lookup = Decoder(ck.params, ck.cfg, make_plan(NgramStep(block_size=bs)))
    ids = np.arange(0, ck.cfg.vocab_size, 2)  # the even tokens
    cut = Decoder(
        ck.params,
        ck.cfg,
        make_plan(DraftStep(trainer.dcfg, ck.cfg), with_draft_vocab(trainer.params, ids, ck.params, ck.cfg)),
    )
    compared = changed = 0
    for j in trainer.val_idx[:4]:
        tokens, mask = ds[int(j)]
        tokens, mask = np.asarray(tokens), np.asarray(mask, bool)
        first = int(np.argmax(mask))
        sim = simulated_rounds(acceptance_at_anchors(ck, trainer.params, trainer.dcfg, tokens, mask))
        got = dec.generate([tokens[:first].tolist()], len(tokens) - first)[0]
        assert got.token_ids[: len(tokens) - first] == tokens[first:].tolist()  # the answer is the target's own
        n = len(sim) - 1  # the last simulated round may need tokens past the answer's end
        assert got.acceptance_lengths[:n] == sim[:n]
        compared += n
        full = tokens.tolist()
        assert drafter_rounds(ck, trainer.params, trainer.dcfg, full, first) == got.acceptance_lengths
        want = lookup.generate([full[:first]], len(full) - first)[0].acceptance_lengths
        assert ngram_rounds(full, first, bs) == want
        # over a draft vocabulary (study_tau.py --draft-vocab): the decoder's rounds with that list
        got_cut = cut.generate([full[:first]], len(full) - first)[0]
        assert drafter_rounds(ck, trainer.params, trainer.dcfg, full, first, vocab=ids) == got_cut.acceptance_lengths
        changed += got_cut.acceptance_lengths != got.acceptance_lengths
    assert compared >= 8 and changed  # the list cut some accepted drafts


def test_study_tau_runs_a_copy_bias_drafter_at_a_smaller_block(tiny):
    """experiments/study_tau.py at block 4 with a block-8 copy-bias drafter (its table cut to the block,
    ``at_block_size``): the rounds of a decode with ``block_size=4``, but for the last one (where
    the decoder hides offsets past the length limit from the drafter)."""
    sys.path.insert(0, str(ROOT / "experiments"))
    from study_tau import at_block_size, drafter_rounds

    ck, folder = tiny
    dcfg = DrafterConfig.for_target(
        ck.cfg, num_layers=1, block_size=8, mask_token_id=3, block_input="ngram", copy_bias=1.0
    )
    params = init_drafter_params(dcfg, seed=3)
    params = dict(params, copy_bias=40.0 * jax.random.uniform(jax.random.key(1), params["copy_bias"].shape))
    dec = Decoder(ck.params, ck.cfg, make_plan(DraftStep(dcfg, ck.cfg), params, block_size=4))
    tokens, mask = data.TokenDataset(folder)[2]
    first = int(np.argmax(np.asarray(mask)))
    full = np.asarray(tokens).tolist()
    got = dec.generate([full[:first]], len(full) - first)[0]
    assert got.token_ids == full[first:]
    sim = drafter_rounds(ck, *at_block_size(params, dcfg, 4), full, first)
    assert sim[:-1] == got.acceptance_lengths[:-1] and max(sim) > 1


def test_trained_drafter_tau_above_2_and_equal_to_reference(trained, tmp_path, monkeypatch):
    import dflash.model
    import torch
    from dflash.model import DFlashDraftModel, dflash_generate

    from dflash_jax.drafter_io import export_released, load_drafter

    monkeypatch.setattr(dflash.model, "_cuda_time", time.perf_counter)
    ck, folder, out, trainer, last = trained
    params, dcfg, ident = load_drafter(out / "drafter")  # what `generate --drafter` loads
    assert ident == ck.identity
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == list(range(1, 501))
    assert lines[-1]["loss"] < lines[0]["loss"] - 1.0 and "val_loss" in lines[-1]
    assert (out / "best" / "dflash_jax.json").exists()

    ds = data.TokenDataset(folder)
    prompts = []
    for j in trainer.val_idx[:8]:
        tok, lm = ds[int(j)]
        prompts.append(tok[: int(np.argmax(lm))].tolist())
    dec = Decoder(ck.params, ck.cfg, make_plan(DraftStep(dcfg, ck.cfg), params))
    results = dec.generate(prompts, 48)
    lengths = [a for r in results for a in r.acceptance_lengths]
    tau = float(np.mean(lengths))
    print(f"decode tau on held-out prompts: {tau:.2f}; train-time estimate {last['tau_blocks']:.2f}")
    assert tau > 2.0 and max(lengths) >= 5

    export_released(params, dcfg, tmp_path / "rel")
    ref = DFlashDraftModel.from_pretrained(tmp_path / "rel", dtype=torch.float32).eval()
    for p, r in zip(prompts, results):
        o = dflash_generate(ref, ck.hf, torch.tensor([p]), max_new_tokens=48, stop_token_ids=None, return_stats=True)
        assert r.acceptance_lengths == o.acceptance_lengths
        assert r.token_ids == o.output_ids[0, len(p) :].tolist()

    # with real multi-token rounds: a stop token and the length limit that cut a round short
    cut = {"stop": 0, "limit": 0}
    for p, r in zip(prompts, results):
        ends = np.cumsum([0] + r.acceptance_lengths)  # round k commits new tokens ends[k]+1 .. ends[k+1]
        inner = [i for i in range(1, len(r.token_ids)) if i not in ends and r.token_ids.index(r.token_ids[i]) == i]
        cases = [([r.token_ids[inner[0]]], 48, "stop")] if inner else []
        long = [k for k, a in enumerate(r.acceptance_lengths) if a >= 3]
        if long:
            cases.append(([], int(ends[long[0]]) + 1 + r.acceptance_lengths[long[0]] // 2, "limit"))
        for stop, n_new, kind in cases:
            ours = dec.generate([p], n_new, stop)[0]
            o = dflash_generate(
                ref, ck.hf, torch.tensor([p]), max_new_tokens=n_new, stop_token_ids=stop or None, return_stats=True
            )
            assert ours.acceptance_lengths == o.acceptance_lengths
            assert ours.token_ids == o.output_ids[0, len(p) :].tolist()
            k = len(ours.acceptance_lengths) - 1
            cut[kind] += ours.acceptance_lengths[k] < r.acceptance_lengths[k]  # the last round was cut short
    assert cut["stop"] >= 1 and cut["limit"] >= 1, cut


def test_plot_run(trained, tmp_path, capsys):
    """dflash-jax plot-run: a run's metrics as a PNG, from its folder or its metrics.jsonl; one-line errors."""
    from dflash_jax.cli import main

    _, _, out, _, _ = trained
    png = tmp_path / "m.png"
    main(["plot-run", str(out), "--out", str(png)])
    assert capsys.readouterr().out.strip() == str(png)
    assert png.stat().st_size > 20_000 and png.read_bytes()[:4] == b"\x89PNG"
    (tmp_path / "empty.jsonl").write_text('{"step": 1, "lo')  # cut by a kill: no metrics
    for bad in (tmp_path / "missing", tmp_path / "empty.jsonl"):
        with pytest.raises(SystemExit, match="^error: .*(no such file|holds no training metrics)"):
            main(["plot-run", str(bad)])


def test_ship_drafter_writes_a_released_folder_with_every_stage(trained, tmp_path):
    """dflash-jax ship-drafter: released-format files that load back to the run's drafter, the run's
    record, and an earlier stage counted in the summary and the README."""
    from dflash_jax.cli import main
    from dflash_jax.drafter_io import load_drafter

    _, folder, out, trainer, _ = trained
    ship = ["ship-drafter", str(out), "--out", str(tmp_path / "a"), "--command", "TRAIN-COMMAND"]
    main(ship + ["--earlier-stage", str(out)])
    a = tmp_path / "a"
    assert {p.name for p in a.iterdir()} >= {
        "config.json",
        "model.safetensors",
        "train_config.json",
        "training_summary.json",
        "loss.png",
        "README.md",
    }
    info = json.loads((a / "training_summary.json").read_text())
    assert info["steps"] == 500 and info["total_steps"] == 1000 and info["earlier_stages"][0]["steps"] == 500
    readme = (a / "README.md").read_text()
    assert "TRAIN-COMMAND" in readme and f"--earlier-stage {out}" in readme and "1000 steps" in readme
    params, cfg, _ = load_drafter(a)
    best, _, _ = load_drafter(out / "best")
    assert dflash_format.config_json(cfg) == dflash_format.config_json(trainer.dcfg)
    for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(best)):  # bfloat16 copies of the best drafter
        np.testing.assert_allclose(np.asarray(x, np.float32), np.asarray(y, np.float32), rtol=1e-2, atol=1e-2)
    with pytest.raises(SystemExit, match="^error: .*not the drafter inside it"):
        main(ship[:3] + [str(tmp_path / "b"), "--earlier-stage", str(out / "best")])
    assert not (tmp_path / "b").exists()
    with pytest.raises(SystemExit, match="^error: .*exists"):  # an existing folder only with --overwrite
        main(ship + ["--earlier-stage", str(out)])
    # a stage continuing a shipped folder: its steps, hours and commands carried on
    c = tmp_path / "c"
    vocab = ["--draft-vocab", str(folder), "--draft-vocab-size", "40"]  # and a draft vocabulary counted on the data
    main(ship[:3] + [str(c), "--command", "NEXT", "--continues", str(a), *vocab])
    from dflash_jax.drafter_io import read_draft_vocab

    ids = read_draft_vocab(c)
    ds = data.TokenDataset(folder)
    answers = np.concatenate([t[m.astype(bool)] for t, m in (ds[i] for i in range(len(ds)))])
    assert len(ids) == 40 and np.bincount(answers).argmax() == ids[0]  # the most frequent answer token first
    assert "draft_vocab.json" in (c / "README.md").read_text()
    info_c = json.loads((c / "training_summary.json").read_text())
    assert info_c["total_steps"] == 1500 and info_c["earlier_stages"][0]["run"] == f"{a} as shipped before"
    readme_c = (c / "README.md").read_text()
    assert readme_c.index("TRAIN-COMMAND") < readme_c.index("NEXT") and f"--continues {a}" in readme_c
    with pytest.raises(SystemExit, match="^error: .*give a folder made by dflash-jax ship-drafter"):
        main(ship[:3] + [str(tmp_path / "d"), "--continues", str(out)])
    # continuing it with no --draft-vocab carries its vocabulary over, and the README says so
    main(ship[:3] + [str(tmp_path / "c2"), "--continues", str(c)])
    assert read_draft_vocab(tmp_path / "c2").tolist() == ids.tolist()
    assert "`draft_vocab.json`: the draft vocabulary, the 40 tokens" in (tmp_path / "c2" / "README.md").read_text()
    assert f"(carried over from {c})" in (tmp_path / "c2" / "README.md").read_text()
    import shutil

    shutil.copytree(c, tmp_path / "c_bad")  # a malformed one is refused, naming the file and the fix
    (tmp_path / "c_bad" / "draft_vocab.json").write_text(json.dumps({"ids": [10**9]}))
    with pytest.raises(SystemExit, match="^error: .*draft_vocab.json: .*dflash-jax draft-vocab"):
        main(ship[:3] + [str(tmp_path / "c3"), "--continues", str(tmp_path / "c_bad")])
    assert not (tmp_path / "c3").exists()
    # checkpoint averaging: the run's weights times W plus another drafter's of the same configuration
    from dflash_jax.drafter_io import export_released

    halves = jax.tree.map(lambda x: np.full(np.shape(x), 0.5, np.float32), best)
    export_released(halves, trainer.dcfg, tmp_path / "halves")
    main(ship[:3] + [str(tmp_path / "avg"), "--average-with", str(tmp_path / "halves"), "--average-weight", "0.25"])
    averaged, _, _ = load_drafter(tmp_path / "avg")
    for x, y in zip(jax.tree.leaves(averaged), jax.tree.leaves(best)):
        want = 0.25 * np.asarray(y, np.float32) + 0.375
        np.testing.assert_allclose(np.asarray(x, np.float32), want, rtol=1e-2, atol=1e-2)
    assert json.loads((tmp_path / "avg" / "training_summary.json").read_text())["averaged_with"] == {
        "drafter": str(tmp_path / "halves"),
        "weight_of_this_run": 0.25,
    }
    assert f"--average-with {tmp_path / 'halves'} --average-weight 0.25" in (tmp_path / "avg" / "README.md").read_text()
    import dataclasses

    wider = dataclasses.replace(trainer.dcfg, intermediate_size=2 * trainer.dcfg.intermediate_size)
    from dflash_jax.drafter import init_drafter_params

    export_released(init_drafter_params(wider, seed=0), wider, tmp_path / "wider")
    with pytest.raises(SystemExit, match="^error: .*another configuration \\(intermediate_size differ\\)"):
        main(ship[:3] + [str(tmp_path / "e"), "--average-with", str(tmp_path / "wider")])
    with pytest.raises(SystemExit, match="^error: average weight 0.0: give the run's share in \\(0, 1\\]"):
        main(ship[:3] + [str(tmp_path / "e"), "--average-with", str(tmp_path / "halves"), "--average-weight", "0"])
    assert not (tmp_path / "e").exists()
    # the draft vocabulary alone, for a folder shipped without one: dflash-jax draft-vocab
    main(["draft-vocab", str(folder), "--write", str(a), "--size", "24", "--sizes", "8", "16"])
    assert read_draft_vocab(a)[:24].tolist() == ids[:24].tolist()  # the same counts, the first 24
    assert json.loads((a / "draft_vocab.json").read_text())["command"].startswith("dflash-jax draft-vocab")
    with pytest.raises(SystemExit, match="^error: .*not a drafter folder"):
        main(["draft-vocab", str(folder), "--write", str(tmp_path / "nothing")])
    with pytest.raises(SystemExit, match="^error: .*draft vocabulary size"):
        main(["draft-vocab", str(folder), "--write", str(a), "--size", str(10**7)])


# --- length buckets ----------------------------------------------------------------------------


def test_bucketed_batches_regroup_the_same_rows_and_pad_to_the_smallest_bucket(tiny):
    _, folder = tiny
    ds = data.TokenDataset(folder)
    idx, _ = pipeline.split_indices(len(ds), 32, seed=0)
    rows = pipeline.rows(ds, idx, max_len=80, seed=3)
    lengths = np.minimum(ds.lengths()[idx], 80)
    assert lengths.min() < 70 < 73 < lengths.max()  # the tiny data spans several buckets
    # a single bucket and windows of one batch: exactly the unbucketed stream
    one = pipeline.bucketed_batches(ds, idx, batch_size=8, max_len=80, buckets=(80,), seed=3, window=1)
    for s in (0, 5, 130):
        want = [rows[s * 8 + j] for j in range(8)]
        assert np.array_equal(one[s]["tokens"], np.stack([w["tokens"] for w in want]))
        assert np.array_equal(one[s]["loss_mask"], np.stack([w["loss_mask"] for w in want]))
    buckets, window = (70, 73), 4
    b = pipeline.bucketed_batches(ds, idx, batch_size=8, max_len=80, buckets=buckets, seed=3, window=window)
    again = pipeline.bucketed_batches(ds, idx, batch_size=8, max_len=80, buckets=buckets, seed=3, window=window)
    order = grain.MapDataset.range(len(idx)).shuffle(seed=3).repeat(None)  # which sequence each row is
    key = lambda r: (r["tokens"].tobytes(), r["loss_mask"].tobytes())  # noqa: E731
    pad = lambda t, m: {"tokens": np.pad(t, (0, 80 - len(t))), "loss_mask": np.pad(m, (0, 80 - len(m)))}  # noqa: E731
    seen_lengths = set()
    for w in (0, 1, 40):  # windows inside the first epoch and past it
        span = [rows[w * 32 + j] for j in range(32)]
        length_of = {key(r): int(lengths[order[w * 32 + j]]) for j, r in enumerate(span)}
        got = [b[w * window + i] for i in range(window)]
        regrouped = []
        for i, g in enumerate(got):
            assert np.array_equal(g["tokens"], again[w * window + i]["tokens"])  # a pure function of the step
            L = g["tokens"].shape[1]
            seen_lengths.add(L)
            batch_rows = [pad(g["tokens"][r], g["loss_mask"][r]) for r in range(8)]
            longest = max(length_of[key(r)] for r in batch_rows)  # KeyError: a row not from this window
            assert L == min(x for x in (*buckets, 80) if x >= longest)
            regrouped += batch_rows
        # the window's rows, re-grouped: every row once, with only padding cut away
        assert sorted(map(key, regrouped)) == sorted(map(key, span))
    assert len(seen_lengths) >= 2  # batches really are cut shorter than max_len
    with pytest.raises(ValueError, match="increasing positive integers"):
        pipeline.bucketed_batches(ds, idx, batch_size=8, max_len=80, buckets=(73, 70), seed=3)
    with pytest.raises(ValueError, match="<= max_len"):
        pipeline.bucketed_batches(ds, idx, batch_size=8, max_len=80, buckets=(96,), seed=3)
    for bad in ("123", 32, (32.7,), (True,)):  # only a tuple/list of integers, never coerced
        with pytest.raises(ValueError, match="tuple/list of increasing positive integers"):
            pipeline.bucketed_batches(ds, idx, batch_size=8, max_len=80, buckets=bad, seed=3)


def test_training_with_length_buckets_compiles_per_bucket_and_learns(tiny, tmp_path):
    ck, folder = tiny
    c = tiny_config(ck, folder, tmp_path / "run", "train.steps=12", "train.length_buckets=(70, 73)", "eval.every=1000")
    tr = Trainer(c, log=lambda *a: None)
    shapes = {tr.global_batch(s)["tokens"].shape[-1] for s in range(12)}
    assert shapes <= {70, 73, 80} and len(shapes) >= 2
    tr.run()
    losses = [r["loss"] for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())]
    assert len(losses) == 12 and all(np.isfinite(losses)) and np.mean(losses[-4:]) < np.mean(losses[:4])
    assert tr.identity["train"]["length_buckets"] == [70, 73, 80] and tr.identity["bucket_window"] == 16
    same = Trainer(
        tiny_config(
            ck, folder, tmp_path / "same", "train.steps=12", "train.length_buckets=(70, 73, 80)", "eval.every=1000"
        ),
        log=lambda *a: None,
    )
    assert same.run_id == tr.run_id  # max_len is always the last bucket: both spellings are one run
    plain = Trainer(tiny_config(ck, folder, tmp_path / "plain", "train.steps=12"), log=lambda *a: None)
    assert "length_buckets" not in plain.identity["train"]  # at the default, older runs keep their identity
    with pytest.raises(ConfigError, match="length_buckets"):
        Trainer(tiny_config(ck, folder, tmp_path / "bad", "train.length_buckets=(73, 70)"))


# --- exact resume after SIGKILL ---------------------------------------------------------------


def _train_cmd(ck, folder, out, steps=40):
    return [
        sys.executable,
        "-m",
        "dflash_jax.cli",
        "train",
        "--config",
        CONFIG,
        f"target={ck.path}",
        f"data={folder}",
        f"out_dir={out}",
        "drafter.num_layers=1",
        "drafter.block_size=8",
        "train.max_len=80",
        "train.num_anchors=16",
        "train.anchor_chunk=8",
        "train.batch_size=8",
        "train.grad_accum=2",
        f"train.steps={steps}",
        "ckpt.every=10",
        "eval.every=1000",
        "eval.val_size=8",
        "eval.decode_prompts=0",
    ]


def _losses(out):
    return [
        (r["step"], r["loss"], r["grad_norm"])
        for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
    ]


def test_resume_after_sigkill_is_bitwise_identical(tiny, tmp_path):
    ck, folder = tiny
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(_train_cmd(ck, folder, tmp_path / "a"), check=True, capture_output=True, env=env)
    proc = subprocess.Popen(
        _train_cmd(ck, folder, tmp_path / "b"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    log = tmp_path / "b" / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline:
        if log.exists() and len(log.read_text().splitlines()) >= 25:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = len(log.read_text().splitlines())
    assert 25 <= killed_at < 40, killed_at  # really killed mid-run, after a checkpoint
    subprocess.run(_train_cmd(ck, folder, tmp_path / "b"), check=True, capture_output=True, env=env)
    a, b = _losses(tmp_path / "a"), _losses(tmp_path / "b")
    assert [s for s, *_ in b] == list(range(1, 41))
    assert a == b  # floats compared exactly


# --- bad input --------------------------------------------------------------------------------


def test_bad_data_is_a_clear_error(tiny, tmp_path):
    ck, folder = tiny
    with pytest.raises(data.DataError, match="no two consecutive supervised"):
        data.write_dataset(tmp_path / "x", [[5, 6, 7], [5, 6, 7]], [[False, True, True], [True, False, True]])
    assert not (tmp_path / "x").exists()
    with pytest.raises(data.DataError, match="not a token dataset"):
        data.TokenDataset(ck.path)
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    np.save(bad / "tokens.npy", np.zeros(5, np.float32))
    with pytest.raises(data.DataError, match="tokens.npy"):
        data.TokenDataset(bad)
    np.save(bad / "tokens.npy", np.zeros(7, np.int32))
    with pytest.raises(data.DataError, match="do not match"):
        data.TokenDataset(bad)
    with pytest.raises(data.DataError, match="integers"):
        data.write_dataset(tmp_path / "x", [[5, 6.7, 7]], [[False, True, True]])
    with pytest.raises(data.DataError, match="no two consecutive"):  # an empty last sequence
        data.write_dataset(tmp_path / "x", [[5, 6, 7], []], [[False, True, True], []])
    idx = tmp_path / "idx"
    idx.mkdir()
    (idx / "meta.json").write_text(json.dumps({"format": data.SHARDED_FORMAT, "shards": "shard_00000"}))
    with pytest.raises(data.DataError, match="non-empty list"):
        data.TokenDataset(idx)
    big = data.write_dataset(tmp_path / "big", [[500, 501, 502]], [[False, True, True]])
    with pytest.raises(data.DataError, match="another model"):
        data.TokenDataset(big).check_vocab(96)


def test_bad_config_and_foreign_checkpoint_are_clear_errors(tiny, tmp_path):
    ck, folder = tiny
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match="block_size"):
        Trainer(tiny_config(ck, folder, out, "drafter.block_size=1"))
    with pytest.raises(ConfigError, match="target_layer_ids"):
        Trainer(tiny_config(ck, folder, out, "drafter.target_layer_ids=(1, 7)"))
    with pytest.raises(ConfigError, match="unknown config key"):
        tiny_config(ck, folder, out, "train.stepz=3")
    with pytest.raises(ConfigError, match="expected int"):
        tiny_config(ck, folder, out, "train.steps=abc")
    for bad, msg in (
        ("train.gamma=0", "train.gamma"),
        ("train.num_anchors=0", "train.num_anchors"),
        ("train.compute_dtype=bf16", "compute_dtype"),
        ("drafter.mask_token_id=1.5", "mask_token_id"),
        ("eval.every=0", "eval.every"),
        ("train.lr.x=1", "unknown config key"),
        ("target=None", "target"),
    ):
        with pytest.raises(ConfigError, match=msg):
            tiny_config(ck, folder, out, bad)
    broken = tmp_path / "broken.py"
    broken.write_text("def get_config(:\n")
    with pytest.raises(ConfigError, match="broken.py failed to load: SyntaxError"):
        load_config(broken)
    stale = stale_scratch(out / "best")  # what a kill during an export leaves
    mine = out / "thesis.old-2023"  # a user's folder that merely looks like a leftover
    mine.mkdir()
    (mine / "c.tex").write_text("a")
    with pytest.raises(DataError):  # a run that fails deletes nothing
        Trainer(tiny_config(ck, folder, out, "data=" + str(tmp_path / "nope")))
    assert stale.exists() and (mine / "c.tex").read_text() == "a"
    Trainer(tiny_config(ck, folder, out, "train.steps=2", "ckpt.every=1", "eval.every=100")).run()
    assert not stale.exists() and (mine / "c.tex").read_text() == "a"  # only our own scratch goes
    before = sorted((p.relative_to(out), p.stat().st_mtime_ns) for p in out.rglob("*"))
    with pytest.raises(checkpoint.CheckpointError, match="another drafter"):
        Trainer(tiny_config(ck, folder, out, "train.steps=2", "drafter.num_layers=1"))
    assert sorted((p.relative_to(out), p.stat().st_mtime_ns) for p in out.rglob("*")) == before


@pytest.mark.slow
def test_short_training_run_on_smollm2(tmp_path, capsys):
    """The committed SmolLM2 fixture data (the target's own answers to 96 training prompts):
    a short run writes a checkpoint, a metrics log and a plot, and its drafter decodes."""
    from dflash_jax.cli import main

    out = tmp_path / "run"
    main(
        [
            "train",
            "--config",
            CONFIG,
            f"data={ROOT / 'tests' / 'fixtures' / 'smollm2_96'}",
            f"out_dir={out}",
            "train.steps=6",
            "train.batch_size=2",
            "train.max_len=256",
            "train.num_anchors=32",
            "eval.every=6",
            "eval.val_size=8",
            "eval.decode_prompts=1",
            "eval.decode_max_new_tokens=8",
            "ckpt.every=3",
        ]
    )
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 7)) and "val_decode_tau" in rows[-1]
    assert all(np.isfinite(r["loss"]) for r in rows)
    assert sorted(p.name for p in (out / "ckpt").iterdir() if p.name.isdigit()) == ["3", "6"]
    main(["plot-run", str(out / "metrics.jsonl")])
    assert (out / "metrics.png").stat().st_size > 20_000
    capsys.readouterr()
    main(
        [
            "generate",
            "--drafter",
            str(out / "drafter"),
            "--prompt",
            "What is 2 + 3?",
            "--chat",
            "--max-new-tokens",
            "8",
            "--block-size",
            "8",
            "--json",
        ]
    )
    rec = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rec["num_output_tokens"] == 8 and sum(rec["acceptance_lengths"]) == 7


def test_loss_is_normalised_over_the_whole_global_batch(tiny):
    """With accumulation, the update equals the gradient of (sum of weighted CE over every
    micro-batch) / (sum of weights over every micro-batch), not a mean of per-micro losses."""
    import optax

    from dflash_jax.train_step import train_step

    ck, folder = tiny
    dcfg = DrafterConfig.for_target(ck.cfg, num_layers=1, block_size=8, mask_token_id=3)
    params = init_drafter_params(dcfg, seed=0)
    src = pipeline.PaddedSource(data.TokenDataset(folder), np.arange(4), 80)
    rows = [src[i] for i in range(4)]
    batch = {k: np.stack([r[k] for r in rows]).reshape(2, 2, 80) for k in rows[0]}
    batch["loss_mask"][1, :, 50:] = False  # the micro-batches carry different total weights
    rng = jax.random.PRNGKey(3)
    kw = dict(tcfg=ck.cfg, dcfg=dcfg, num_anchors=16, loss=loss.LossSettings(gamma=4.0, anchor_chunk=8))
    new, _, _ = train_step(params, optax.sgd(1.0).init(params), ck.params, batch, rng, opt=optax.sgd(1.0), **kw)
    keys = jax.random.split(rng, 2)

    def global_loss(p):
        sums = [
            block_loss(
                p,
                ck.params,
                batch["tokens"][i],
                batch["loss_mask"][i],
                loss.sample_anchors(keys[i], batch["loss_mask"][i], 16),
                tcfg=ck.cfg,
                cfg=dcfg,
                gamma=4.0,
                anchor_chunk=8,
            )
            for i in range(2)
        ]
        return (sums[0].loss + sums[1].loss) / (sums[0].weight + sums[1].weight)

    grads = jax.grad(global_loss)(params)
    for g, p0, p1 in zip(jax.tree.leaves(grads), jax.tree.leaves(params), jax.tree.leaves(new)):
        assert_close(np.asarray(p0 - p1), np.asarray(g), 1e-4)  # float32 sums in another order


def test_bfloat16_compute_trains(tiny, tmp_path):
    ck, folder = tiny
    trainer = Trainer(
        tiny_config(
            ck,
            folder,
            tmp_path / "bf16",
            "train.compute_dtype='bfloat16'",
            "train.steps=3",
            "eval.every=100",
            "ckpt.every=100",
        ),
        log=lambda *_: None,
    )
    last = trainer.run()
    assert np.isfinite(last["loss"]) and jax.tree.leaves(trainer.params)[0].dtype == jnp.float32


def test_unfinished_dataset_and_small_validation(tiny, tmp_path):
    """An unfinished prepare-data folder is refused; a validation set smaller than a micro-batch is
    still evaluated (padded batch), so best/ is written."""
    ck, folder = tiny
    import shutil

    part = tmp_path / "part"
    (part / "shard_00000").parent.mkdir(parents=True)
    shutil.copytree(folder, part / "shard_00000")
    n = data.TokenDataset(folder).meta["num_sequences"]
    (part / "meta.json").write_text(
        json.dumps(
            {
                "format": data.SHARDED_FORMAT,
                "format_version": 1,
                "complete": False,
                "shards": ["shard_00000"],
                "num_sequences": n,
            }
        )
    )
    with pytest.raises(data.DataError, match="is incomplete"):
        Trainer(tiny_config(ck, part, tmp_path / "r1"))
    with pytest.raises(data.DataError, match="fewer than the 2"):
        Trainer(tiny_config(ck, part, tmp_path / "r1", "data_shards=2"))
    prefix = Trainer(tiny_config(ck, part, tmp_path / "r1", "data_shards=1"), log=lambda *_: None)
    assert len(prefix.ds) == n and prefix.identity["data"]["shards"] == ["shard_00000"]
    trainer = Trainer(
        tiny_config(ck, folder, tmp_path / "r2", "eval.val_size=3", "train.steps=2", "eval.every=2"),
        log=lambda *_: None,
    )
    last = trainer.run()
    assert np.isfinite(last["val_loss"]) and (tmp_path / "r2" / "best" / "dflash_jax.json").exists()


def test_several_data_folders_train_as_one_dataset(tiny, tmp_path):
    """``data`` naming two folders reads them as one dataset, the first's sequences first; the run
    records each part's identity (a one-folder run's identity keeps its form), and trains; a part left
    unfinished is refused by name; one folder named twice (in any spelling) or two holding the same
    answers, counts that do not fit the folders, and stored features with several folders are refused."""
    ck, folder = tiny
    import shutil

    one = data.TokenDataset(folder)
    n = len(one)
    rows = [one[i] for i in range(n)][::-1][: n // 2]  # other answers, in another order
    second = data.write_dataset(
        tmp_path / "chats",
        [t for t, _ in rows],
        [m for _, m in rows],
        meta={"tokenizer_sha256": one.meta["tokenizer_sha256"]},
    )
    mix = data.open_data([folder, second])
    assert isinstance(mix, data.DatasetMix) and len(mix) == n + n // 2
    for i, (tok, mask) in ((0, one[0]), (n - 1, one[n - 1]), (n, rows[0]), (n + n // 2 - 1, rows[-1])):
        assert np.array_equal(mix[i][0], tok) and np.array_equal(mix[i][1], mask)
    assert np.array_equal(mix.lengths(), np.concatenate([one.lengths(), [len(t) for t, _ in rows]]))
    assert mix.shard_start(1) == n and mix.locate(n) == (1, 0)
    assert [p["num_sequences"] for p in mix.identity["parts"]] == [n, n // 2]
    # a one-folder run records what it always did: these keys, from the shard's own meta.json
    meta = json.loads((folder / "meta.json").read_text())
    assert one.identity == {
        "num_sequences": meta["num_sequences"],
        "num_tokens": meta["num_tokens"],
        "shards": [folder.name],
        "tokenizer_sha256": meta["tokenizer_sha256"],
        "source": meta.get("source"),
        "content_sha256": [meta["content_sha256"]],
    }
    assert data.open_data([folder]).identity == one.identity == data.open_data(folder, (0,)).identity

    out = tmp_path / "r"
    c_args = (f"data=('{folder}', '{second}')", "train.steps=2", "eval.every=2")
    c = tiny_config(ck, folder, out, *c_args)
    assert c.data == (str(folder), str(second)) and c.data_shards == 0
    trainer = Trainer(c, log=lambda *_: None)
    assert len(trainer.ds) == n + n // 2 and trainer.identity["data"] == mix.identity
    assert np.isfinite(trainer.run()["loss"])
    solo = Trainer(tiny_config(ck, folder, tmp_path / "solo"), log=lambda *_: None)
    assert solo.identity["data"] == one.identity and "data_repeats" not in solo.identity
    # data_repeats: the second folder's training answers three times an epoch, the held-out ones untouched
    weighted = Trainer(tiny_config(ck, folder, tmp_path / "w", *c_args, "data_repeats=(1, 3)"), log=lambda *_: None)
    assert np.array_equal(weighted.val_idx, trainer.val_idx) and weighted.identity["data_repeats"] == [1, 3]
    first, later = trainer.train_idx[trainer.train_idx < n], trainer.train_idx[trainer.train_idx >= n]
    assert np.array_equal(np.sort(weighted.train_idx), np.sort(np.concatenate([first, later, later, later])))
    assert weighted.run_id != trainer.run_id
    ones = tiny_config(ck, folder, tmp_path / "w1", *c_args, "data_repeats=(1, 1)")
    assert Trainer(ones, log=lambda *_: None).run_id == trainer.run_id  # all 1: the same run

    part = tmp_path / "part"  # a sharded folder whose prepare-data has not finished
    shutil.copytree(second, part / "shard_00000")
    meta = {"format": data.SHARDED_FORMAT, "format_version": 1, "complete": False, "shards": ["shard_00000"]}
    (part / "meta.json").write_text(json.dumps({**meta, "num_sequences": n // 2}))
    with pytest.raises(data.DataError, match=f"{part} is incomplete"):
        Trainer(tiny_config(ck, folder, tmp_path / "r2", f"data=('{folder}', '{part}')"))
    mixed = Trainer(
        tiny_config(ck, folder, tmp_path / "r3", f"data=('{folder}', '{part}')", "data_shards=(0, 1)"),
        log=lambda *_: None,
    )
    assert len(mixed.ds) == n + n // 2
    for bad, match in (
        ("data_shards=1", "give one count per folder"),
        ("data_shards=(1, 1, 1)", "one integer >= 0 per data folder"),
        ("train.stored_features=True", "stored features; name one folder"),
        ("data_repeats=(1, 0)", "one integer >= 1 per data folder"),
        ("data_repeats=2", "data_repeats must be 1 or a tuple"),
    ):
        with pytest.raises(ConfigError, match=match):
            tiny_config(ck, folder, tmp_path / "r4", f"data=('{folder}', '{part}')", bad)
    with pytest.raises(ConfigError, match="names a folder twice"):
        tiny_config(ck, folder, tmp_path / "r4", f"data=('{folder}', '{folder}')")
    with pytest.raises(data.DataError, match="names one folder twice"):
        data.open_data([folder, f"{folder}/"])
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    with pytest.raises(data.DataError, match="hold the same answers"):
        Trainer(tiny_config(ck, folder, tmp_path / "r5", f"data=('{folder}', '{copy}')"))


def test_best_by_a_tau_writes_best_where_that_tau_peaks(tiny, tmp_path, monkeypatch):
    """eval.best_by="tau_blocks": best/ is written at every validation that raises the held-out
    blocks' tau above all earlier ones (not where the loss falls); a resumed run keeps its best
    score under the same criterion and starts over under another; bad values are refused."""
    ck, folder = tiny
    exported = []
    real = Trainer.export
    monkeypatch.setattr(Trainer, "export", lambda self, name: (exported.append((name, self.step)), real(self, name)))
    args = ("train.steps=6", "eval.every=1", "ckpt.every=3", "eval.decode_prompts=0", "train.lr=3e-3")
    trainer = Trainer(tiny_config(ck, folder, tmp_path / "r", *args, "eval.best_by=tau_blocks"), log=lambda *_: None)
    trainer.run()
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    taus = [r["val_tau_blocks"] for r in rows]
    want = [r["step"] for i, r in enumerate(rows) if taus[i] > max(taus[:i], default=-1.0)]
    assert [step for name, step in exported if name == "best"] == want
    assert trainer.best == -max(taus)
    again = Trainer(tiny_config(ck, folder, tmp_path / "r", *args, "eval.best_by=tau_blocks"), log=lambda *_: None)
    assert again.best == -max(taus)
    other = Trainer(tiny_config(ck, folder, tmp_path / "r", *args, "eval.best_by=loss"), log=lambda *_: None)
    assert other.best == float("inf")  # another criterion: the next validation writes best/
    with pytest.raises(ConfigError, match="eval.best_by must be one of loss, tau_blocks, decode_tau"):
        tiny_config(ck, folder, tmp_path / "x", "eval.best_by=tau")
    with pytest.raises(ConfigError, match="needs eval.decode_prompts >= 1"):
        tiny_config(ck, folder, tmp_path / "x", "eval.best_by=decode_tau", "eval.decode_prompts=0")


def test_val_within_shards_keeps_an_earlier_stages_held_out_answers(tiny, tmp_path):
    """eval.val_within_shards=N: a run on more shards holds out exactly the sequences a run on the
    first N shards held out, and trains on everything else (pipeline.split_indices)."""
    ck, folder = tiny
    import shutil

    two = tmp_path / "two"
    two.mkdir()
    for name in ("shard_00000", "shard_00001"):
        shutil.copytree(folder, two / name)
    n = data.TokenDataset(folder).meta["num_sequences"]
    (two / "meta.json").write_text(
        json.dumps(
            {
                "format": data.SHARDED_FORMAT,
                "format_version": 1,
                "complete": True,
                "shards": ["shard_00000", "shard_00001"],
                "num_sequences": 2 * n,
            }
        )
    )
    quiet = dict(log=lambda *_: None)
    first = Trainer(tiny_config(ck, two, tmp_path / "a", "data_shards=1"), **quiet)
    later = Trainer(tiny_config(ck, two, tmp_path / "b", "eval.val_within_shards=1"), **quiet)
    anywhere = Trainer(tiny_config(ck, two, tmp_path / "c"), **quiet)
    np.testing.assert_array_equal(later.val_idx, first.val_idx)
    np.testing.assert_array_equal(later.train_idx, np.concatenate([first.train_idx, np.arange(n, 2 * n)]))
    assert (anywhere.val_idx >= n).any()  # the default draws from both shards
    assert later.identity["val_within"] == n and "val_within" not in anywhere.identity
    same = Trainer(tiny_config(ck, two, tmp_path / "e", "eval.val_within_shards=2"), **quiet)  # = drawing from all
    assert same.identity == anywhere.identity and (same.val_idx == anywhere.val_idx).all()
    with pytest.raises(ConfigError, match=r"val_within_shards=3 but this run reads 2 shard\(s\)"):
        Trainer(tiny_config(ck, two, tmp_path / "d", "eval.val_within_shards=3"), **quiet)
    with pytest.raises(ConfigError, match=f"val_size={n + 8} needs more than the {n} sequences .* raise val_within"):
        Trainer(tiny_config(ck, two, tmp_path / "d", "eval.val_within_shards=1", f"eval.val_size={n + 8}"), **quiet)
    with pytest.raises(data.DataError, match="validation size 40 must be in"):
        pipeline.split_indices(2 * n, 40, within=39)


def test_missing_mask_token_is_a_config_error():
    from dflash_jax.tokens import mask_token_id

    class Tok:
        def get_vocab(self):
            return {"a": 0, "b": 1}

    with pytest.raises(ConfigError, match="drafter.mask_token_id"):
        mask_token_id(Tok())


@pytest.mark.parametrize("name", ["qwen3_4b", "qwen3_8b", "llama31_8b"])
def test_recipe_configs_load_with_the_public_settings(name):
    c = load_config(ROOT / "configs" / f"{name}.py")
    assert (c.target, c.drafter.num_layers, c.drafter.block_size) == (f"ckpt/{name}", 5, 16)
    assert (c.train.num_anchors, c.train.max_len, c.train.batch_size, c.train.lr) == (512, 3072, 32, 6e-4)
    assert c.train.compute_dtype == "bfloat16" and c.data_shards == 0  # fields inherited from the base config
    assert tuple(c.mesh) == (1, 2, 4)  # the memory plan's first mesh (docs/BENCHMARKS.md "Memory plans")


def test_stage2_recipe_continues_stage1_with_the_same_drafter():
    """experiments/smollm2/smollm2_135m_cpu_v2.py must start from stage 1's output with stage 1's drafter
    fields (``init_from`` refuses anything else), on more data."""
    one = load_config(STAGES / "smollm2_135m_cpu.py")
    two = load_config(STAGES / "smollm2_135m_cpu_v2.py")
    assert two.init_from == one.out_dir + "/best" and two.out_dir != one.out_dir
    assert two.drafter == one.drafter
    assert two.data == one.data and two.data_shards > one.data_shards
    assert two.train.loss_offsets == 8 and two.train.max_len == one.train.max_len
    three = load_config(STAGES / "smollm2_135m_cpu_v3.py")  # stage 3 continues stage 2 the same way
    assert three.init_from == two.out_dir + "/best" and three.out_dir not in (one.out_dir, two.out_dir)
    assert three.drafter == two.drafter and three.data_shards >= two.data_shards
    assert three.train.remat is False and one.train.remat is True
    four = load_config(STAGES / "smollm2_135m_cpu_v4.py")  # stage 4: more shards, stage 2-3's held-out set
    assert four.init_from == three.out_dir + "/best" and four.drafter == three.drafter
    assert four.data_shards > three.data_shards and four.eval.val_within_shards == three.data_shards
    assert (four.eval.val_size, four.seed) == (one.eval.val_size, one.seed) and one.eval.val_within_shards == 0
    five = load_config(STAGES / "smollm2_135m_cpu_v5.py")  # stage 5: more shards, the same held-out set
    assert five.init_from == four.out_dir + "/best" and five.drafter == four.drafter
    assert five.data_shards > four.data_shards and five.eval.val_within_shards == four.eval.val_within_shards
    assert (five.eval.val_size, five.seed) == (four.eval.val_size, four.seed)


def test_init_from_continues_from_a_drafter_and_checks_its_config(trained, tiny, tmp_path):
    import jax

    from dflash_jax.drafter_io import load_drafter

    ck, folder = tiny
    start = trained[2] / "drafter"
    t = Trainer(tiny_config(ck, folder, tmp_path / "a", f"init_from={start}", "train.steps=5"), log=lambda m: None)
    want, _, _ = load_drafter(start)
    for a, b in zip(jax.tree.leaves(t.params), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert t.identity["init_from"] == str(start.resolve())
    # how a drafter's trees are read is no parameter either: a tempered drafter (the shipped one) is continued
    import dataclasses

    from dflash_jax.drafter_io import export_released

    params0, cfg0, identity0 = load_drafter(start)
    tempered = export_released(
        params0, dataclasses.replace(cfg0, tree_temperature=1.5), tmp_path / "tempered", target_identity=identity0
    )
    warm = Trainer(tiny_config(ck, folder, tmp_path / "t", f"init_from={tempered}"), log=lambda m: None)
    assert warm.dcfg.tree_temperature == 1.0  # a trained drafter's trees are read at 1 until tuned for it
    with pytest.raises(ConfigError, match="init_from .*differs from this config's in .*block_size"):
        Trainer(
            tiny_config(ck, folder, tmp_path / "b", f"init_from={start}", "drafter.block_size=4"), log=lambda m: None
        )
    # what fills the blocks is no parameter: a mask-token drafter starts an n-gram-input run
    ngram = Trainer(
        tiny_config(ck, folder, tmp_path / "c", f"init_from={start}", "drafter.block_input=ngram"), log=lambda m: None
    )
    assert ngram.dcfg.block_input == "ngram" and ngram.identity["drafter"]["dflash_config"]["block_input"] == "ngram"
    for a, b in zip(jax.tree.leaves(ngram.params), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # nor is a copy bias the drafter lacks: it starts at the config's value, the rest as loaded
    extra = ("drafter.block_input=ngram", "drafter.copy_bias=3.0")
    copy = Trainer(tiny_config(ck, folder, tmp_path / "d", f"init_from={start}", *extra), log=lambda m: None)
    table = (copy.dcfg.ngram_max, copy.dcfg.block_size - 1)
    np.testing.assert_array_equal(np.asarray(copy.params["copy_bias"]), np.full(table, 3.0, np.float32))
    rest = {k: v for k, v in copy.params.items() if k != "copy_bias"}
    for a, b in zip(jax.tree.leaves(rest), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    from dflash_jax.drafter_io import export_released

    with_table = export_released(copy.params, copy.dcfg, tmp_path / "with_table")
    with pytest.raises(ConfigError, match="its drafter has a copy-bias table; set drafter.copy_bias"):
        Trainer(tiny_config(ck, folder, tmp_path / "f", f"init_from={with_table}"), log=lambda m: None)
    with pytest.raises(ConfigError, match=r"its copy-bias table is \(4, 7\), this config's \(2, 7\).*to 4 or more"):
        extra2 = (*extra, "drafter.ngram_max=2")
        Trainer(tiny_config(ck, folder, tmp_path / "g", f"init_from={with_table}", *extra2), log=lambda m: None)
    # a longer ngram_max: the loaded rows kept, the longer matches' rows at the config's copy_bias
    learned = np.arange(28, dtype=np.float32).reshape(4, 7)
    learned_table = export_released(dict(copy.params, copy_bias=learned), copy.dcfg, tmp_path / "learned")
    # (and, as stage 9 did, a periodic block input: what fills the blocks is no parameter)
    extra3 = (
        "drafter.block_input=ngram",
        "drafter.copy_bias=30.0",
        "drafter.ngram_max=6",
        "drafter.ngram_periodic=True",
    )
    longer = Trainer(tiny_config(ck, folder, tmp_path / "h", f"init_from={learned_table}", *extra3), log=lambda m: None)
    assert longer.dcfg.ngram_periodic and longer.dcfg.ngram_max == 6
    np.testing.assert_array_equal(
        np.asarray(longer.params["copy_bias"]), np.concatenate([learned, np.full((2, 7), 30.0, np.float32)])
    )
    rest = {k: v for k, v in longer.params.items() if k != "copy_bias"}
    for a, b in zip(jax.tree.leaves(rest), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(
        ConfigError, match='drafter.copy_bias must be None or a number, with drafter.block_input="ngram"'
    ):
        tiny_config(ck, folder, tmp_path / "e", "drafter.copy_bias=3.0")
    with pytest.raises(
        ConfigError, match='ngram_periodic must be True or False, True only with drafter.block_input="ngram"'
    ):
        tiny_config(ck, folder, tmp_path / "e", "drafter.ngram_periodic=True")


def test_init_grow_adds_identity_layers_that_keep_the_drafters_predictions(trained, tiny, tmp_path):
    """init_grow: a 2-layer drafter grows to 3 (and, as a DFlash 2 run, to 4): its layers come first,
    each added layer has zero output projections and random other weights, and the grown drafter's
    block logits equal the loaded one's (scale-relative, SPEC). Without init_grow the layer count is
    a config difference; growing down is refused; the run id records the growth."""
    import jax

    from dflash_jax.drafter_io import load_drafter

    ck, folder = tiny
    start = trained[2] / "drafter"
    want, wcfg, _ = load_drafter(start)
    tokens, _ = data.TokenDataset(folder)[1]
    toks = jnp.asarray([tokens.tolist()[:48]])
    feats = target_forward(ck, toks, taps=wcfg.target_layer_ids)[2]
    anchors = loss.Anchors(jnp.asarray([[4, 17, 30]]), jnp.ones((1, 3), bool))

    def logits(params, dcfg):
        ctx = context_kv(params, feats, dcfg)
        return block_logits(params, ck.params, ctx, toks, anchors, tcfg=ck.cfg, cfg=dcfg)

    ref = logits(want, wcfg)
    n = wcfg.num_layers
    dflash2 = ("drafter.conv_kernel_size=2", "drafter.selector_rank=8", "drafter.selector_top_k=4")
    for extra, layers in (((), n + 1), (dflash2, n + 2)):
        args = (f"init_from={start}", "init_grow=True", f"drafter.num_layers={layers}", *extra)
        t = Trainer(tiny_config(ck, folder, tmp_path / f"g{layers}", *args), log=lambda m: None)
        assert t.dcfg.num_layers == layers and t.identity["init_grow"] is True
        for i in range(n):  # the loaded layers, unchanged (a DFlash 2 run adds its convolutions beside them)
            for key, loaded in want[f"layers_{i}"].items():
                for a, b in zip(jax.tree.leaves(t.params[f"layers_{i}"][key]), jax.tree.leaves(loaded)):
                    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        for i in range(n, layers):
            new = t.params[f"layers_{i}"]
            for branch, out in (("self_attn", "o_proj"), ("mlp", "down_proj")):
                assert not np.any(np.asarray(new[branch][out]))
            assert np.std(np.asarray(new["self_attn"]["q_proj"])) > 0  # the rest at random: gradients flow
        got = logits(t.params, t.dcfg)
        assert float(jnp.max(jnp.abs(got - ref)) / jnp.max(jnp.abs(ref))) < TINY_REL
    with pytest.raises(ConfigError, match="differs from this config's in .*num_hidden_layers"):
        Trainer(tiny_config(ck, folder, tmp_path / "x", f"init_from={start}", f"drafter.num_layers={n + 1}"))
    with pytest.raises(ConfigError, match=f"init_grow adds layers, but its drafter has {n}"):
        args = (f"init_from={start}", "init_grow=True", f"drafter.num_layers={n - 1}")
        Trainer(tiny_config(ck, folder, tmp_path / "y", *args), log=lambda m: None)
    with pytest.raises(ConfigError, match="init_grow=True needs init_from"):
        tiny_config(ck, folder, tmp_path / "z", "init_grow=True")


def small_block_problem(ck, seed: int):
    """A 1-layer block-8 drafter, 2 random sequences of 40 tokens (answers from position 6) and 8
    anchors each: inputs for direct ``loss.block_loss`` checks."""
    dcfg = DrafterConfig.for_target(ck.cfg, num_layers=1, block_size=8, mask_token_id=3)
    rs = np.random.RandomState(seed)
    tokens = jnp.asarray(rs.randint(4, ck.cfg.vocab_size, (2, 40)), jnp.int32)
    mask = jnp.asarray(np.arange(40) >= 6)[None].repeat(2, 0)
    return (
        dcfg,
        init_drafter_params(dcfg, seed=seed),
        tokens,
        mask,
        loss.sample_anchors(jax.random.PRNGKey(seed), mask, 8),
    )


def test_loss_offsets_supervise_only_the_first_offsets(tiny):
    """loss_offsets=K is the full objective with w_k = 0 past K (computed from the full logits)."""
    ck, _ = tiny
    dcfg, dparams, tokens, mask, anchors = small_block_problem(ck, seed=3)
    kw = dict(tcfg=ck.cfg, cfg=dcfg, gamma=4.0, anchor_chunk=4)
    full = block_loss(dparams, ck.params, tokens, mask, anchors, **kw)
    part = block_loss(dparams, ck.params, tokens, mask, anchors, loss_offsets=3, **kw)
    feats = target_forward(ck, tokens, taps=dcfg.target_layer_ids)[2]
    logits = block_logits(
        dparams, ck.params, context_kv(dparams, feats, dcfg), tokens, anchors, tcfg=ck.cfg, cfg=dcfg
    )  # offsets 1..7
    labels, use = loss.block_labels(tokens, mask, anchors, 8)
    ce = jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, labels[..., 1:, None], -1)[..., 0]
    w = loss.offset_weights(8, 4.0, 3)[1:]
    np.testing.assert_allclose(part.loss, jnp.sum(ce * use[..., 1:] * w), rtol=1e-5)
    np.testing.assert_allclose(part.weight, jnp.sum(use[..., 1:] * w), rtol=1e-6)
    np.testing.assert_array_equal(part.count[4:], 0)
    np.testing.assert_array_equal(part.count[:4], full.count[:4])
    np.testing.assert_array_equal(part.correct[:4], full.correct[:4])
    assert float(part.weight) < float(full.weight)


def test_remat_off_gives_the_same_loss_and_gradients(tiny):
    """train.remat only trades memory for time: without jax.checkpoint the loss, the metrics
    and the gradients are those of the recomputing version (float32 rounding apart)."""
    ck, _ = tiny
    dcfg, dparams, tokens, mask, anchors = small_block_problem(ck, seed=5)

    def run(remat):
        def f(p):
            s = block_loss(
                p,
                ck.params,
                tokens,
                mask,
                anchors,
                tcfg=ck.cfg,
                cfg=dcfg,
                gamma=4.0,
                anchor_chunk=4,
                loss_offsets=5,
                remat=remat,
            )
            return s.loss, s

        return jax.value_and_grad(f, has_aux=True)(dparams)

    def traced(remat):  # the option must reach the lowered program: one checkpoint region or none
        return str(
            jax.make_jaxpr(
                lambda p: block_loss(
                    p, ck.params, tokens, mask, anchors, tcfg=ck.cfg, cfg=dcfg, gamma=4.0, anchor_chunk=4, remat=remat
                )
            )(dparams)
        )

    assert "remat" in traced(True) and "remat" not in traced(False)  # jax.checkpoint lowers to remat
    (l1, s1), g1 = run(True)
    (l0, s0), g0 = run(False)
    np.testing.assert_allclose(l0, l1, rtol=1e-6)
    np.testing.assert_array_equal(s0.correct, s1.correct)
    leaves = jax.tree.leaves(g1)
    assert sum(float(jnp.abs(g).sum()) for g in leaves) > 0
    for a, b in zip(jax.tree.leaves(g0), leaves):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * float(jnp.abs(b).max()))  # summation order


def test_stored_features_train_like_the_target_forward(tiny, tmp_path):
    """``dflash-jax prepare-features`` + ``train.stored_features=True``: the stored rows are the
    target's features of each sequence, the run is the same run (same identity, same batches) and
    gives the same losses as computing the features in the step (float32 rounding apart), with
    gradient accumulation and validation; the store resumes and rejects bad files clearly."""
    ck, folder = tiny
    extra = ("train.steps=3", "eval.every=3", "train.grad_accum=2", "train.batch_size=8")
    with pytest.raises(data.DataError, match="prepare-features --config"):
        Trainer(tiny_config(ck, folder, tmp_path / "none", *extra, "train.stored_features=True"), log=lambda *a: None)
    cmd = [
        sys.executable,
        "-m",
        "dflash_jax.cli",
        "prepare-features",
        "--config",
        CONFIG,
        *tiny_overrides(ck, folder, tmp_path / "unused"),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    ds = data.TokenDataset(folder)
    feats_dir = data.features_folder(folder, ck.identity, (1, 2), "float32")
    store = data.FeatureStore(feats_dir, ds, 2 * ck.cfg.hidden_size)
    for i in (0, 77, len(ds) - 1):
        tok, _ = ds[i]
        want = target_forward(ck, np.asarray(tok)[None], taps=(1, 2))[2]
        assert_close(store[i], want[0], TINY_REL)

    base = Trainer(tiny_config(ck, folder, tmp_path / "a", *extra), log=lambda *a: None)
    stored = Trainer(tiny_config(ck, folder, tmp_path / "b", *extra, "train.stored_features=True"), log=lambda *a: None)
    assert stored.run_id == base.run_id  # speed against disk: the same run
    b0, b1 = base.global_batch(1), stored.global_batch(1)
    np.testing.assert_array_equal(b0["tokens"], b1["tokens"])
    assert "features" not in b0 and b1["features"].shape == (2, 4, 80, 2 * ck.cfg.hidden_size)
    base.run()
    stored.run()
    runs = [[json.loads(x) for x in (tmp_path / r / "metrics.jsonl").read_text().splitlines()] for r in "ab"]
    for r0, r1 in zip(*runs):
        for key in ("loss", "grad_norm", "val_loss"):
            if key in r0:
                np.testing.assert_allclose(r1[key], r0[key], rtol=2e-4)
    assert sum("val_loss" in r for r in runs[1]) == 1

    # resumable: a finished file is kept, a missing one is written again; bad files are named
    path = feats_dir / "data.npy"
    row77 = np.array(store[77])
    del store, stored  # drop their memory maps before the file is overwritten in place below
    stamp = path.stat().st_mtime_ns
    prepare.write_features(ds, ck, (1, 2), dtype="float32", progress=False)
    assert path.stat().st_mtime_ns == stamp
    np.save(path, np.zeros((3, 2 * ck.cfg.hidden_size), np.float32))
    with pytest.raises(data.DataError, match="data.npy is float32 .*delete it and rerun"):
        data.FeatureStore(feats_dir, ds, 2 * ck.cfg.hidden_size)
    path.unlink()
    with pytest.raises(data.DataError, match="missing: prepare-features has not finished"):
        data.FeatureStore(feats_dir, ds, 2 * ck.cfg.hidden_size)
    prepare.write_features(ds, ck, (1, 2), dtype="float32", progress=False)
    np.testing.assert_array_equal(data.FeatureStore(feats_dir, ds, 2 * ck.cfg.hidden_size)[77], row77)
    import fcntl

    with open(feats_dir / ".lock", "w") as held:  # a second writer is refused, not interleaved
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(data.DataError, match="another prepare-features is writing"):
            prepare.write_features(ds, ck, (1, 2), dtype="float32", progress=False)
    (feats_dir / "meta.json").write_text('{"format": "dflash-jax-fea')
    with pytest.raises(data.DataError, match="meta.json is damaged"):
        prepare.write_features(ds, ck, (1, 2), dtype="float32", progress=False)
    (feats_dir / "meta.json").write_text(json.dumps({"format": "dflash-jax-features"}))
    with pytest.raises(data.DataError, match="other settings"):
        prepare.write_features(ds, ck, (1, 2), dtype="float32", progress=False)


@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "configs").glob("[!_]*.py")))
def test_every_shipped_config_loads(name):
    """Every config in configs/ passes validation (mesh shapes with an expert axis included)."""
    c = load_config(str(ROOT / "configs" / f"{name}.py"), [])
    assert len(c.mesh) in (3, 4) and c.train.steps > 0


def test_the_copy_bias_table_has_its_own_learning_rate():
    """``train.copy_bias_lr``: Adam's first steps move each parameter by about its peak learning
    rate times the schedule, so the copy table moves copy_bias_lr / lr times as far as the rest
    (and the optimiser is the plain AdamW chain without it, as earlier runs' checkpoints hold)."""
    from dflash_jax.train_step import make_optimizer

    t = load_config(CONFIG, ["train.steps=100", "train.lr=1e-3"]).train
    params = {"copy_bias": jnp.zeros((2, 3)), "fc": jnp.zeros((4,))}
    grads = {"copy_bias": jnp.full((2, 3), 0.5), "fc": jnp.full((4,), -0.5)}
    plain = make_optimizer(t)
    assert len(plain.init(params)) == 2  # clip, AdamW
    t = dataclasses.replace(t, copy_bias_lr=0.1)  # a frozen TrainSettings: a checked copy
    opt = make_optimizer(t)
    state = opt.init(params)
    for _ in range(3):
        updates, state = opt.update(grads, state, params)
    ratio = float(jnp.abs(updates["copy_bias"]).mean() / jnp.abs(updates["fc"]).mean())
    assert abs(ratio - 100.0) < 1e-3 * 100, ratio
    assert float(updates["copy_bias"].max()) < 0 < float(updates["fc"].min())  # each against its gradient
    with pytest.raises(ConfigError, match="train.copy_bias_lr is the copy-bias table's learning rate"):
        load_config(CONFIG, ["train.copy_bias_lr=0.1"])


# --- DFlash 2 training (issue 21) -------------------------------------------------------------

DFLASH2 = dict(conv_kernel_size=2, conv_group_size=16, selector_rank=6, selector_top_k=4)


def dflash2_problem(ck, seed: int, top_k: int = 40):
    """``small_block_problem`` with a DFlash 2 drafter whose convolutions are away from the identity
    and whose selector is random at unit scale (top 40 of 96 tokens: the random gold token is
    missing about half the time)."""
    dcfg, _, tokens, mask, anchors = small_block_problem(ck, seed)
    dcfg = dataclasses.replace(dcfg, **dict(DFLASH2, selector_top_k=top_k))
    rs = np.random.RandomState(seed)

    def perturb(path, x):
        name = jax.tree_util.keystr(path)
        if "base_kernel" in name or "kernel_projection" in name:
            return x + 0.2 * rs.randn(*x.shape).astype(np.float32)
        if "codebook" in name or "hidden_projection" in name:
            return jnp.asarray(rs.randn(*x.shape), jnp.float32)
        return x

    params = jax.tree_util.tree_map_with_path(perturb, init_drafter_params(dcfg, seed=seed))
    return dcfg, params, tokens, mask, anchors


def test_dflash2_selector_loss_equals_its_definition(tiny):
    """The selector sums of ``block_loss`` equal SPEC "DFlash 2" (training) written out label by
    label in numpy: the k-way cross-entropy of ``unary(b) + <A(gold previous) * H(h), B(b)>`` over
    the head's top k, the gold token added when missing, weighted by w_k; selector accuracy and
    top-k coverage counted over the same labels. The block loss is the DFlash one, unchanged."""
    ck, _ = tiny
    dcfg, p, tokens, mask, anchors = dflash2_problem(ck, seed=7)
    s = block_loss(p, ck.params, tokens, mask, anchors, tcfg=ck.cfg, cfg=dcfg, gamma=4.0, anchor_chunk=4)
    feats = target_forward(ck, tokens, taps=dcfg.target_layer_ids)[2]
    ctx = context_kv(p, feats, dcfg)
    logits, hidden = block_logits(p, ck.params, ctx, tokens, anchors, tcfg=ck.cfg, cfg=dcfg, with_hidden=True)
    logits, hidden = np.asarray(logits, np.float64), np.asarray(hidden, np.float64)
    labels, use = map(np.asarray, loss.block_labels(tokens, mask, anchors, 8))
    w = np.asarray(loss.offset_weights(8, 4.0))
    A, B = np.asarray(p["predecessor_codebook"], np.float64), np.asarray(p["successor_codebook"], np.float64)
    H = np.asarray(p["hidden_projection"], np.float64)
    total, picked, covered, missing = 0.0, 0, 0, 0
    for b, a, j in zip(*np.nonzero(use)):
        row, gold, prev = logits[b, a, j - 1], labels[b, a, j], labels[b, a, j - 1]
        top = list(np.argsort(-row, kind="stable")[:40])
        cands = top if gold in top else top + [gold]
        missing += gold not in top
        scores = np.array([row[c] + np.dot(A[prev] * (hidden[b, a, j - 1] @ H), B[c]) for c in cands])
        total += w[j] * (np.log(np.exp(scores - scores.max()).sum()) + scores.max() - scores[cands.index(gold)])
        covered += gold in top
        picked += gold in top and top[int(np.argmax(scores[:40]))] == gold
    assert 0 < missing < use.sum() and picked > 0  # both kinds of label, and some right picks
    np.testing.assert_allclose(float(s.selector_loss), total, rtol=1e-5)
    assert float(s.covered) == covered and float(s.selector_correct) == picked
    d1 = block_loss(
        p, ck.params, tokens, mask, anchors, tcfg=ck.cfg, cfg=dataclasses.replace(dcfg, conv_kernel_size=0),
        gamma=4.0, anchor_chunk=4,
    )  # fmt: skip
    assert float(d1.selector_loss) == 0.0 and float(d1.covered) == 0.0


def test_dflash2_selector_kl_learns_the_targets_distribution_over_its_candidates(tiny):
    """``selector_objective="kl"``: per label, the forward KL from the target's next-token distribution
    over the head's top k (renormalised) to the selector's softmax over them (SPEC "Sampling": a
    sampled draft is accepted with chance sum min(p, q), at most the candidates' mass of p, reached
    by q proportional to p there), written out in numpy; zero when the selector's scores are the
    target's logits on the candidates; the block loss and the counts unchanged; the gradient reaches
    the selector; a DFlash drafter ignores the setting."""
    ck, _ = tiny
    dcfg, p, tokens, mask, anchors = dflash2_problem(ck, seed=7)
    kw = dict(tcfg=ck.cfg, cfg=dcfg, gamma=4.0, anchor_chunk=4)
    s = block_loss(p, ck.params, tokens, mask, anchors, selector_objective="kl", **kw)
    ce = block_loss(p, ck.params, tokens, mask, anchors, **kw)
    target_logits, _, feats, _ = target_forward(ck, tokens, taps=dcfg.target_layer_ids)
    target_logits = np.asarray(target_logits, np.float64)  # [b, T, V]
    ctx = context_kv(p, feats, dcfg)
    logits, hidden = block_logits(p, ck.params, ctx, tokens, anchors, tcfg=ck.cfg, cfg=dcfg, with_hidden=True)
    logits, hidden = np.asarray(logits, np.float64), np.asarray(hidden, np.float64)
    labels, use = map(np.asarray, loss.block_labels(tokens, mask, anchors, 8))
    w = np.asarray(loss.offset_weights(8, 4.0))
    A, B = np.asarray(p["predecessor_codebook"], np.float64), np.asarray(p["successor_codebook"], np.float64)
    H = np.asarray(p["hidden_projection"], np.float64)
    pos = np.asarray(anchors.positions)

    def log_softmax(x):
        return x - x.max() - np.log(np.exp(x - x.max()).sum())

    total = 0.0
    for b, a, j in zip(*np.nonzero(use)):
        row, prev = logits[b, a, j - 1], labels[b, a, j - 1]
        top = np.argsort(-row, kind="stable")[:40]
        scores = np.array([row[c] + np.dot(A[prev] * (hidden[b, a, j - 1] @ H), B[c]) for c in top])
        logp = log_softmax(target_logits[b, pos[b, a] + j - 1, top])  # the label at pos + j
        total += w[j] * np.sum(np.exp(logp) * (logp - log_softmax(scores)))
    np.testing.assert_allclose(float(s.selector_loss), total, rtol=1e-4)
    assert float(s.selector_loss) > 0
    for got, want in zip(s[:6], ce[:6]):  # block loss, weights, counts: the ce selector's
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert float(s.covered) == float(ce.covered) and float(s.selector_correct) == float(ce.selector_correct)

    # q = p on the candidates gives 0: with the predecessor codebook zeroed the selector's scores are
    # the unary logits, and the target's logits are those plus a constant
    unary = jnp.asarray(target_logits[0, :7], jnp.float32)  # [K = 7, V]
    zero = dict(p, predecessor_codebook=jnp.zeros_like(p["predecessor_codebook"]))
    sl, *_ = loss.selector_loss(
        zero, dcfg, jnp.asarray(hidden[0, 0]), unary, jnp.asarray(labels[0, 0, 1:]), jnp.asarray(labels[0, 0, :-1]),
        unary + 3.0,
    )  # fmt: skip
    np.testing.assert_allclose(np.asarray(sl), 0.0, atol=1e-5)
    masked = (unary + 3.0).at[:, int(jnp.argmax(unary[0]))].set(-jnp.inf)  # a candidate the target rules out
    sl, *_ = loss.selector_loss(
        zero, dcfg, jnp.asarray(hidden[0, 0]), unary, jnp.asarray(labels[0, 0, 1:]), jnp.asarray(labels[0, 0, :-1]),
        masked,
    )  # fmt: skip
    assert bool(jnp.all(jnp.isfinite(sl))) and float(sl.max()) > 0

    def selector_kl(q):
        return block_loss(q, ck.params, tokens, mask, anchors, selector_objective="kl", **kw).selector_loss

    grads = jax.grad(selector_kl)(p)
    for name in ("predecessor_codebook", "successor_codebook", "hidden_projection"):
        assert float(jnp.abs(grads[name]).max()) > 0
    d1cfg = dataclasses.replace(dcfg, conv_kernel_size=0)
    d1 = block_loss(p, ck.params, tokens, mask, anchors, selector_objective="kl", **dict(kw, cfg=d1cfg))
    assert float(d1.selector_loss) == 0.0


def test_dflash2_training_forward_equals_the_draft_step(tiny):
    """With convolutions away from the identity, the training forward's logits equal the draft
    step's (the convolutions see the same block positions in both)."""
    ck, folder = tiny
    dcfg, params, *_ = dflash2_problem(ck, seed=9)
    tokens, _ = data.TokenDataset(folder)[0]
    assert _consistency(ck, params, dcfg, tokens.tolist(), [3, 9, 10, 30]) < TINY_REL


def test_dflash2_objective_and_its_stop_gradient(tiny):
    """``train_step``'s update is the gradient of (block loss + alpha * selector loss) / weight; with
    ``selector_stop_grad`` the backbone gets the block loss's gradient alone and the selector the
    selector loss's (plain SGD, so the update is the gradient)."""
    import optax

    from dflash_jax.train_step import train_step

    ck, _ = tiny
    dcfg, p, tokens, mask, _ = dflash2_problem(ck, seed=8)
    batch = {"tokens": tokens[None], "loss_mask": mask[None]}
    rng = jax.random.PRNGKey(4)
    anchors = loss.sample_anchors(jax.random.split(rng, 1)[0], mask, 8)  # the step's own draw
    kw = dict(tcfg=ck.cfg, cfg=dcfg, gamma=4.0, anchor_chunk=4)

    @partial(jax.jit, static_argnames="stop_grad")  # one program per stop_grad, not every op run alone
    def grads(stop_grad, alpha_block, alpha_selector):
        def f(q):
            s = block_loss(q, ck.params, tokens, mask, anchors, selector_stop_grad=stop_grad, **kw)
            return (alpha_block * s.loss + alpha_selector * s.selector_loss) / s.weight

        return jax.grad(f)(p)

    def update(stop_grad):
        settings = loss.LossSettings(gamma=4.0, anchor_chunk=4, selector_stop_grad=stop_grad)
        new, _, m = train_step(
            p, optax.sgd(1.0).init(p), ck.params, batch, rng, tcfg=ck.cfg, dcfg=dcfg, opt=optax.sgd(1.0),
            num_anchors=8, loss=settings, selector_alpha=0.5,
        )  # fmt: skip
        assert float(m["selector_acc"]) <= float(m["topk_coverage"]) and 0 < float(m["topk_coverage"]) < 1
        assert float(m["selector_loss"]) > 0
        return jax.tree.map(lambda a, b: a - b, p, new)

    selector = ("predecessor_codebook", "successor_codebook", "hidden_projection")
    for stop_grad in (False, True):
        got = update(stop_grad)
        want = grads(stop_grad, 1.0, 0.5)
        for g, u in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
            assert_close(np.asarray(u), np.asarray(g), 1e-4)
    block_only, selector_only = grads(False, 1.0, 0.0), grads(True, 0.0, 0.5)
    stopped, joint = grads(True, 1.0, 0.5), grads(False, 1.0, 0.5)
    for k in p:
        if k in selector:
            assert_close(np.asarray(stopped[k]), np.asarray(selector_only[k]), 1e-5)
            assert float(jnp.abs(stopped[k]).max()) > 0
        else:
            for a, b in zip(jax.tree.leaves(stopped[k]), jax.tree.leaves(block_only[k])):
                assert_close(np.asarray(a), np.asarray(b), 1e-5)
    fc = np.asarray(joint["fc"] - block_only["fc"])
    assert np.abs(fc).max() > 1e-3 * np.abs(np.asarray(block_only["fc"])).max()  # without the stop, it reaches fc


def test_dflash2_trains_from_a_dflash_drafter_and_exports_a_reference_folder(trained, tiny, tmp_path):
    """A DFlash 2 run continues a trained DFlash drafter (``init_from``: its backbone; convolutions
    from the identity, a fresh selector): at step 0 its block loss is the DFlash drafter's; training
    lowers the selector loss; it logs the selector metrics and resumes; experiments/study_tau.py's rounds
    (the selector's walk) are the decoder's; its exported folder loads in the reference's
    DFlash2DraftModel."""
    import torch
    from dflash.model import DFlash2DraftModel

    ck, folder = tiny
    trainer = trained[3]
    src = trainer.export("for_dflash2")
    d2 = [f"drafter.{k}={v}" for k, v in DFLASH2.items()]
    common = [f"init_from={src}", "train.steps=60", "eval.every=30", "ckpt.every=30", "train.lr=3e-3", *d2]
    run = Trainer(tiny_config(ck, folder, tmp_path / "d2", *common), log=lambda *_: None)
    assert run.dcfg.dflash2 and run.dcfg.selector_top_k == 4
    first = run.validate()
    base = Trainer(
        tiny_config(ck, folder, tmp_path / "d1", f"init_from={src}", "train.steps=60"), log=lambda *_: None
    ).validate()
    np.testing.assert_allclose(first["val_loss"], base["val_loss"], rtol=1e-5)  # identity convolutions
    run.run(stop_after=30)
    again = Trainer(tiny_config(ck, folder, tmp_path / "d2", *common), log=lambda *_: None)
    assert again.step == 30  # resumed
    last = again.run()
    rows = [json.loads(line) for line in open(tmp_path / "d2" / "metrics.jsonl")]
    assert {"selector_loss", "selector_acc", "topk_coverage"} <= rows[0].keys()
    assert last["val_selector_loss"] < 0.97 * float(first["val_selector_loss"])
    assert 0 < last["val_selector_acc"] <= last["val_topk_coverage"] <= 1
    sys.path.insert(0, str(ROOT / "experiments"))
    from study_tau import drafter_rounds

    dec = Decoder(ck.params, ck.cfg, make_plan(DraftStep(again.dcfg, ck.cfg), again.params))
    for j in again.val_idx[:2]:  # experiments/study_tau.py walks the selector as the decoder does
        full = np.asarray(data.TokenDataset(folder)[int(j)][0]).tolist()
        first = int(np.argmax(np.asarray(data.TokenDataset(folder)[int(j)][1])))
        got = dec.generate([full[:first]], len(full) - first)[0]
        assert got.token_ids[: len(full) - first] == full[first:]
        assert drafter_rounds(ck, again.params, again.dcfg, full, first) == got.acceptance_lengths
    from dflash_jax.drafter_io import export_released

    export_released(again.params, again.dcfg, tmp_path / "rel")
    config = json.loads((tmp_path / "rel" / "config.json").read_text())
    assert config["architectures"] == ["DFlash2DraftModel"]
    DFlash2DraftModel.from_pretrained(tmp_path / "rel", dtype=torch.float32)
    with pytest.raises(ConfigError, match="selector_rank is DFlash 2's"):
        tiny_config(ck, folder, tmp_path / "e", "drafter.selector_rank=4")
    with pytest.raises(ConfigError, match="needs drafter.selector_rank >= 1"):
        tiny_config(ck, folder, tmp_path / "e", "drafter.conv_kernel_size=2")


@pytest.mark.parametrize("objective", ["kl", "kl_tv"])
def test_distribution_objectives_read_the_targets_next_token_distribution(tiny, objective):
    """``train.objective`` kl / kl_tv: each supervised offset's loss is the distance from the target's
    distribution one position before its label (its full forward's logits there), computed here in
    numpy from the drafter's logits: KL(p || q), and (1 - a) KL + a TV; the metrics are the CE
    objective's; the gradient is finite and reaches the drafter."""
    ck, _ = tiny
    dcfg, dparams, tokens, mask, anchors = small_block_problem(ck, seed=4)
    kw = dict(tcfg=ck.cfg, cfg=dcfg, gamma=4.0, anchor_chunk=4)
    s = block_loss(dparams, ck.params, tokens, mask, anchors, objective=objective, tv_weight=0.3, **kw)
    ce = block_loss(dparams, ck.params, tokens, mask, anchors, **kw)
    target_logits, _, feats, _ = target_forward(ck, tokens, taps=dcfg.target_layer_ids)
    target_logits = np.asarray(target_logits, np.float64)  # [b, T, V]
    q_logits = np.asarray(
        block_logits(dparams, ck.params, context_kv(dparams, feats, dcfg), tokens, anchors, tcfg=ck.cfg, cfg=dcfg),
        np.float64,
    )  # [b, A, 7, V], offsets 1..7
    _, use = loss.block_labels(tokens, mask, anchors, 8)
    w = np.asarray(loss.offset_weights(8, 4.0))
    pos = np.asarray(anchors.positions)

    def softmax(x):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    want = 0.0
    for b, a, j in zip(*np.nonzero(np.asarray(use)[..., 1:])):
        p, q = softmax(target_logits[b, pos[b, a] + j]), softmax(q_logits[b, a, j])  # label at pos + j + 1
        kl, tv = np.sum(p * (np.log(p) - np.log(q))), 0.5 * np.abs(p - q).sum()
        want += w[j + 1] * (kl if objective == "kl" else 0.7 * kl + 0.3 * tv)
    np.testing.assert_allclose(float(s.loss), want, rtol=2e-4)
    np.testing.assert_array_equal(s.correct, ce.correct)  # accuracies are about the answer's tokens
    grads = jax.grad(lambda p: block_loss(p, ck.params, tokens, mask, anchors, objective=objective, **kw).loss)(dparams)
    norms = [float(jnp.linalg.norm(g)) for g in jax.tree.leaves(grads)]
    assert all(np.isfinite(norms)) and max(norms) > 0


def test_objective_settings_are_checked_and_keep_old_run_ids(tiny, tmp_path):
    """An unknown objective, a tv_weight outside [0, 1] and a KL objective with stored features are
    config errors naming the fix; the default objective leaves a run's id as it was."""
    ck, folder = tiny
    with pytest.raises(ConfigError, match="train.objective must be one of ce, kl, kl_tv"):
        tiny_config(ck, folder, tmp_path / "a", "train.objective=mse")
    with pytest.raises(ConfigError, match=r"train.tv_weight must be in \[0, 1\]"):
        tiny_config(ck, folder, tmp_path / "a", "train.objective=kl_tv", "train.tv_weight=1.5")
    with pytest.raises(ConfigError, match="train.position_weights must be one of decay, reach"):
        tiny_config(ck, folder, tmp_path / "a", "train.position_weights=flat")
    with pytest.raises(ConfigError, match="set train.stored_features=False"):
        tiny_config(ck, folder, tmp_path / "a", "train.objective=kl", "train.stored_features=True")
    with pytest.raises(ConfigError, match="train.selector_objective must be one of ce, kl"):
        tiny_config(ck, folder, tmp_path / "a", "train.selector_objective=tv")
    with pytest.raises(ConfigError, match="selector_objective 'kl' .* set train.stored_features=False"):
        tiny_config(
            ck, folder, tmp_path / "a", "train.selector_objective=kl", "train.stored_features=True",
            "drafter.conv_kernel_size=2", "drafter.selector_rank=4",
        )  # fmt: skip
    tiny_config(ck, folder, tmp_path / "a", "train.selector_objective=kl", "train.stored_features=True")  # unused
    from dflash_jax.train_config import NEWER_TRAIN_FIELDS

    assert NEWER_TRAIN_FIELDS["objective"] == "ce" and NEWER_TRAIN_FIELDS["tv_weight"] == 0.5
    base = Trainer(tiny_config(ck, folder, tmp_path / "b"), log=lambda m: None)
    extra = ("train.objective=kl_tv", "train.position_weights=reach")
    kl = Trainer(tiny_config(ck, folder, tmp_path / "c", *extra), log=lambda m: None)
    assert "objective" not in base.identity["train"] and kl.identity["train"]["objective"] == "kl_tv"
    assert base.run_id != kl.run_id
    first = kl.run(stop_after=1)  # through the sharded step
    last = kl.run(stop_after=3)
    assert np.isfinite(first["loss"]) and np.isfinite(last["loss"]) and last["step"] == 4


def test_reach_position_weights_count_an_offset_by_the_chance_of_reaching_it(tiny):
    """``train.position_weights=reach``: offset k's cross-entropy is weighted by the decay times the
    drafter's probabilities of the answer's tokens at offsets 1..k-1 (numpy statement), and the
    returned weight is the same weighted count."""
    ck, _ = tiny
    dcfg, dparams, tokens, mask, anchors = small_block_problem(ck, seed=6)
    kw = dict(tcfg=ck.cfg, cfg=dcfg, gamma=4.0, anchor_chunk=4)
    s = block_loss(dparams, ck.params, tokens, mask, anchors, position_weights="reach", **kw)
    feats = target_forward(ck, tokens, taps=dcfg.target_layer_ids)[2]
    ctx = context_kv(dparams, feats, dcfg)
    logits = np.asarray(block_logits(dparams, ck.params, ctx, tokens, anchors, tcfg=ck.cfg, cfg=dcfg), np.float64)
    labels, use = (np.asarray(x) for x in loss.block_labels(tokens, mask, anchors, 8))
    w = np.asarray(loss.offset_weights(8, 4.0))
    logq = (
        logits
        - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
        - logits.max(-1, keepdims=True)
    )
    want_loss = want_weight = 0.0
    for b, a in zip(*np.nonzero(use[..., 1:].any(-1))):
        reach = 1.0
        for j in range(7):  # offset j + 1, label labels[b, a, j + 1]
            lq = logq[b, a, j, labels[b, a, j + 1]]
            if use[b, a, j + 1]:
                want_loss += w[j + 1] * reach * -lq
                want_weight += w[j + 1] * reach
            reach *= np.exp(lq)
    np.testing.assert_allclose([float(s.loss), float(s.weight)], [want_loss, want_weight], rtol=2e-4)
    decay = block_loss(dparams, ck.params, tokens, mask, anchors, **kw)
    assert float(s.weight) < float(decay.weight)
