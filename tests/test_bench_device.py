"""launch/bench_device.py (the accelerator round-cost script) at tiny shapes on CPU: every arm runs,
is token-identical to plain decoding, and the oracle drafter's rounds commit whole blocks."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launch"))

import bench_device  # noqa: E402


def test_bench_device_runs_every_arm_at_tiny_shapes(tmp_path):
    rep = bench_device.main(
        [
            "--shape",
            "tiny",
            "--dtype",
            "float32",
            "--prompt-len",
            "16",
            "--new-tokens",
            "33",
            "--verify-lengths",
            "1,4",
            "--trees",
            "4,8",
            "--out",
            str(tmp_path / "r.json"),
        ]
    )
    rows = {r["arm"]: r for r in rep["rows"]}
    assert len(rows) == 1 + 4 + 1 + 1 + 2 and all(r["identical"] for r in rows.values())
    assert rows["DFlash random drafter, tree of 8"]["round_cost"] > 0  # a tree round, timed
    assert rows["oracle, block 8"]["tau"] > 6 and rows["oracle, block 16"]["tau"] > 10  # whole blocks accepted
    assert rows["oracle, block 16, verify lengths 1,4"]["tau"] > 10  # equal costs: the longest verify pays
    assert all(r["ms_per_round"] > 0 and r["round_cost"] > 0 for r in rows.values())
    assert (tmp_path / "r.json").stat().st_size > 0 and "| plain |" in rep["table"]
