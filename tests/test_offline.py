"""Offline decoding: rows refilled as their requests finish (``Decoder.as_completed``), and the
resumable answers file of ``generate --out`` (``offline.write_answers``), split over processes."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dflash_jax import checkpoint
from dflash_jax.decode import Decoder
from dflash_jax.drafter import DrafterConfig, DraftStep, init_drafter_params
from dflash_jax.errors import DataError
from dflash_jax.ngram import NgramStep
from dflash_jax.sampling import Sampling
from dflash_jax.speculation import make_plan
from dflash_jax.tree_step import TreeStep

ROOT = Path(__file__).resolve().parents[1]
STOPS = [5, 7]  # frequent enough in the tiny target's answers that some stop early, at various places


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rs = np.random.RandomState(seed)
    return [rs.randint(4, 96, int(k)).tolist() for k in rs.choice([1, 2, 5, 9, 17, 33, 60], n)]


def _plan(kind: str, ck):
    dcfg = DrafterConfig.for_target(ck.cfg, num_layers=1, block_size=4, mask_token_id=3)
    dparams = init_drafter_params(dcfg, seed=1)
    if kind == "plain":
        return None
    if kind == "ngram":
        return make_plan(NgramStep(block_size=4))
    if kind == "dflash":
        return make_plan(DraftStep(dcfg, ck.cfg), dparams)
    return make_plan(TreeStep(DraftStep(dcfg, ck.cfg), 6, ngram=NgramStep(block_size=4)), dparams)


@pytest.mark.parametrize("kind", ["plain", "ngram", "dflash", "tree"])  # tree: with prompt lookup's branch
def test_refilled_rows_give_every_prompt_the_tokens_it_gets_alone(tiny_models, kind):
    """Greedy: 11 prompts of 1 to 60 tokens through 4 refilled rows (answers cut by stop tokens at
    different places and by the limit) give every prompt exactly its tokens decoded alone, with the
    same rounds; and every prompt is yielded once."""
    ck = checkpoint.load_target(tiny_models["qwen3"][2])
    dec = Decoder(ck.params, ck.cfg, _plan(kind, ck))
    prompts = _prompts(11)
    got = list(dec.as_completed(prompts, 24, STOPS, batch_size=4))
    assert sorted(i for i, _ in got) == list(range(11))
    lengths = set()
    for i, r in got:
        alone = dec.generate([prompts[i]], 24, STOPS)[0]
        assert (r.token_ids, r.acceptance_lengths) == (alone.token_ids, alone.acceptance_lengths), i
        lengths.add(len(r.token_ids))
    assert len(lengths) >= 3 and 24 in lengths  # stops at several places, and the limit
    order = [i for i, _ in got]
    assert order != sorted(order) or kind == "plain"  # finishing order is not the prompt order (refills happened)


def test_sampled_requests_keep_their_draws_whatever_the_batch_and_order(tiny_models):
    """Sampling (temperature 1, DFlash drafter): a request's output depends on its prompt and seed
    only: refilled rows of 2 or 4, prompts in reverse order, and the request alone agree."""
    ck = checkpoint.load_target(tiny_models["qwen3"][2])
    dec = Decoder(ck.params, ck.cfg, _plan("dflash", ck), sampling=Sampling(1.0))
    prompts, seeds = _prompts(7, seed=3), [11 * i + 5 for i in range(7)]
    four = dict(dec.as_completed(prompts, 16, STOPS, seeds, batch_size=4))
    two = dict(dec.as_completed(prompts[::-1], 16, STOPS, seeds[::-1], batch_size=2))
    for i in range(7):
        alone = dec.generate([prompts[i]], 16, STOPS, seed=seeds[i])[0].token_ids
        assert four[i].token_ids == alone == two[6 - i].token_ids, i
    assert len({tuple(r.token_ids) for r in four.values()}) == 7


def test_refill_on_a_mesh_equals_one_device(tiny_models):
    """Rows split over a (4, 1, 2) mesh's data axis, refilled: the same tokens as one device."""
    from dflash_jax.sharding import make_mesh

    path = tiny_models["qwen3"][2]
    ck = checkpoint.load_target(path)
    prompts = _prompts(9, seed=5)
    want = dict(Decoder(ck.params, ck.cfg).as_completed(prompts, 12, STOPS, batch_size=4))
    mesh = make_mesh((4, 1, 2))
    sharded = checkpoint.load_target(path, mesh=mesh)
    got = dict(Decoder(sharded.params, ck.cfg, mesh=mesh).as_completed(prompts, 12, STOPS, batch_size=4))
    assert {i: r.token_ids for i, r in got.items()} == {i: r.token_ids for i, r in want.items()}


