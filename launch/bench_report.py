"""A ``dflash-jax bench`` report written again from its records: one table over several runs.

``bench`` keeps every measured turn in the ``.records.jsonl`` beside its ``--json-out`` and a rerun
with the same settings measures only the turns missing, but its report covers only the prompts of
the last invocation. This reads the records file as it is (a run still going or interrupted
included) and writes the report over all of them: the JSON, the Markdown table and the two plots,
as ``bench`` does (``bench.report``, ``bench.write_outputs``), with the arms of the run's settings
and the sets in the records (in ``bench``'s order). Issue 20's table is 100 prompts of GSM8K,
MATH-500 and MBPP, all MT-Bench first turns and all of HumanEval, two ``bench`` invocations into
one records file (``--max-samples 100`` for the five sets, then ``--dataset humaneval``):

    .venv/bin/python launch/bench_report.py docs/bench/issue20/table100.records.jsonl \\
        --out docs/bench/issue20/table100.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dflash_jax import bench  # noqa: E402
from dflash_jax.cli import BENCH_DATASETS  # noqa: E402


def write(records_path: Path, out: Path) -> dict:
    """Read ``records_path``, write the report to ``out`` (and ``.md``, plots beside); returns it.

    Raises:
      BenchError: not a bench records file; SystemExit: it holds no records yet.
    """
    settings, records = bench.read_records(records_path)
    # one record per turn, the last written (bench measures a turn again if its prompt's text changed)
    records = list({(r["dataset"], r["id"], r["turn"]): r for r in records}.values())
    if not records:
        raise SystemExit(f"{records_path}: no measured turns yet")
    arms = [int(a) if str(a).isdigit() else a for a in settings.get("arms", settings["block_sizes"])]
    present = {r["dataset"] for r in records}
    datasets = [d for d in BENCH_DATASETS if d in present] + sorted(present - set(BENCH_DATASETS))
    rep = bench.report(records, arms, datasets)
    bench.write_outputs(rep, records, settings, out)
    return rep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("records", type=Path, help="a bench run's .records.jsonl")
    ap.add_argument("--out", type=Path, required=True, help="the report's JSON (the .md and plots go beside it)")
    args = ap.parse_args()
    rep = write(args.records, args.out)
    print(bench.markdown(rep))


if __name__ == "__main__":
    main()
