"""The jit-compiled decoding loop (block size 1) equals transformers' greedy generate."""

import json

import jax
import numpy as np
import pytest
import torch

from dflash_jax import checkpoint
from dflash_jax.decode import Decoder, bucket


def _hf_greedy(model, prompt, n, eos=None):
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=eos, pad_token_id=0)
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="session")
def qwen3(tiny_models):
    hf, _, path = tiny_models["qwen3"]
    ck = checkpoint.load_target(path)
    return hf, Decoder(ck.params, ck.cfg)


def test_batch_equals_transformers_and_single(qwen3):
    hf, dec = qwen3
    rs = np.random.RandomState(0)
    prompts = [rs.randint(4, 96, n).tolist() for n in (3, 30, 11, 17, 1)]
    batch = dec.generate(prompts, 24)
    for p, r in zip(prompts, batch):
        assert r.token_ids == _hf_greedy(hf, p, 24)
        assert r.acceptance_lengths == [1] * 23  # the first token comes from prefill
        assert dec.generate([p], 24)[0].token_ids == r.token_ids


def test_decoders_of_equal_settings_share_their_compilation(qwen3, tiny_models):
    """A second Decoder for the same target and plan compiles nothing (``decode._EXECUTABLES``) and
    decodes the same tokens; one with other parameters of the same shapes reuses the compilation but
    decodes with its own values; another plan compiles its own."""
    from dflash_jax.ngram import NgramStep
    from dflash_jax.speculation import make_plan

    _, dec = qwen3
    ck = checkpoint.load_target(tiny_models["qwen3"][2])
    prompt = [5, 6, 7, 5, 6, 7, 5]
    first = dec.generate([prompt], 12)[0]
    again = Decoder(ck.params, ck.cfg).generate([prompt], 12)[0]
    assert again.compile_s == 0.0 and again.token_ids == first.token_ids
    zeros = jax.tree.map(np.zeros_like, ck.params)
    other = Decoder(zeros, ck.cfg).generate([prompt], 12)[0]
    assert other.compile_s == 0.0 and other.token_ids == [0] * 12  # all logits equal: argmax picks token 0
    lookup = Decoder(ck.params, ck.cfg, make_plan(NgramStep(block_size=4))).generate([prompt], 12)[0]
    assert lookup.compile_s > 0.0 and lookup.token_ids == first.token_ids


def test_hybrid_target_batch_equals_transformers(tiny_models):
    """Qwen3.5 (Gated DeltaNet layers): batched greedy decoding of prompts of different lengths (right
    padding in one prefill) equals transformers' generate for each prompt alone."""
    hf, _, path = tiny_models["qwen3_5"]
    ck = checkpoint.load_target(path)
    rs = np.random.RandomState(1)
    prompts = [rs.randint(4, 96, n).tolist() for n in (3, 30, 11)]
    for p, r in zip(prompts, Decoder(ck.params, ck.cfg).generate(prompts, 16)):
        assert r.token_ids == _hf_greedy(hf, p, 16)


def test_stop_tokens_stop_each_sequence_on_its_own(qwen3):
    hf, dec = qwen3
    rs = np.random.RandomState(1)
    prompts = [rs.randint(4, 96, n).tolist() for n in (6, 9, 4)]
    free = [r.token_ids for r in dec.generate(prompts, 30)]
    stop = free[0][5]  # a token the first sequence emits at step 6
    stopped = dec.generate(prompts, 30, stop_token_ids=[stop])
    for f, r in zip(free, stopped):
        cut = f.index(stop) + 1 if stop in f else len(f)
        assert r.token_ids == f[:cut]
    assert stopped[0].token_ids[-1] == stop and len(stopped[0].token_ids) <= 6
    assert stopped[0].token_ids == _hf_greedy(hf, prompts[0], 30, eos=stop)


def test_first_token_stop_and_single_token_budget(qwen3):
    _, dec = qwen3
    p = [5, 6, 7]
    first = dec.generate([p], 5)[0].token_ids[0]
    assert dec.generate([p], 5, stop_token_ids=[first])[0].token_ids == [first]
    one = dec.generate([p], 1)[0]
    assert one.token_ids == [first] and one.acceptance_lengths == []


def test_shapes_are_bucketed(qwen3):
    _, dec = qwen3
    assert bucket(1) == 16 and bucket(17) == 32 and bucket(3, 1) == 4
    dec.generate([[4, 5, 6]], 8)
    n = len(dec._compiled)
    dec.generate([[7, 8, 9, 10, 11]], 8)  # same bucket: no new executable
    assert len(dec._compiled) == n