def test_answers_file_resumes_drops_a_cut_line_and_refuses_other_settings(tiny_models, tmp_path):
    """``offline.write_answers``: the file ends in prompt order; a cut last line is dropped and made
    again; a rerun decodes only what is missing; other settings are refused, naming the difference."""
    from dflash_jax import offline

    ck = checkpoint.load_target(tiny_models["qwen3"][2])
    dec, prompts = Decoder(ck.params, ck.cfg), _prompts(6, seed=7)
    decoded = []

    def record(i, r):
        decoded.append(i)
        return {"token_ids": r.token_ids}

    kw = dict(settings={"max_new_tokens": 10}, record=record, max_new_tokens=10, stop_ids=STOPS, progress=False)
    out = offline.write_answers(dec, prompts, tmp_path / "a.jsonl", batch_size=2, **kw)
    lines = out.read_text().splitlines()
    assert [json.loads(x)["index"] for x in lines] == list(range(6))
    whole = out.read_text()
    out.write_text("\n".join(lines[:3]) + "\n" + lines[3][:20])  # killed while writing the fourth
    decoded.clear()
    offline.write_answers(dec, prompts, out, batch_size=2, **kw)
    assert sorted(decoded) == [3, 4, 5] and out.read_text() == whole
    with pytest.raises(DataError, match="max_new_tokens: 10 -> 11"):
        offline.write_answers(dec, prompts, out, **{**kw, "settings": {"max_new_tokens": 11}})
    out.write_text("\n".join(lines[:4]) + "\n\n")  # a blank last line: dropped from the file, not appended after
    decoded.clear()
    offline.write_answers(dec, prompts, out, batch_size=2, **kw)
    assert sorted(decoded) == [4, 5] and out.read_text() == whole
    tupled = {**kw, "settings": {"stops": (5, 7)}}  # compared as JSON reads it back: a rerun is not refused
    offline.write_answers(dec, prompts, tmp_path / "t.jsonl", **tupled)
    decoded.clear()
    offline.write_answers(dec, prompts, tmp_path / "t.jsonl", **tupled)
    assert decoded == []
    out.unlink()  # deleted to start over: its recorded settings give way to the new ones
    offline.write_answers(dec, prompts, out, **{**kw, "settings": {"max_new_tokens": 11}})
    (tmp_path / "b.jsonl").write_text(lines[0].replace(json.loads(lines[0])["settings_sha256"], "0" * 64) + "\n")
    (tmp_path / "b.jsonl.settings.json").write_text(json.dumps({"max_new_tokens": 10}))
    with pytest.raises(DataError, match="other settings"):
        offline.write_answers(dec, prompts, tmp_path / "b.jsonl", **kw)


def _cli(*args, env=None, **kw):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TQDM_DISABLE": "1", **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "dflash_jax.cli", *args], env=env, **kw)


def _records(path: Path) -> list[dict]:
    timing = ("prefill_s", "decode_s", "compile_s")
    return [{k: v for k, v in json.loads(x).items() if k not in timing} for x in path.read_text().splitlines()]


def test_generate_out_killed_resumes_to_the_uninterrupted_file(tiny_models, tmp_path):
    """``generate --out``: killed (SIGKILL, by its process id) after its first answers, the same
    command finishes the file, equal to an uninterrupted run's but for timings; another setting is
    refused in one line; two processes of a jax.distributed job write the same file."""
    path = tiny_models["qwen3"][2]
    prompts = tmp_path / "p.jsonl"
    rs = np.random.RandomState(0)
    words = ["alpha", "beta", "gamma", "delta", "omega", "sigma"]
    prompts.write_text("".join(json.dumps({"prompt": " ".join(rs.choice(words, k))}) + "\n" for k in range(1, 49)))
    args = ["generate", "--target", str(path), "--drafter", "none", "--prompts-file", str(prompts)]
    args += ["--max-new-tokens", "48", "--batch-size", "2"]
    full = _cli(*args, "--out", str(tmp_path / "full.jsonl"), stderr=subprocess.PIPE, text=True)
    assert full.wait(timeout=300) == 0, full.stderr.read()[-2000:]
    want = _records(tmp_path / "full.jsonl")
    assert [r["index"] for r in want] == list(range(48))

    out = tmp_path / "cut.jsonl"
    run = _cli(*args, "--out", str(out), stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not (out.exists() and out.read_text().count("\n") >= 3) and run.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    os.kill(run.pid, signal.SIGKILL)
    run.wait()
    assert out.read_text().count("\n") < 48, "the run finished before the kill; nothing was interrupted"
    again = _cli(*args, "--out", str(out), stderr=subprocess.PIPE, text=True)
    assert again.wait(timeout=300) == 0, again.stderr.read()[-2000:]
    assert _records(out) == want

    other = _cli(*args, "--dtype", "bfloat16", "--out", str(out), stderr=subprocess.PIPE, text=True)
    assert other.wait(timeout=300) == 1
    err = other.stderr.read().strip().splitlines()[-1]
    assert "other settings" in err and "dtype: 'float32' -> 'bfloat16'" in err, err

    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    two = tmp_path / "two.jsonl"
    procs = [
        _cli(*args, "--out", str(two), "--coordinator", f"localhost:{port}", "--num-processes", "2",
             "--process-id", str(i), env=env, stderr=subprocess.PIPE, text=True)
        for i in range(2)
    ]  # fmt: skip
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read()[-3000:]
    assert _records(two) == want
    assert not list(tmp_path.glob("two.jsonl.part-*"))  # merged, parts removed
    # a refusal on one process stops every process at once, each with the one-line error
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    procs = [
        _cli(*args[:-3], "40", "--batch-size", "2", "--out", str(two), "--coordinator", f"localhost:{port}",
             "--num-processes", "2", "--process-id", str(i), env=env, stderr=subprocess.PIPE, text=True)
        for i in range(2)
    ]  # fmt: skip
    for i, p in enumerate(procs):
        assert p.wait(timeout=120) == 1
        err = p.stderr.read().strip().splitlines()[-1]
        assert ("max_new_tokens: 48 -> 40" if i == 0 else "other settings") in err, err
