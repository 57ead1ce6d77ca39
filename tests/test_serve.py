"""Bring your own answers: conversations made elsewhere (OpenAI and ShareGPT forms) as training
shards, and answers regenerated through an OpenAI-compatible server: ``dflash-jax serve`` serving the
embedded SmolLM2 on loopback, started by the test, asked by ``prepare-data --server``."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from dflash_jax import checkpoint, conversations, data, hub
from dflash_jax.cli import main
from dflash_jax.decode import Decoder
from dflash_jax.errors import DataError
from dflash_jax.tokens import chat_ids, stop_ids

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def smol():
    ck = checkpoint.load_target(hub.SMOLLM2)
    return ck, ck.tokenizer()


def _masked_text(tok, ids, mask):
    return tok.decode([t for t, m in zip(ids, mask) if m])


def test_conversations_in_both_forms_become_masked_shards(smol, tmp_path):
    """ShareGPT and OpenAI rows through the chat template: the loss exactly on the assistant turns
    (each up to its end-of-turn token), the rest of the conversation unmasked; bad rows refused
    naming file and line."""
    ck, tok = smol
    rows = [
        {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello! How can I help?"},
                           {"from": "human", "value": "Count to three."}, {"from": "gpt", "value": "1, 2, 3."}]},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"},
                      {"role": "assistant", "content": "Paris."}]},
    ]  # fmt: skip
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    main(["prepare-data", "--conversations", str(path), "--out", str(tmp_path / "d"), "--shard-size", "1"])
    ds = data.TokenDataset(tmp_path / "d")
    got = {}
    for i in range(len(ds)):
        ids, mask = (x.tolist() for x in ds[i])
        got[_masked_text(tok, ids, mask)] = tok.decode(ids)
    assert set(got) == {"Hello! How can I help?<|im_end|>1, 2, 3.<|im_end|>", "Paris.<|im_end|>"}
    assert "Count to three.<|im_end|>" in got["Hello! How can I help?<|im_end|>1, 2, 3.<|im_end|>"]
    meta = json.loads((tmp_path / "d" / "meta.json").read_text())
    assert meta["settings"]["mode"] == "conversations" and meta["complete"]
    bad = tmp_path / "bad.jsonl"
    question = {"messages": [{"role": "user", "content": "only a question"}]}
    bad.write_text(json.dumps(rows[1]) + "\n" + json.dumps(question))
    with pytest.raises(DataError, match=r"bad.jsonl:2: no assistant turn"):
        conversations.read_conversations(bad)
    bad.write_text(json.dumps({"conversations": [{"from": "robot", "value": "x"}]}) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl:1: turn 0 is not a system, user or assistant turn"):
        conversations.read_conversations(bad)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_prepare_data_through_a_served_smollm2(smol, tmp_path):
    """``dflash-jax serve`` (plain greedy, SmolLM2) on loopback: its chat completions are the target's
    greedy answers; ``prepare-data --server`` writes shards of them (cut answers not taught to end)
    that a rerun keeps; a bad request gets HTTP 400 with the reason; an unreachable server is one
    line naming the fix."""
    ck, tok = smol
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TQDM_DISABLE": "1"}
    cmd = [sys.executable, "-m", "dflash_jax.cli", "serve", "--drafter", "none", "--port", str(port)]
    server = subprocess.Popen(cmd + ["--batch-size", "2"], env=env, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                requests.get(f"{url}/models", timeout=2)
                break
            except requests.ConnectionError:
                assert server.poll() is None, server.stderr.read()[-2000:]
                time.sleep(0.5)
        questions = ["What is 7 * 6?", "Name three colors.", "Say hi."]
        dec, stops = Decoder(ck.params, ck.cfg), stop_ids(tok)
        want = []
        for q in questions:
            ids = dec.generate([chat_ids(tok, [{"role": "user", "content": q}])], 12, stops)[0].token_ids
            want.append((tok.decode(ids[:-1] if ids[-1] in stops else ids), ids[-1] in stops))
        r = requests.post(f"{url}/chat/completions", json={"messages": [{"role": "user", "content": questions[0]}],
                                                           "max_tokens": 12}).json()  # fmt: skip
        assert r["choices"][0]["message"]["content"] == want[0][0]
        assert r["choices"][0]["finish_reason"] == ("stop" if want[0][1] else "length")
        bad = requests.post(f"{url}/chat/completions", json={"messages": [{"role": "robot", "content": "x"}]})
        assert bad.status_code == 400 and "role" in bad.json()["error"]["message"]
        other = requests.post(
            f"{url}/chat/completions", json={"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]}
        )
        assert other.status_code == 404 and "gpt-4" in other.json()["error"]["message"]

        prompts = tmp_path / "p.jsonl"
        prompts.write_text("".join(json.dumps({"prompt": q}) + "\n" for q in questions))
        args = ["prepare-data", "--prompts", str(prompts), "--server", url, "--max-new-tokens", "12"]
        main(args + ["--shard-size", "2", "--out", str(tmp_path / "d")])
        ds = data.TokenDataset(tmp_path / "d")
        answers = {}
        for i in range(len(ds)):
            ids, mask = (x.tolist() for x in ds[i])
            question = tok.decode(ids).split("<|im_start|>user\n")[1].split("<|im_end|>")[0]
            answers[question] = _masked_text(tok, ids, mask)
        for q, (text, ended) in zip(questions, want):
            assert answers[q] == text + ("<|im_end|>" if ended else ""), q
        before = (tmp_path / "d" / "shard_00000" / "tokens.npy").read_bytes()
        main(args + ["--shard-size", "2", "--out", str(tmp_path / "d")])  # complete: nothing asked again
        assert (tmp_path / "d" / "shard_00000" / "tokens.npy").read_bytes() == before
    finally:
        server.terminate()
        server.wait(timeout=30)
    with pytest.raises(SystemExit, match=r"^error: cannot list the models of http://127.0.0.1:\d+/v1"):
        main(["prepare-data", "--prompts", str(prompts), "--server", url, "--out", str(tmp_path / "e")])