@pytest.mark.parametrize(
    "prompts, n, stops, message",
    [
        ([[]], 4, [], "empty prompt"),
        ([[1, 2]], 0, [], "max_new_tokens"),
        ([[1, 2]], 4, [1000], "outside the vocabulary"),
        ([[1, 2]], 10_000, [], "exceeds the target's context"),
    ],
)
def test_bad_input_fails_before_compiling(qwen3, prompts, n, stops, message):
    _, dec = qwen3
    before = len(dec._compiled)
    with pytest.raises(ValueError, match=message):
        dec.generate(prompts, n, stops)
    assert len(dec._compiled) == before


def test_generate_cli_json(tiny_models, capsys):
    from dflash_jax.cli import main

    _, _, path = tiny_models["qwen3"]
    main(["generate", "--target", str(path), "--prompt", "t10 t11 t12", "--max-new-tokens", "6", "--json"])
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("text", "token_ids", "num_output_tokens", "decode_tokens_per_s", "prefill_s", "compile_s"):
        assert key in record
    assert record["num_output_tokens"] == len(record["token_ids"]) == 6


def test_demo_loads_the_shipped_drafter_once_and_prints_every_row(tiny_models, tmp_path, monkeypatch, capsys):
    """``demo`` with a drafter shipped (patched in for the tiny target): plain, the drafter at its own
    block, prompt lookup, the defaults; every row identical to plain; the drafter read from disk once."""
    from dflash_jax import drafter_io, hub
    from dflash_jax.cli import main
    from dflash_jax.drafter import DrafterConfig, init_drafter_params

    _, _, path = tiny_models["qwen3"]
    from dflash_jax import checkpoint

    ck = checkpoint.load_target(path)
    dcfg = DrafterConfig.for_target(ck.cfg, num_layers=1, block_size=4, mask_token_id=3)
    folder = drafter_io.export_released(init_drafter_params(dcfg), dcfg, tmp_path / "shipped")
    monkeypatch.setattr(hub, "shipped_drafter", lambda identity: folder)
    loads, real = [], drafter_io.load_drafter
    monkeypatch.setattr(drafter_io, "load_drafter", lambda *a, **k: loads.append(a) or real(*a, **k))
    main(["demo", "--target", str(path), "--prompt", "t10 t11 t12 t10 t11", "--max-new-tokens", "8"])
    out = capsys.readouterr().out
    assert len(loads) == 1 and "speculative output identical to plain: True" in out
    rows = [line for line in out.splitlines() if " tokens  tau " in line]
    assert [r.split(",")[0].split(" (")[0] for r in rows] == [
        "plain",
        "DFlash alone",
        "prompt lookup alone",
        "the defaults: DFlash + prompt lookup",  # --tree auto with a shipped drafter: chains (CPU_TREE_BUDGET 0)
    ]
    assert "block 4" in rows[1] and "block 4, verify lengths auto" in rows[3]  # the drafter's own block, not 16
    with pytest.raises(SystemExit, match="--max-new-tokens must be >= 1"):
        main(["demo", "--target", str(path), "--max-new-tokens", "0"])


def test_generate_cli_drafting_options_give_the_plain_tokens(tiny_models, capsys):
    """--drafter ngram (prompt lookup, with and without --calibrate), the defaults (auto: prompt lookup
    for a target without a shipped drafter, verify lengths auto) and a bad --verify-lengths or --draft-vocab, through
    the command line."""
    from dflash_jax.cli import main

    _, _, path = tiny_models["qwen3"]
    base = ["generate", "--target", str(path), "--prompt", "t10 t11 t12 t10 t11 t12 t10 t11", "--max-new-tokens", "12"]
    outs = []
    ngram = ["--drafter", "ngram", "--verify-lengths", "1,4"]
    for extra in (["--drafter", "none"], ngram, [*ngram, "--calibrate", "off"], []):
        main([*base, *extra, "--json"])
        outs.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1])["token_ids"])
    assert outs[0] == outs[1] == outs[2] == outs[3] and len(outs[0]) == 12
    with pytest.raises(SystemExit, match="--verify-lengths takes auto, full or positive numbers"):
        main([*base, "--verify-lengths", "four"])
    with pytest.raises(SystemExit, match="--draft-vocab takes a number of tokens >= 0"):
        main([*base, "--draft-vocab", "-1"])


def test_the_console_entry_exits_quickly_with_everything_written(tiny_models):
    """``dflash-jax generate`` (``cli.run``) skips the interpreter's teardown after it returns: its
    output is complete and its status 0; a bad flag still exits 1 with its one-line error."""
    import subprocess
    import sys

    _, _, path = tiny_models["qwen3"]
    base = [sys.executable, "-m", "dflash_jax.cli", "generate", "--target", str(path), "--prompt", "t10 t11"]
    done = subprocess.run(
        [*base, "--max-new-tokens", "3", "--json", "--drafter", "none"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout.strip().splitlines()[-1])["token_ids"]) == 3
    bad = subprocess.run([*base, "--max-new-tokens", "0"], capture_output=True, text=True)
    assert bad.returncode == 1 and bad.stderr.strip().splitlines()[-1].startswith("error: --max-new-tokens")
