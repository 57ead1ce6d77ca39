"""The evaluation harness: prompt formats, the figures it reports, and the CLI end to end (resume)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from dflash_jax import bench
from dflash_jax.bench import summarise
from dflash_jax.errors import BenchError
from dflash_jax.prompts import DATASETS, GSM8K_SUFFIX, PACKAGED_EVAL_DATA, eval_data_dir, load_eval_prompts


def _write(path, rows, as_list=False):
    path.write_text(json.dumps(rows) if as_list else "".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_prompt_formats(tmp_path):
    g = load_eval_prompts("gsm8k", _write(tmp_path / "g.jsonl", [{"question": "Q1?", "answer": "1"}]))
    assert g[0].turns == ("Q1?" + GSM8K_SUFFIX,)
    h = load_eval_prompts(
        "humaneval", _write(tmp_path / "h.jsonl", [{"task_id": "HumanEval/0", "prompt": "def f():\n"}])
    )
    assert h[0].id == "HumanEval/0"
    assert h[0].turns[0] == (
        "Write a solution to the following problem and make sure that it passes the tests:\n```python\ndef f():\n\n```"
    )
    m = load_eval_prompts(
        "mbpp",
        _write(tmp_path / "m.json", [{"task_id": t, "prompt": f"p{t}"} for t in (2, 11, 510, 511)], as_list=True),
    )
    assert [p.id for p in m] == ["11", "510"]  # the evaluation split only
    rows = [{"question_id": 81, "turns": ["a", "b"]}, {"question_id": 82, "turns": ["c", "d"]}]
    assert load_eval_prompts("mt-bench", _write(tmp_path / "mt.jsonl", rows))[1].turns == ("c", "d")
    assert load_eval_prompts("mt-bench", tmp_path / "mt.jsonl", max_turns=1)[0].turns == ("a",)
    assert len(load_eval_prompts("mt-bench", tmp_path / "mt.jsonl", max_samples=1)) == 1


def test_bad_prompt_files_name_file_and_line(tmp_path):
    with pytest.raises(BenchError, match=r"g.jsonl:2: expected a non-empty string field 'question'"):
        load_eval_prompts("gsm8k", _write(tmp_path / "g.jsonl", [{"question": "ok"}, {"q": "x"}]))
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a"}\n{oops\n')
    with pytest.raises(BenchError, match=r"bad.jsonl:2: not a JSON object"):
        load_eval_prompts("custom", tmp_path / "bad.jsonl")
    with pytest.raises(BenchError, match="unknown dataset 'gsm9k'"):
        load_eval_prompts("gsm9k")
    with pytest.raises(BenchError, match="not found"):
        load_eval_prompts("gsm8k", tmp_path / "missing.jsonl")


def test_the_real_sets_load(monkeypatch):
    monkeypatch.delenv("DFLASH_JAX_EVAL_DATA", raising=False)  # the copies shipped in the package
    assert eval_data_dir() == PACKAGED_EVAL_DATA
    sizes = {d: len(load_eval_prompts(d)) for d in DATASETS}
    assert sizes == {"gsm8k": 1319, "math500": 500, "humaneval": 164, "mbpp": 257, "mt-bench": 80}


def test_eval_data_env_comes_first_and_a_missing_set_says_where_it_goes(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_JAX_EVAL_DATA", str(tmp_path))
    _write(tmp_path / "gsm8k_test.jsonl", [{"question": "Q?"}])
    assert eval_data_dir() == tmp_path and len(load_eval_prompts("gsm8k")) == 1
    with pytest.raises(BenchError) as e:
        load_eval_prompts("mt-bench")
    msg = str(e.value)
    assert "\n" not in msg and "put mt_bench.jsonl (the mt-bench set" in msg and f"in {tmp_path}," in msg
    assert "unset DFLASH_JAX_EVAL_DATA" in msg and "--prompts-file" in msg
    monkeypatch.setenv("DFLASH_JAX_EVAL_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(BenchError, match="no evaluation data folder .*nowhere: point DFLASH_JAX_EVAL_DATA"):
        load_eval_prompts("gsm8k")


def _rec(acc, plain_s, spec_s, tokens, loops=False):
    return {
        "dataset": "x",
        "id": "0",
        "turn": 0,
        "loops": loops,
        "plain": {"tokens": tokens, "decode_s": plain_s, "prefill_s": 0.1, "compile_s": 0.0},
        "b4": {
            "tokens": tokens,
            "decode_s": spec_s,
            "prefill_s": 0.2,
            "compile_s": 0.0,
            "acceptance_lengths": acc,
            "identical": True,
        },
    }


def test_summary_figures_by_hand():
    recs = [_rec([4, 1, 2], 2.0, 1.0, 8), _rec([3, 3], 3.0, 1.0, 7, loops=True)]
    s = summarise(recs, 4)
    assert s["tau"] == pytest.approx(13 / 5)  # all rounds of all prompts
    assert s["tau_per_prompt"] == pytest.approx((7 / 3 + 3) / 2)  # the reference benchmark's mean
    assert s["acceptance_histogram"] == [1, 1, 2, 1]
    assert s["offset_acceptance"] == pytest.approx([4 / 5, 3 / 5, 1 / 5])  # rounds with a >= k
    assert s["plain_tokens_per_s"] == pytest.approx(13 / 5) and s["dflash_tokens_per_s"] == pytest.approx(13 / 2)
    assert s["speedup"] == pytest.approx(2.5)
    rep = bench.report(recs, [4], ["x"])
    assert rep["tau"] == s["tau"] and rep["table"]["x"]["4"]["loop_free"]["tau"] == pytest.approx(7 / 3)
    assert s["tokens_per_verified"] == pytest.approx(13 / 5 / 4)  # a block of 4 verified each round
    for r in recs:  # a tree arm of 6 nodes: its anchor and nodes verified each round
        r["tree6"] = dict(r.pop("b4"), block_size=4, tree_nodes=6)
    t = summarise(recs, "tree6")
    assert t["tau"] == s["tau"] and t["tokens_per_verified"] == pytest.approx(13 / 5 / 7)
    assert "| x | tree6 | 2 | 2.60 | 2.67 | 0.371 |" in bench.markdown(bench.report(recs, ["tree6"], ["x"]))
    # an arm that picks its width per round: tokens per verified position from the widths recorded
    for r, widths in zip(recs, ([8, 1, 2], [4, 4])):
        r["default"] = dict(r["tree6"], verify_widths=widths)
    d = summarise(recs, "default")
    assert d["mean_verify_width"] == pytest.approx(19 / 5) and d["tokens_per_verified"] == pytest.approx(13 / 19)
    recs[1]["default"].pop("verify_widths")  # a record made before widths were: unknown for the arm
    assert summarise(recs, "default")["tokens_per_verified"] is None


def test_records_of_other_settings_name_the_fields_that_differ(tmp_path):
    """A records file written with other settings is refused in one short line naming the fields
    that differ (dotted for nested ones, values shortened), not a dump of every setting."""
    target = {"config_sha256": "a" * 64, "tokenizer_sha256": "b" * 64, "source_sha256": "c" * 64}
    old = {
        "target": target,
        "drafter": "/somewhere/drafter",
        "drafter_sha256": "d" * 16,
        "block_sizes": [4, 8],
        "max_new_tokens": 256,
        "batch_size": 1,
        "dtype": "float32",
        "temperature": 0.0,
        "top_p": 1.0,
        "prompts": {"gsm8k": "e" * 64, "mt-bench": "f" * 64},
    }
    new = {
        **old,
        "drafter": "/elsewhere/drafter",  # the folder is not a setting: a moved drafter resumes
        "target": {**target, "tokenizer_sha256": "9" * 64},
        "block_sizes": [16],
        "temperature": 1.0,
    }
    records = tmp_path / "r.records.jsonl"
    records.write_text(json.dumps({"settings": old, "settings_key": bench.settings_key(old)}) + "\n")
    with pytest.raises(BenchError) as e:
        bench.run([], None, None, {}, max_new_tokens=8, stop_ids=(), records=records, settings=new)
    msg = str(e.value)
    assert "(block_sizes: [4, 8] -> [16]; target.tokenizer_sha256: 'bbbbbbbbbbbbbbbbbbbb... -> " in msg
    assert "; temperature: 0.0 -> 1.0); pass another --json-out" in msg
    assert "drafter:" not in msg and "max_new_tokens" not in msg and "config_sha256" not in msg
    assert len(msg.replace(str(records), "")) < 300 and "\n" not in msg  # short whatever the path
    assert records.read_text().count("\n") == 1  # nothing written


@pytest.fixture(scope="session")
def bench_setup(tiny_models, tmp_path_factory):
    from dflash_jax import checkpoint
    from dflash_jax.drafter import DrafterConfig, init_drafter_params
    from dflash_jax.drafter_io import export_released

    _, _, path = tiny_models["qwen3"]
    ck = checkpoint.load_target(path)
    dcfg = DrafterConfig.for_target(ck.cfg, num_layers=1, block_size=8, mask_token_id=3)
    root = tmp_path_factory.mktemp("bench")
    export_released(init_drafter_params(dcfg, seed=0), dcfg, root / "drafter", target_identity=ck.identity)
    data = root / "eval"
    data.mkdir()
    _write(data / "gsm8k_test.jsonl", [{"question": f"t{10 + i} t{20 + i} t30"} for i in range(3)])
    _write(data / "mt_bench.jsonl", [{"question_id": 1, "turns": ["t40 t41", "t42 t43 t44"]}])
    return ck, root


def test_bench_cli_end_to_end_and_resume(bench_setup, tmp_path, monkeypatch, capsys):
    from dflash_jax.cli import main

    ck, root = bench_setup
    monkeypatch.setenv("DFLASH_JAX_EVAL_DATA", str(root / "eval"))
    out = tmp_path / "b" / "r.json"
    shutil.copytree(root / "drafter", tmp_path / "drafter")  # this test re-ships it below
    argv = [
        "bench",
        "--target",
        str(ck.path),
        "--drafter",
        str(tmp_path / "drafter"),
        "--dataset",
        "gsm8k",
        "mt-bench",
        "--max-new-tokens",
        "12",
        "--block-size",
        "4",
        "8",
        "--json-out",
        str(out),
        "--no-progress",
    ]
    main(argv)
    rep = json.loads(out.read_text())
    recs = rep["records"]
    assert len(recs) == 3 + 2  # three GSM8K prompts, one MT-Bench item with two turns
    assert all(r["b4"]["identical"] and r["b8"]["identical"] for r in recs)  # greedy: lossless
    acc = [a for r in recs for a in r["b4"]["acceptance_lengths"]]
    assert rep["tau"] == pytest.approx(np.mean(acc)) and rep["block_size"] == 4
    assert all(sum(r["b8"]["acceptance_lengths"]) + 1 == r["plain"]["tokens"] for r in recs)
    # prompt lookup alone (the baseline) and the default settings are arms of their own, lossless too
    assert all(r["ngram"]["identical"] and r["default"]["identical"] for r in recs)
    assert all(sum(r[k]["acceptance_lengths"]) + 1 == r["plain"]["tokens"] for r in recs for k in ("ngram", "default"))
    assert set(rep["table"]["gsm8k"]) == {"4", "8", "ngram", "default"}
    turn2 = next(r for r in recs if r["turn"] == 1)
    assert (
        turn2["prompt_tokens"] > next(r for r in recs if r["dataset"] == "mt-bench" and r["turn"] == 0)["prompt_tokens"]
    )
    assert set(rep["table"]) == {"gsm8k", "mt-bench", "all"}
    for f in ("r.md", "r_histogram.png", "r_offsets.png"):
        assert (out.parent / f).stat().st_size > 0
    printed = capsys.readouterr().out
    assert (
        "| gsm8k | 4 | 3 |" in printed and "| gsm8k | ngram | 3 |" in printed and "| gsm8k | default | 3 |" in printed
    )
    # dflash-jax bench-report writes the same report again from the records file alone
    main(["bench-report", str(out.with_suffix(".records.jsonl")), "--out", str(tmp_path / "again" / "r.json")])
    again = json.loads((tmp_path / "again" / "r.json").read_text())
    assert again["table"] == rep["table"] and again["records"] == rep["records"]
    assert (tmp_path / "again" / "r.md").read_text() == out.with_suffix(".md").read_text()
    assert "| gsm8k | 4 | 3 |" in capsys.readouterr().out  # the table, printed
    with pytest.raises(SystemExit, match="^error: .*is not a bench records file"):  # one line, no traceback
        main(["bench-report", str(out), "--out", str(tmp_path / "bad" / "r.json")])

    # resume after a kill: keep the header and two records, the rerun measures only the rest
    records = out.with_suffix(".records.jsonl")
    lines = records.read_text().splitlines()
    records.write_text("\n".join(lines[:3]) + "\n" + lines[3][:20])  # a torn last line
    main(argv)
    again = json.loads(out.read_text())["records"]
    assert len(again) == 5 and [r["plain"]["tokens"] for r in again[:2]] == [r["plain"]["tokens"] for r in recs[:2]]

    # a run over fewer prompts and turns (as bench-full's passes differ) reuses the records: nothing
    # is measured, nothing is dropped, and the report covers only the prompts asked for
    before = records.read_text()
    main([*argv, "--max-samples", "1", "--max-turns", "1"])
    fewer = json.loads(out.read_text())["records"]
    assert sorted((r["dataset"], r["turn"]) for r in fewer) == [("gsm8k", 0), ("mt-bench", 0)]
    assert records.read_text() == before

    # the same drafter from another folder (a moved checkout) resumes: nothing measured, nothing lost
    shutil.copytree(tmp_path / "drafter", tmp_path / "moved")
    main([*argv[:4], str(tmp_path / "moved"), *argv[5:]])
    assert records.read_text() == before
    # and so does a records file written before the key left the folder out (its key hashed the path)
    from dflash_jax import bench
    from dflash_jax.utils import json_sha256

    header, *rest = [json.loads(x) for x in before.splitlines()]
    assert header["settings_key"] == bench.settings_key(header["settings"]) != json_sha256(header["settings"], 16)
    legacy = {**header, "settings_key": json_sha256(header["settings"], 16)}
    records.write_text("".join(json.dumps(r) + "\n" for r in [legacy, *rest]))
    main(argv)
    assert len(json.loads(out.read_text())["records"]) == 5 and len(records.read_text().splitlines()) == 6

    # other settings into the same records: refused, nothing lost
    with pytest.raises(SystemExit, match="other settings"):
        main([*argv[:8], "--max-new-tokens", "10", "--block-size", "4", "--json-out", str(out), "--no-progress"])
    assert len(records.read_text().splitlines()) == 6
    # a drafter re-shipped at the same path (other weights) is other settings too, not a resume
    from dflash_jax.drafter import DrafterConfig, init_drafter_params
    from dflash_jax.drafter_io import export_released

    dcfg = DrafterConfig.for_target(ck.cfg, num_layers=1, block_size=8, mask_token_id=3)
    shutil.rmtree(tmp_path / "drafter")
    export_released(init_drafter_params(dcfg, seed=1), dcfg, tmp_path / "drafter", target_identity=ck.identity)
    with pytest.raises(SystemExit, match="other settings"):
        main(argv)
    assert len(records.read_text().splitlines()) == 6


def test_bench_default_arm_is_what_generate_does_with_the_same_drafter_flag(bench_setup, tmp_path, monkeypatch):
    """The 'default' row decodes as ``generate`` would with the same ``--drafter``: with ``auto`` on
    a CPU that is the shipped drafter beside prompt lookup at ``CPU_BLOCK_SIZE`` (``speculation.plan_for``;
    where ``--tree auto`` verifies a tree, as with ``CPU_TREE_BUDGET`` 7 patched in here, the tree with prompt
    lookup's branches, then the same chains interleaved as row 'chains'), not the drafter alone that the
    DFlash rows measure; with a folder it is that drafter beside prompt lookup (``HybridStep``) at the
    drafter's block size."""
    from dflash_jax import cli, hub, speculation
    from dflash_jax.drafter import DraftStep
    from dflash_jax.ngram import HybridStep
    from dflash_jax.speculation import CPU_BLOCK_SIZE
    from dflash_jax.tree_step import TreeStep

    ck, root = bench_setup
    monkeypatch.setenv("DFLASH_JAX_EVAL_DATA", str(root / "eval"))
    monkeypatch.setattr(hub, "shipped_drafter", lambda identity: root / "drafter")  # 'auto' finds it
    made = []

    class Spy(cli.Decoder):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            made.append(self)

    monkeypatch.setattr(cli, "Decoder", Spy)
    today = tmp_path / "today" / "r.json"  # --tree auto as it is (no tree measured faster): chains, no 'chains' row
    argv = ["bench", "--target", str(ck.path), "--drafter", "auto", "--dataset", "gsm8k", "--max-samples", "1"]
    cli.main([*argv, "--max-new-tokens", "6", "--block-size", "4", "--json-out", str(today), "--no-progress"])
    assert type(made[-1].drafter) is HybridStep and made[-1].drafter.default_block == CPU_BLOCK_SIZE
    assert json.loads(today.read_text())["settings"]["arms"][-1] == "default"
    # --block-arms off: the defaults alone beside plain decoding (a large set's speed; its tau at a block offline)
    made.clear()
    alone = tmp_path / "alone" / "r.json"
    cli.main([*argv, "--max-new-tokens", "6", "--block-arms", "off", "--ngram-arm", "off", "--json-out", str(alone)])
    rep = json.loads(alone.read_text())
    assert rep["settings"]["arms"] == ["default"] and set(rep["table"]["gsm8k"]) == {"default"}
    assert len(made) == 2 and made[0].drafter is None and type(made[1].drafter) is HybridStep  # plain, the defaults
    assert rep["records"][0]["default"]["identical"]
    with pytest.raises(SystemExit, match="^error: no arm to measure against plain decoding"):
        cli.main([*argv, "--block-arms", "off", "--ngram-arm", "off", "--default-arm", "off"])
    with pytest.raises(SystemExit, match="^error: --block-size sets the block arms and the ngram row, both off"):
        cli.main([*argv, "--block-arms", "off", "--ngram-arm", "off", "--block-size", "4"])
    monkeypatch.setattr(speculation, "CPU_TREE_BUDGET", 7)  # a tree measured faster (stage 6's): the 'chains' row
    for spec, block in (("auto", CPU_BLOCK_SIZE), (str(root / "drafter"), None)):
        made.clear()
        out = tmp_path / spec.replace("/", "_") / "r.json"
        argv = ["bench", "--target", str(ck.path), "--drafter", spec, "--dataset", "gsm8k", "--max-samples", "1"]
        argv += ["--max-new-tokens", "6", "--block-size", "4", "--json-out", str(out), "--no-progress"]
        cli.main(argv)
        if spec == "auto":  # --tree auto, a tree measured faster: its 7 nodes on a CPU, then the same chains
            default, chains = made[-2:]
            assert isinstance(default.drafter, TreeStep) and default.tree_size == 7 and default.drafter.skip_drafter
            assert default.block_size == 8 and default.verify_lengths == (1, 2, 4, 8)
            assert json.loads(out.read_text())["settings"]["arms"][-2:] == ["default", "chains"]
        else:  # another drafter: chains (no tree measured faster for it), so no 'chains' row
            chains = made[-1]
        assert type(chains.drafter) is HybridStep and chains.drafter.default_block == block, (spec, chains)
        assert chains.block_size == 8 and chains.verify_lengths == (1, 2, 4, 8)
        assert type(made[1].drafter) is DraftStep and made[1].block_size == 4  # a DFlash row: the drafter alone
        assert json.loads(out.read_text())["records"][0]["default"]["identical"]
        if spec == "auto":  # the same plan asked for by name resumes: records key the plan, not the flag as typed
            records = out.with_name("r.records.jsonl")
            before = records.read_text()
            cli.main([*argv, "--tree", "7"])
            assert records.read_text() == before
            # generate --out keys its answers file the same way: the defaults resume under --tree 7, not --tree 3
            prompts = _write(tmp_path / "p.jsonl", [{"prompt": "t11 t12 t13"}, {"prompt": "t21 t22"}])
            answers = tmp_path / "answers.jsonl"
            gen = ["generate", "--target", str(ck.path), "--drafter", "auto", "--prompts-file", str(prompts)]
            gen += ["--max-new-tokens", "6", "--out", str(answers)]
            cli.main(gen)
            assert isinstance(made[-1].drafter, TreeStep) and made[-1].tree_size == 7
            written = answers.read_text()
            assert [json.loads(x)["index"] for x in written.splitlines()] == [0, 1]
            cli.main([*gen, "--tree", "7"])  # the same plan by name: nothing left to decode, the file unchanged
            assert answers.read_text() == written
            with pytest.raises(SystemExit, match=r"other settings \(plan: "):
                cli.main([*gen, "--tree", "3"])
            assert answers.read_text() == written


def test_paired_arms_compare_prompt_by_prompt():
    """``bench.paired``: the per-prompt ratio of decode speeds (tokens after the first over decode s),
    its mean, one standard error, geometric mean and wins, by hand; the report and its Markdown carry
    default against chains when both were measured, and nothing when one was not."""
    recs = []
    for spec_s, other_s in ((1.0, 2.0), (2.0, 1.0), (1.0, 1.0)):  # 9 tokens after the first each
        r = _rec([4, 1, 2], 2.0, 1.0, 10)
        r["default"] = dict(r["b4"], decode_s=spec_s)
        r["chains"] = dict(r["b4"], decode_s=other_s)
        recs.append(r)
    p = bench.paired(recs, "default", "chains")
    ratios = np.array([2.0, 0.5, 1.0])
    assert p["prompts"] == 3 and p["mean"] == pytest.approx(ratios.mean()) and p["faster"] == 1
    assert p["standard_error"] == pytest.approx(ratios.std(ddof=1) / np.sqrt(3))
    assert p["geometric_mean"] == pytest.approx(1.0)
    rep = bench.report(recs, ["default", "chains"], ["x"])
    assert rep["paired"]["default/chains"]["x"] == p
    assert "| x | 3 | 1.167 +- 0.441 | 1.000 | 1 |" in bench.markdown(rep)
    assert "paired" not in bench.report(recs, ["default"], ["x"])


def test_show_rounds_tables_tau_by_where_a_round_starts(tmp_path):
    """experiments/show_rounds.py: round starts follow the prefill token, and its position table's
    figures are the hand-computed ones (by looping and loop-free answers)."""
    import subprocess
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    import show_rounds

    assert show_rounds.rounds([3, 1, 2]) == [(1, 3), (4, 1), (5, 2)]  # token 0 comes from the prefill
    recs = [
        {
            "dataset": "gsm8k",
            "id": "0",
            "turn": 0,
            "loops": True,
            "output_ids": list(range(8)),
            "b4": {"acceptance_lengths": [2, 1, 4]},
        },  # rounds start at 1, 3, 4
        {
            "dataset": "gsm8k",
            "id": "1",
            "turn": 0,
            "loops": False,
            "output_ids": list(range(7)),
            "b4": {"acceptance_lengths": [3, 3]},
        },
    ]  # rounds start at 1, 4
    acc = show_rounds.by_position(recs, "b4", bucket=4)
    assert acc == {(True, 0): [3, 2], (True, 1): [4, 1], (False, 0): [3, 1], (False, 1): [3, 1]}
    f = tmp_path / "r.records.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in [{"settings": {"block_sizes": [4]}}, *recs]) + '\n{"dataset": "gs')
    script = Path(show_rounds.__file__)
    r = subprocess.run(
        [sys.executable, str(script), str(f), "--block-size", "4", "--bucket", "4"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines() if line.startswith(("│ 0-3", "│ 4-7"))]
    assert [x for x in rows[0] if x != "│"] == [
        "0-3",
        "1.50",
        "(2)",
        "3.00",
        "(1)",
        "2.00",
        "(3)",
    ]  # looping, loop-free, all
    assert [x for x in rows[1] if x != "│"] == ["4-7", "4.00", "(1)", "3.00", "(1)", "3.50", "(2)"]
    r = subprocess.run([sys.executable, str(script), str(f), "--block-size", "16"], capture_output=True, text=True)
    assert r.returncode != 0 and "no speculative records at block size 16" in r.stderr
    r = subprocess.run(
        [sys.executable, str(script), str(f), "--block-size", "4", "--show", "0"], capture_output=True, text=True
    )  # no "identical": the plain tokens may not be the rounds'
    assert r.returncode != 0 and "differs from the plain one" in r.stderr


def test_plot_stages_compares_stages_on_common_turns(tmp_path, capsys):
    """experiments/plot_stages.py: tau is recomputed on the turns every stage's bench has, steps add up
    along each stage's best step, and a stage with another objective or held-out split gets no loss."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    import plot_stages

    data = tmp_path / "data"
    data.mkdir()
    (data / "meta.json").write_text(json.dumps({"settings": {"shard_size": 10}}))

    def stage(name, shards, offsets, val, bench_turns):
        run = tmp_path / name
        run.mkdir()
        cfg = {
            "data": str(data),
            "data_shards": shards,
            "seed": 0,
            "train": {"loss_offsets": offsets, "gamma": 7.0},
            "eval": {"val_size": 4, "val_within_shards": 2},
        }
        (run / "config.json").write_text(json.dumps(cfg))
        (run / "metrics.jsonl").write_text(
            "\n".join(json.dumps({"step": s, "val_loss": v}) for s, v in val) + '\n{"step": 9'
        )  # a line cut by a killed run
        records = [
            {"dataset": "gsm8k", "id": i, "turn": 0, "b4": {"acceptance_lengths": lens}}
            for i, lens in bench_turns.items()
        ]
        bench = tmp_path / f"{name}.json"
        bench.write_text(
            json.dumps({"settings": {"block_sizes": [4], "max_new_tokens": 8, "temperature": 0.0}, "records": records})
        )
        return [str(run), str(bench)]

    one = stage("one", 2, 0, [(5, 4.0), (10, 3.0)], {"0": [1, 1], "1": [4, 4]})  # another objective
    two = stage("two", 3, 8, [(4, 2.5), (8, 2.0), (12, 2.2)], {"0": [2, 4], "1": [3, 3], "2": [1]})  # best: step 8
    three = stage("three", 4, 8, [(6, 1.5)], {"0": [4, 4], "1": [4, 2], "2": [4]})
    png = tmp_path / "stages.png"
    assert plot_stages.main(["--stage", *one, "--stage", *two, "--stage", *three, "--out", str(png)]) == 0
    out = capsys.readouterr().out
    rows = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in out.splitlines()
        if line.startswith("| 1 ") or line.startswith("| 2 ") or line.startswith("| 3 ")
    ]
    # stage, run, shards, training answers, best step, total steps, val loss, tau b4 (turns "0" and "1" only)
    assert rows[0] == ["1", "one", "2", "16", "10", "10", "n/c", "2.50"]
    assert rows[1] == ["2", "two", "3", "26", "8", "18", "2.000", "3.00"]
    assert rows[2] == ["3", "three", "4", "36", "6", "24", "1.500", "3.50"]
    assert "2 turns every stage's bench has" in out and png.stat().st_size > 0
    with pytest.raises(SystemExit, match="different max_new_tokens"):
        b = json.loads(Path(three[1]).read_text())
        b["settings"]["max_new_tokens"] = 16
        Path(three[1]).write_text(json.dumps(b))
        plot_stages.main(["--stage", *two, "--stage", *three, "--out", str(png)])


def test_paper_table_pools_turns_per_temperature_and_picks_the_best_block(tmp_path, capsys):
    """launch/paper_table.py: columns are block 16 and the best block (highest pooled speedup) per
    temperature, a set missing at one temperature shows no figures, and runs of another drafter
    are refused."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launch"))
    import paper_table

    def rec(dataset, plain_s, turn=0, **blocks):
        r = {
            "dataset": dataset,
            "id": "0",
            "turn": turn,
            "loops": False,
            "plain": {"tokens": 11, "decode_s": plain_s, "prefill_s": 0.1, "compile_s": 0.0},
        }
        for b, (decode_s, acc) in blocks.items():
            r[b] = {
                "tokens": 11,
                "decode_s": decode_s,
                "prefill_s": 0.1,
                "compile_s": 0.0,
                "acceptance_lengths": acc,
                "identical": True,
            }
        return r

    def write(name, temperature, block_sizes, records, drafter="d1", cut=False):
        settings = {
            "target": {"name": "t", "sha256": "0"},
            "drafter_sha256": drafter,
            "max_new_tokens": 10,
            "temperature": temperature,
            "block_sizes": block_sizes,
        }
        text = "\n".join(json.dumps(x) for x in [{"settings": settings}, *records]) + "\n"
        (tmp_path / f"{name}.records.jsonl").write_text(text + ('{"dataset": "gs' if cut else ""))

    # plain 10 tok/s everywhere; block 4 pooled 30 tokens / 2.0 s (1.50x) beats block 16's 30 / 2.9 s (1.03x)
    write("t0_gsm8k", 0.0, [4, 16], [rec("gsm8k", 1.0, b4=(0.5, [2, 4, 4]), b16=(0.4, [5, 5]))], cut=True)
    write(
        "t0_mt-bench",
        0.0,
        [4, 16],
        [
            rec("mt-bench", 1.0, b4=(1.0, [1, 1, 4, 4]), b16=(2.0, [10])),
            rec("mt-bench", 1.0, turn=1, b4=(0.5, [4, 4, 2]), b16=(0.5, [10])),
        ],
    )
    write("t1_gsm8k", 1.0, [16], [rec("gsm8k", 2.0, b16=(1.0, [2, 8]))])
    assert paper_table.main([str(tmp_path)]) == 0
    lines = (tmp_path / "paper_table.md").read_text().splitlines()
    assert lines[0].startswith("| prompt set | T=0, block 16: tau | speedup | turns | T=0, best block (4): tau")
    rows = {r[0]: r[1:] for r in ([c.strip() for c in line.strip("|").split("|")] for line in lines[2:6])}
    assert rows["gsm8k"] == ["5.00", "2.50x", "1", "3.33", "2.00x", "1", "5.00", "2.00x", "1"]
    assert rows["mt-bench"] == ["10.00", "0.80x", "2", "2.86", "1.33x", "2", "-", "-", "0"]
    assert rows["mt-bench (first turns)"] == ["10.00", "0.50x", "1", "2.50", "1.00x", "1", "-", "-", "0"]
    assert rows["**all**"] == ["7.50", "1.03x", "3", "3.00", "1.50x", "3", "5.00", "2.00x", "1"]
    text = (tmp_path / "paper_table.md").read_text()
    assert text.count("`identical` is no check here") == 1  # said under the T=1 table only
    assert text.index("Temperature 1") < text.index("`identical` is no check here")
    assert (tmp_path / "paper_table.png").stat().st_size > 0
    assert json.loads((tmp_path / "paper_table.json").read_text())["columns"][1]["block_size"] == 4
    write("t1_mbpp", 1.0, [16], [rec("mbpp", 1.0, b16=(1.0, [10]))], drafter="d2")
    with pytest.raises(SystemExit, match="mixes runs of different targets, drafters"):
        paper_table.main([str(tmp_path)])
