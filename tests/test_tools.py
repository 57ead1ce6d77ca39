"""The subcommands on what the others leave (dflash_jax.tools): their help, and draft-vocab's counts on
hand-made shards. ship-drafter and plot-run on a trained run: tests/test_train.py; bench-report on a
bench run's records: tests/test_bench.py."""

import json

import numpy as np
import pytest

from dflash_jax.cli import main


@pytest.mark.parametrize("command", ["draft-vocab", "plot-run", "ship-drafter", "bench-report"])
def test_every_tool_subcommand_has_help(command, capsys):
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0 and f"usage: dflash-jax {command}" in capsys.readouterr().out


@pytest.mark.parametrize(
    "command, shown",
    [
        ("generate", ["--tree off|auto|N", "(default: auto)", "(default: 0)"]),  # --tree, --seed
        ("bench", ["(default: gsm8k)", "(default: 2)"]),  # --dataset, --max-turns
        ("demo", ["(default: 192)"]),  # --max-new-tokens
    ],
)
def test_subcommand_help_names_the_defaults(command, shown, capsys):
    """Options with a default worth naming end their help with it (``cli._HelpFormatter``), once."""
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert all(s in out for s in shown), [s for s in shown if s not in out]
    assert "(default: None)" not in out and "(default: False)" not in out and "default: default" not in out


def _shard(folder, answers):
    """A prepare-data shard: each row a 2-token prompt (ids 0, 1) then its answer, loss mask on the answer."""
    folder.mkdir(parents=True)
    tokens = np.concatenate([np.r_[0, 1, a] for a in answers]).astype(np.int32)
    mask = np.concatenate([np.r_[0, 0, np.ones(len(a))] for a in answers]).astype(np.int8)
    np.save(folder / "tokens.npy", tokens)
    np.save(folder / "loss_mask.npy", mask)


def test_draft_vocab_counts_answer_tokens_and_writes_the_most_frequent_first(tmp_path, capsys):
    data = tmp_path / "data"
    _shard(data / "shard_00000", [[5, 5, 9], [2]])  # held out: 5, 5, 9, 2
    _shard(data / "shard_00001", [[5, 7, 7], [7, 5, 3]])  # counted: 7 x3, 5 x2, 3
    main(["draft-vocab", str(data), "--sizes", "1", "2", "8"])
    table = capsys.readouterr().out
    # N=1: token 0 and the most frequent counted token (7) cover nothing held out; 7 is 3 of the 6 counted
    assert "| 1 | 0.000 | 0.000 | 0.500 |" in table
    # N=2: the top 2 (7, 5) cover 5, 5 of the 4 held-out tokens, and 5 of the 6 counted
    assert "| 2 | 0.000 | 0.500 | 0.833 |" in table
    # N=8: ids below 8 and the top 8 (7, 5, 3, then the uncounted 0, 1, 2, 4, 6) both cover 5, 5, 2
    assert "| 8 | 0.750 | 0.750 | 1.000 |" in table

    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text(json.dumps({"vocab_size": 12}))
    main(["draft-vocab", str(data), "--write", str(drafter), "--size", "6"])
    stored = json.loads((drafter / "draft_vocab.json").read_text())
    # counted on every shard: 5 x4, 7 x3, then 2, 3, 9 once (ties in id order), then the uncounted by id
    assert stored["ids"] == [5, 7, 2, 3, 9, 0] and stored["command"].startswith("dflash-jax draft-vocab")
    assert stored["covers"] == 1.0

    for argv, message in [
        (["draft-vocab", str(data / "shard_00000")], "2 or more shards"),
        (["draft-vocab", str(tmp_path / "none")], "no shard_"),
        (["draft-vocab", str(data), "--write", str(tmp_path)], "not a drafter folder"),
        (["draft-vocab", str(data), "--write", str(drafter), "--size", "13"], "has 12 tokens"),
    ]:
        with pytest.raises(SystemExit, match=f"^error: .*{message}"):
            main(argv)


def test_bench_report_refuses_what_is_no_records_file(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps({"tau": 2.0}))  # a report, not its records
    for path, message in [(tmp_path / "none.jsonl", "no such file"), (tmp_path / "r.json", "not a bench records")]:
        with pytest.raises(SystemExit, match=f"^error: .*{message}"):
            main(["bench-report", str(path), "--out", str(tmp_path / "out.json")])
    header = json.dumps({"settings": {"block_sizes": [4]}})
    (tmp_path / "empty.records.jsonl").write_text(header + "\n")
    with pytest.raises(SystemExit, match="^error: .*no measured turns yet"):
        main(["bench-report", str(tmp_path / "empty.records.jsonl"), "--out", str(tmp_path / "out.json")])
