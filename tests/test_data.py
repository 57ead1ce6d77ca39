"""prepare-data: target-regenerated answers in resumable shards, prompt formats, bad input."""

import json
import shutil

import numpy as np
import pytest
from helpers import stale_scratch

from dflash_jax import checkpoint, data, prepare, prompts
from dflash_jax.decode import Decoder
from dflash_jax.tokens import loops


@pytest.fixture(scope="session")
def target(tiny_models):
    _, _, path = tiny_models["qwen3"]
    ck = checkpoint.load_target(path)
    return ck, ck.tokenizer()


def _prompt_file(path, n, seed=0):
    rs = np.random.RandomState(seed)
    with open(path, "w") as f:
        for _ in range(n):
            f.write(json.dumps({"prompt": " ".join(f"t{t}" for t in rs.randint(4, 96, rs.randint(2, 8)))}) + "\n")
    return path


def test_prepare_writes_resumable_shards_of_the_targets_own_answers(target, tmp_path):
    from dflash_jax.tokens import encode, stop_ids

    ck, tok = target
    items = prompts.read_prompts(_prompt_file(tmp_path / "p.jsonl", 10), limit=None)
    out = tmp_path / "d"
    meta = prepare.prepare(ck, tok, items, out, max_new_tokens=12, batch_size=4, shard_size=4, progress=False)
    assert meta["complete"] and meta["shards"] == ["shard_00000", "shard_00001", "shard_00002"]
    ds = data.TokenDataset(out)
    assert len(ds) == meta["num_sequences"] == 10
    # every sequence is prompt + the target's own greedy answer, loss mask on the answer only
    dec = Decoder(ck.params, ck.cfg)
    by_where = {p.where: p for p in items}
    shard0 = json.loads((out / "shard_00000" / "meta.json").read_text())
    for i, where in enumerate(shard0["prompts"]):
        tokens, mask = ds[i]
        ids = encode(tok, by_where[where].text, chat=True)
        answer = dec.generate([ids], 12, stop_ids(tok))[0].token_ids
        assert tokens.tolist() == ids + answer and mask.tolist() == [False] * len(ids) + [True] * len(answer)
    # a kill after two shards: the restart redoes only the missing one, with identical content
    before = {f: (out / "shard_00000" / f).read_bytes() for f in data.FILES}
    shutil.rmtree(out / "shard_00002")
    stale = stale_scratch(out / "shard_00002")  # what a kill during a write leaves
    again = prepare.prepare(ck, tok, items, out, max_new_tokens=12, batch_size=4, shard_size=4, progress=False)
    assert again["stats"] == meta["stats"] and not stale.exists()
    assert {f: (out / "shard_00000" / f).read_bytes() for f in data.FILES} == before
    with pytest.raises(data.DataError, match=r"other settings \(max_new_tokens: 12 -> 13\); choose another --out"):
        prepare.prepare(ck, tok, items, out, max_new_tokens=13, batch_size=4, shard_size=4, progress=False)
    # the same shards whatever the batching: 3 rows refilled over one shard at a time, and one row
    other = prepare.prepare(
        ck, tok, items, tmp_path / "e", max_new_tokens=12, batch_size=3, shard_size=4, window=1, progress=False
    )
    prepare.prepare(ck, tok, items, tmp_path / "f", max_new_tokens=12, batch_size=1, shard_size=4, progress=False)
    assert other["settings"] == meta["settings"]
    for name in meta["shards"]:
        for f in data.FILES:
            assert (tmp_path / "e" / name / f).read_bytes() == (out / name / f).read_bytes(), (name, f)
            assert (tmp_path / "f" / name / f).read_bytes() == (out / name / f).read_bytes(), (name, f)
    np.save(out / "shard_00001" / "offsets.npy", np.array([0, 5], np.int64))
    with pytest.raises(data.DataError, match="shard_00001"):
        prepare.prepare(ck, tok, items, out, max_new_tokens=12, batch_size=4, shard_size=4, progress=False)
    assert (out / "shard_00000").exists() and (out / "shard_00002").exists()  # finished shards are kept


