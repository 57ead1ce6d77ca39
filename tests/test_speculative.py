"""Speculative decoding with a drafter is lossless and matches the reference loop."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dflash_jax import checkpoint
from dflash_jax.decode import Decoder
from dflash_jax.drafter import DrafterConfig, DraftStep, init_drafter_params
from dflash_jax.drafter_io import export_released
from dflash_jax.speculation import make_plan


@pytest.fixture(scope="session")
def setup(tiny_models):
    hf, _, path = tiny_models["qwen3"]
    ck = checkpoint.load_target(path)
    dcfg = DrafterConfig.for_target(
        ck.cfg,
        num_layers=2,
        block_size=8,
        mask_token_id=3,
        layer_types=("full_attention", "sliding_attention"),
        sliding_window=6,
    )
    dparams = init_drafter_params(dcfg, seed=0)
    plain = Decoder(ck.params, ck.cfg)
    return hf, ck, dcfg, dparams, plain, {}


def _spec(setup, bs):
    _, ck, dcfg, dparams, _, decoders = setup
    if bs not in decoders:
        decoders[bs] = Decoder(ck.params, ck.cfg, make_plan(DraftStep(dcfg, ck.cfg), dparams, block_size=bs))
    return decoders[bs]


@settings(max_examples=8, deadline=None)
@given(
    lens=st.lists(st.integers(1, 40), min_size=1, max_size=3),
    bs=st.sampled_from([2, 5, 8]),
    n_new=st.integers(1, 30),
    seed=st.integers(0, 1000),
)
def test_speculative_equals_plain(setup, lens, bs, n_new, seed):
    plain = setup[4]
    rs = np.random.RandomState(seed)
    prompts = [rs.randint(4, 96, n).tolist() for n in lens]
    want = plain.generate(prompts, n_new)
    got = _spec(setup, bs).generate(prompts, n_new)
    for w, g in zip(want, got):
        assert g.token_ids == w.token_ids
        assert sum(g.acceptance_lengths) == len(g.token_ids) - 1  # every token but the first comes from a round
        assert all(1 <= a <= bs for a in g.acceptance_lengths)


def test_acceptance_lengths_equal_reference(setup, tmp_path, monkeypatch):
    import time

    import dflash.model
    from dflash.model import DFlashDraftModel, dflash_generate

    # The reference times itself with torch.cuda.synchronize; on CPU use a plain clock so that
    # return_stats=True (which carries the per-round acceptance lengths) works.
    monkeypatch.setattr(dflash.model, "_cuda_time", time.perf_counter)

    hf, ck, dcfg, dparams, _, _ = setup
    export_released(dparams, dcfg, tmp_path / "drafter")
    ref = DFlashDraftModel.from_pretrained(tmp_path / "drafter", dtype=torch.float32).eval()
    rs = np.random.RandomState(5)
    dec = _spec(setup, 8)
    for n in (4, 13, 30):
        prompt = rs.randint(4, 96, n).tolist()
        ours = dec.generate([prompt], 25)[0]
        out = dflash_generate(
            ref, hf, torch.tensor([prompt]), max_new_tokens=25, stop_token_ids=None, return_stats=True
        )
        assert ours.token_ids == out.output_ids[0, n:].tolist()
        assert ours.acceptance_lengths == out.acceptance_lengths


def test_drafter_that_does_not_fit_is_a_clear_error(setup, tmp_path):
    import dataclasses

    from dflash_jax.drafter import check_fits
    from dflash_jax.errors import ConfigError

    _, ck, dcfg, _, _, _ = setup
    with pytest.raises(ConfigError, match="hidden_size"):
        check_fits(dataclasses.replace(dcfg, hidden_size=32), ck.cfg)
    with pytest.raises(ConfigError, match="vocab_size"):
        check_fits(dataclasses.replace(dcfg, vocab_size=97), ck.cfg)
    with pytest.raises(ConfigError, match="4-layer target"):
        check_fits(
            dataclasses.replace(dcfg, num_target_layers=4, target_layer_ids=(1,)),
            ck.cfg.__class__(**{**dataclasses.asdict(ck.cfg), "num_layers": 5}),
        )
    with pytest.raises(ConfigError, match="another target"):
        check_fits(dcfg, ck.cfg, {"config_sha256": "x"}, ck.identity)
    with pytest.raises(ConfigError, match="target_layer_ids"):
        dataclasses.replace(dcfg, target_layer_ids=(0, 4))
    with pytest.raises(ValueError, match="block size 9"):
        Decoder(ck.params, ck.cfg, make_plan(DraftStep(dcfg, ck.cfg), setup[3], block_size=9))


def test_generate_cli_with_released_drafter(setup, tmp_path, capsys):
    import json

    from dflash_jax.cli import main

    _, ck, dcfg, dparams, _, _ = setup
    export_released(dparams, dcfg, tmp_path / "d", target_identity=ck.identity)
    main(
        [
            "generate",
            "--target",
            str(ck.path),
            "--drafter",
            str(tmp_path / "d"),
            "--prompt",
            "t10 t11",
            "--max-new-tokens",
            "9",
            "--block-size",
            "4",
            "--json",
        ]
    )
    rec = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rec["num_output_tokens"] == 9 and sum(rec["acceptance_lengths"]) == 8
    assert rec["tau"] == pytest.approx(np.mean(rec["acceptance_lengths"]))


def test_jax_modules_never_import_torch(tiny_models):
    import subprocess
    import sys

    _, _, path = tiny_models["qwen3"]
    code = (
        "import sys; from dflash_jax import checkpoint, decode, drafter, target, sharding\n"
        f"ck = checkpoint.load_target({str(path)!r})\n"
        "print(decode.Decoder(ck.params, ck.cfg).generate([[5, 6]], 3)[0].token_ids)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]


# --- multi-token acceptance with an oracle drafter -------------------------------------------


def _errors_for(prompt_len, lengths, bs):
    """Error positions that make the rounds commit exactly ``lengths`` tokens (each in 1..bs)."""
    errors, start = set(), prompt_len
    for k in lengths:
        if k < bs:
            errors.add(start + k)  # draft offset k is wrong: offsets 1..k-1 accepted, plus the bonus
        start += k
    return errors


@pytest.mark.parametrize("bs", [4, 8])
def test_oracle_drafter_gives_chosen_acceptance_lengths(setup, bs):
    from helpers import OracleDraft, expected_rounds, oracle_params

    _, ck, _, _, plain, _ = setup
    rs = np.random.RandomState(bs)
    prompts = [rs.randint(4, 96, n).tolist() for n in (5, 19, 11)]
    wanted = [
        [bs] + list(range(1, bs + 1)) + [bs, 2],  # every length 1..B
        list(range(bs, 0, -1)) + [1, 1],
        [1] * 3 + [bs] * 3,
    ]
    n_new = [1 + sum(w) for w in wanted]
    greedy = [r.token_ids for r in plain.generate(prompts, max(n_new))]
    errors = [_errors_for(len(p), w, bs) for p, w in zip(prompts, wanted)]
    for p, g, e, w, n in zip(prompts, greedy, errors, wanted, n_new):
        assert expected_rounds(len(p), g, e, bs, n) == w  # the test's own construction is consistent
    dec = Decoder(ck.params, ck.cfg, make_plan(OracleDraft(96, bs), oracle_params(prompts, greedy, errors)))
    assert dec.block_size == bs
    # One batch, each row with its own budget: decode with the largest and compare prefixes row by row.
    for i, (p, g, w, n) in enumerate(zip(prompts, greedy, wanted, n_new)):
        alone = Decoder(ck.params, ck.cfg, make_plan(OracleDraft(96, bs), oracle_params([p], [g], [errors[i]])))
        r = alone.generate([p], n)[0]
        assert r.acceptance_lengths == w
        assert r.token_ids == g[:n]
    batch = dec.generate(prompts, max(n_new))
    for p, g, e, r in zip(prompts, greedy, errors, batch):
        assert r.acceptance_lengths == expected_rounds(len(p), g, e, bs, max(n_new))
        assert r.token_ids == g
        assert max(r.acceptance_lengths) == bs or r is batch[1]


def test_reference_loop_with_oracle_drafter_stop_and_limit_mid_block(setup, monkeypatch):
    """The same oracle plugged into ``dflash.model.dflash_generate``: identical rounds, with a
    stop token and the length limit landing inside accepted blocks."""
    import time

    import dflash.model
    from dflash.model import DFlashDraftModel, dflash_generate
    from helpers import OracleDraft, expected_rounds, oracle_params

    monkeypatch.setattr(dflash.model, "_cuda_time", time.perf_counter)
    hf, ck, dcfg, dparams, plain, _ = setup
    bs = 8
    ref = DFlashDraftModel(DFlashDraftModel.config_class(**_ref_config(dcfg))).eval()
    rs = np.random.RandomState(11)
    checked = {"stop": 0, "limit": 0}
    state, forward = {}, ref.forward

    def recording_forward(*args, noise_embedding, position_ids, **kw):
        state["positions"] = position_ids[0, -noise_embedding.shape[1] + 1 :].tolist()
        return forward(*args, noise_embedding=noise_embedding, position_ids=position_ids, **kw)

    def oracle_logits(hidden, head):
        seq, errs = state["seq"], state["errs"]
        tok = [(seq[q] + 1) % 96 if q in errs else seq[q] for q in state["positions"]]
        return torch.nn.functional.one_hot(torch.tensor([tok]), 96).float()

    monkeypatch.setattr(ref, "forward", recording_forward)
    monkeypatch.setattr(ref, "compute_logits", oracle_logits)
    for case in range(8):
        p = rs.randint(4, 96, int(rs.randint(3, 30))).tolist()
        g = plain.generate([p], 60)[0].token_ids
        errs = {len(p) + i for i in range(1, 60) if rs.rand() < 0.2}
        free = expected_rounds(len(p), g, errs, bs, 60)
        ends = np.cumsum([0] + free)  # round r commits greedy[ends[r] + 1 .. ends[r + 1]]
        long_rounds = [r for r, k in enumerate(free) if k >= 3]
        if case % 2:  # a stop token first emitted inside a round of several tokens
            cand = [i for i in range(1, 59) if g.index(g[i]) == i and i not in ends]
            if not cand:
                continue
            stop, n_new = [g[cand[-1]]], 60
        else:  # the length limit inside a round of several tokens
            r = long_rounds[len(long_rounds) // 2]
            stop, n_new = [], int(ends[r]) + 1 + free[r] // 2
        want = expected_rounds(len(p), g, errs, bs, n_new, stop)
        dec = Decoder(ck.params, ck.cfg, make_plan(OracleDraft(96, bs), oracle_params([p], [g], [errs])))
        ours = dec.generate([p], n_new, stop_token_ids=stop)[0]
        state.update(seq=p + g, errs=errs)
        out = dflash_generate(
            ref,
            hf,
            torch.tensor([p]),
            max_new_tokens=n_new,
            stop_token_ids=stop or None,
            block_size=bs,
            return_stats=True,
        )
        assert out.acceptance_lengths == want
        assert ours.acceptance_lengths == want
        assert ours.token_ids == out.output_ids[0, len(p) :].tolist()
        assert want[-1] < free[len(want) - 1]  # the last round was cut short...
        if stop:  # ...by the stop token
            assert ours.token_ids[-1] == stop[0] and stop[0] not in ours.token_ids[:-1]
            checked["stop"] += 1
        else:  # ...by the length limit
            assert len(ours.token_ids) == n_new
            checked["limit"] += 1
    assert checked["stop"] >= 2 and checked["limit"] == 4, checked


def _ref_config(dcfg):
    import json
    import tempfile
    from pathlib import Path

    from dflash_jax.drafter import init_drafter_params
    from dflash_jax.drafter_io import export_released

    with tempfile.TemporaryDirectory() as d:
        export_released(init_drafter_params(dcfg, seed=0), dcfg, Path(d) / "x")
        return json.loads((Path(d) / "x" / "config.json").read_text())


def test_speculative_batch_equals_each_prompt_alone(setup):
    dec = _spec(setup, 8)
    rs = np.random.RandomState(3)
    prompts = [rs.randint(4, 96, n).tolist() for n in (2, 33, 9)]
    batch = dec.generate(prompts, 20, stop_token_ids=[7])
    for p, r in zip(prompts, batch):
        alone = dec.generate([p], 20, stop_token_ids=[7])[0]
        assert (alone.token_ids, alone.acceptance_lengths) == (r.token_ids, r.acceptance_lengths)


def test_drafter_checkpoint_round_trip_through_the_cli(setup, tmp_path, capsys):
    """released -> import-drafter (orbax, fit checked) -> export-drafter -> released: same tensors,
    same decode; a drafter for another target, or a target passed as drafter, is a clear error."""
    import json

    from safetensors.numpy import load_file

    from dflash_jax.cli import main

    _, ck, dcfg, dparams, _, _ = setup
    export_released(dparams, dcfg, tmp_path / "rel")
    main(
        [
            "import-drafter",
            "--drafter",
            str(tmp_path / "rel"),
            "--out",
            str(tmp_path / "ours"),
            "--target",
            str(ck.path),
        ]
    )
    meta = json.loads((tmp_path / "ours" / "dflash_jax.json").read_text())
    assert meta["format"] == "dflash-jax-drafter" and meta["target_identity"] == ck.identity
    main(["export-drafter", "--drafter", str(tmp_path / "ours"), "--out", str(tmp_path / "back"), "--dtype", "float32"])
    a, b = (
        load_file(str(tmp_path / "rel" / "model.safetensors")),
        load_file(str(tmp_path / "back" / "model.safetensors")),
    )
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)

    outs = []
    for d in ("rel", "ours", "back"):
        main(
            [
                "generate",
                "--target",
                str(ck.path),
                "--drafter",
                str(tmp_path / d),
                "--prompt",
                "t10 t11 t12",
                "--max-new-tokens",
                "12",
                "--verify-lengths",
                "full",  # the rounds of the drafter itself (auto's choice follows this run's timings)
                "--json",
            ]
        )
        rec = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        outs.append((rec["token_ids"], rec["acceptance_lengths"]))
    assert outs[0] == outs[1] == outs[2]

    cfg = json.loads((tmp_path / "ours" / "config.json").read_text())
    cfg["dflash_config"]["target_identity"] = {"config_sha256": "0" * 64}
    (tmp_path / "ours" / "config.json").write_text(json.dumps(cfg))
    meta["target_identity"] = {"config_sha256": "0" * 64}
    (tmp_path / "ours" / "dflash_jax.json").write_text(json.dumps(meta))
    for drafter, msg in (
        (tmp_path / "ours", "another target"),
        (ck.path, "target checkpoint"),
        (tmp_path / "nope", "does not exist"),
    ):
        with pytest.raises(SystemExit) as e:
            main(["generate", "--target", str(ck.path), "--drafter", str(drafter), "--prompt", "t10"])
        assert msg in str(e.value)
    with pytest.raises(SystemExit, match="already in the released format"):
        main(["export-drafter", "--drafter", str(tmp_path / "rel"), "--out", str(tmp_path / "x")])
    with pytest.raises(SystemExit, match="exists"):
        main(["import-drafter", "--drafter", str(tmp_path / "rel"), "--out", str(tmp_path / "back")])
    with pytest.raises(SystemExit, match="already a dflash-jax drafter"):
        main(["import-drafter", "--drafter", str(tmp_path / "ours"), "--out", str(tmp_path / "y")])
    assert oct((tmp_path / "back").stat().st_mode & 0o777) != oct(0o700)  # an ordinary folder, not mkdtemp's


def test_dflash2_greedy_equals_plain_and_the_reference_loop(setup, tmp_path, monkeypatch):
    """A DFlash 2 drafter in the compiled loop: greedy output equals plain decoding (batch 3) and,
    per prompt, the rounds equal ``dflash_generate``'s with ``DFlash2DraftModel`` on the same
    files. So that drafts are accepted, the selector is built to walk the
    target's own bigrams: every token is a candidate, the block's final hidden states are nearly
    one vector (sublayer outputs scaled down; the convolutions and attention still perturb them)
    that the hidden projection maps to about all ones, and the codebooks score ``b`` after ``a``
    by 30 when ``b`` most often followed ``a`` in the plain outputs."""
    import dataclasses
    import time
    from collections import Counter

    import dflash.model
    import jax
    from dflash.model import DFlash2DraftModel, dflash_generate

    from dflash_jax.drafter import Drafter, block_embeddings

    monkeypatch.setattr(dflash.model, "_cuda_time", time.perf_counter)
    hf, ck, dcfg, _, plain, _ = setup
    v = ck.cfg.vocab_size
    cfg = dataclasses.replace(dcfg, conv_kernel_size=2, conv_group_size=16, selector_rank=v, selector_top_k=v)
    rs = np.random.RandomState(7)
    prompts = [rs.randint(4, 96, n).tolist() for n in (4, 13, 30)]
    want = plain.generate(prompts, 25)
    follow = {}
    for p, w in zip(prompts, want):
        seq = p + w.token_ids
        for a, b in zip(seq, seq[1:]):
            follow.setdefault(a, Counter())[b] += 1

    def weights(path, x):
        name = jax.tree_util.keystr(path)
        x = np.asarray(x) + (0.3 if "conv" in name else 0.05) * rs.randn(*x.shape).astype(np.float32)
        return x * 0.01 if ("o_proj" in name or "down_proj" in name) else x

    params = jax.tree_util.tree_map_with_path(weights, init_drafter_params(cfg, seed=4))
    mask_emb = np.asarray(block_embeddings(np.array([[cfg.mask_token_id]]), ck.params, ck.cfg, cfg))[0, 0]
    h = np.asarray(Drafter(cfg).apply({"params": params}, mask_emb[None], method=lambda m, x: m.norm(x)))[0]
    successor = np.zeros((v, v), np.float32)
    for a, counts in follow.items():
        successor[counts.most_common(1)[0][0], a] = 30.0
    params.update(
        predecessor_codebook=np.eye(v, dtype=np.float32),
        successor_codebook=successor,
        hidden_projection=np.outer(h, np.ones(v, np.float32)) / float(h @ h),
    )
    export_released(params, cfg, tmp_path / "drafter")
    ref = DFlash2DraftModel.from_pretrained(tmp_path / "drafter", dtype=torch.float32).eval()
    dec = Decoder(ck.params, ck.cfg, make_plan(DraftStep(cfg, ck.cfg), params))
    got = dec.generate(prompts, 25)
    for w, g, prompt in zip(want, got, prompts):
        assert g.token_ids == w.token_ids
        out = dflash_generate(
            ref, hf, torch.tensor([prompt]), max_new_tokens=25, stop_token_ids=None, return_stats=True
        )
        assert g.token_ids == out.output_ids[0, len(prompt) :].tolist()
        assert g.acceptance_lengths == out.acceptance_lengths
    assert sum(a > 1 for g in got for a in g.acceptance_lengths) >= 5, [g.acceptance_lengths for g in got]