def test_prompt_formats_and_their_errors(tmp_path, target):
    ck, tok = target
    # files shaped as the training sets in ../shared/data/train are (format picked by the name)
    gsm_rows = [{"question": "Tom has 3 apples and buys 2. How many?", "answer": "5"}, {"question": "2 + 2?"}]
    (tmp_path / "gsm8k_train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in gsm_rows))
    alpaca_rows = [
        {"instruction": "Name a colour.", "input": "", "output": "red"},
        {"instruction": "Translate to French.", "input": "Good morning", "output": "Bonjour"},
    ]
    (tmp_path / "alpaca_en_1k.json").write_text(json.dumps(alpaca_rows))
    gsm = prompts.read_prompts(tmp_path / "gsm8k_train.jsonl", limit=2)
    assert gsm[0].text.endswith(prompts.GSM8K_SUFFIX) and gsm[0].where.endswith("gsm8k_train.jsonl:1")
    assert gsm[0].text.startswith(gsm_rows[0]["question"]) and len(gsm) == 2
    alp = prompts.read_prompts(tmp_path / "alpaca_en_1k.json", limit=50)
    assert [p.text for p in alp] == ["Name a colour.", "Translate to French.\n\nGood morning"]  # instruction + input
    mbpp_file = prompts.PACKAGED_EVAL_DATA / "mbpp_sanitized.json"
    mbpp = prompts.read_prompts(mbpp_file)
    ids = [json.loads(mbpp_file.read_text())[int(p.where.rsplit(":", 1)[1]) - 1]["task_id"] for p in mbpp]
    assert mbpp and not any(11 <= i <= 510 for i in ids)  # never the evaluation split
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "t5"}\n{"text": "t6"}\n')
    with pytest.raises(data.DataError, match="bad.jsonl:2"):
        prompts.read_prompts(bad)
    bad.write_text('{"prompt": "t5"}\nnot json\n')
    with pytest.raises(data.DataError, match="bad.jsonl:2"):
        prompts.read_prompts(bad)
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"prompt": "t5"}) + "\n" + json.dumps({"prompt": " ".join(["t7"] * 600)}) + "\n")
    with pytest.raises(data.DataError, match="long.jsonl:2.*context"):
        prepare.prepare(ck, tok, prompts.read_prompts(long), tmp_path / "o", max_new_tokens=8, progress=False)


def test_auto_reads_instruction_rows_as_alpaca_whatever_the_file_name(tmp_path):
    """Rows with ``instruction`` + ``input`` in a file not named alpaca keep their input (``auto`` used
    to fall back to ``plain`` by the name and drop it); rows of other fields are still read as plain."""
    rows = [
        {"instruction": "Translate to French.", "input": "Good morning", "output": "Bonjour"},
        {"instruction": "Name a colour.", "input": "", "output": "red"},
        {"instruction": "Sum these.", "input": "  ", "output": "?"},
    ]
    tasks = tmp_path / "my_tasks.json"
    tasks.write_text(json.dumps(rows))
    auto = prompts.read_prompts(tasks)
    assert auto == prompts.read_prompts(tasks, fmt="alpaca")
    assert [p.text for p in auto] == ["Translate to French.\n\nGood morning", "Name a colour.", "Sum these."]
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join(json.dumps(r) + "\n" for r in [{"prompt": "t5", "input": "x"}, rows[0]]))
    assert [p.text for p in prompts.read_prompts(mixed)] == ["t5", "Translate to French.\n\nGood morning"]


def test_loop_detector():
    assert loops([1, 2, 3] * 10)
    assert not loops(list(range(40)))


def test_follow_ups_make_two_turn_conversations_of_the_targets_own_answers(target, tmp_path):
    """``prepare-data --follow-ups``: each sequence is the prompt, the target's greedy answer, a
    follow-up from ``FOLLOW_UPS`` and the target's greedy answer to it; the loss on exactly the two
    answers."""
    from dflash_jax.tokens import chat_ids, stop_ids

    ck, tok = target
    items = prompts.read_prompts(_prompt_file(tmp_path / "p.jsonl", 5, seed=3), limit=None)
    kw = dict(max_new_tokens=8, batch_size=2, shard_size=2, progress=False)
    meta = prepare.prepare_follow_ups(ck, tok, items, tmp_path / "d", **kw)
    assert meta["complete"] and meta["settings"]["mode"] == "greedy, a follow-up turn"
    dec, stops = Decoder(ck.params, ck.cfg), stop_ids(tok)
    by_where = {p.where: p.text for p in items}
    index = {p.where: i for i, p in enumerate(items)}
    chosen = np.random.RandomState(1).randint(len(prepare.FOLLOW_UPS), size=len(items))

    def answer(messages):
        ids = dec.generate([chat_ids(tok, messages)], 8, stops)[0].token_ids
        return tok.decode(ids, skip_special_tokens=True)

    seen = 0
    for name in meta["shards"]:
        shard = data.Shard(tmp_path / "d" / name)
        for k, where in enumerate(shard.meta["prompts"]):
            ids = shard.tokens[shard.offsets[k] : shard.offsets[k + 1]].tolist()
            mask = shard.loss_mask[shard.offsets[k] : shard.offsets[k + 1]].tolist()
            starts = [j for j in range(len(mask)) if mask[j] and (j == 0 or not mask[j - 1])]
            assert len(starts) == 2, mask
            spans = [[], []]
            for j, m in enumerate(mask):
                if m:
                    spans[int(j >= starts[1])].append(ids[j])
            first = answer([{"role": "user", "content": by_where[where]}])
            assert tok.decode(spans[0], skip_special_tokens=True) == first
            follow = prepare.FOLLOW_UPS[chosen[index[where]]]  # as prepare chooses it (seed 0 + 1)
            second = answer(
                [{"role": "user", "content": by_where[where]}, {"role": "assistant", "content": first},
                 {"role": "user", "content": follow}]
            )  # fmt: skip
            assert tok.decode(spans[1], skip_special_tokens=True) == second
            seen += 1
    assert seen == meta["num_sequences"] >= 4
