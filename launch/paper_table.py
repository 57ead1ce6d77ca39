"""The paper-shape table from ``make bench-full``'s records: tau and speedup per prompt set, at
temperature 0 and 1, at block size 16 and at the best block size (DFlash paper, Tables 1-2 layout).

Reads every ``*.records.jsonl`` in a folder (what ``dflash-jax bench --json-out DIR/NAME.json``
appends to as it measures; its header line holds the run's settings), so it works on a run that is
still going or was interrupted: each cell says how many turns it has. Records from more than one
drafter, target or ``max_new_tokens`` are refused (they would not make one table).

The best block size is chosen per temperature: the block size with the highest speedup over all
measured turns of that temperature (tau and speedup pooled over turns, as ``bench.summarise``
computes them: tau = mean committed tokens per target verify, speedup = DFlash / plain decode
tokens/s). Row ``all`` pools every turn of every set; a set with several turns (MT-Bench) also
gets a row of its first turns alone.

    .venv/bin/python launch/paper_table.py docs/bench/full --out docs/bench/full/paper_table

writes ``paper_table.md`` (the table, then each run's detailed ``bench`` table with loop-free
figures and time to first token), ``paper_table.json`` and ``paper_table.png`` (tau and speedup
per set, one bar per temperature and block size).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dflash_jax import bench
from dflash_jax.errors import BenchError
from dflash_jax.prompts import DATASETS

ORDER = list(DATASETS)


def load_runs(folder: Path) -> dict[float, dict]:
    """``{temperature: {"block_sizes": [...], "records": [...], "files": [...]}}`` from the folder's
    records files (``bench.read_records``: a line cut by a killed run is skipped)."""
    runs: dict[float, dict] = {}
    ident = set()
    files = sorted(folder.glob("*.records.jsonl"))
    if not files:
        raise SystemExit(
            f"no *.records.jsonl in {folder}: run `make bench-full` (or dflash-jax bench "
            f"--json-out {folder}/NAME.json) first"
        )
    for f in files:
        try:
            s, records = bench.read_records(f)
        except BenchError as e:
            raise SystemExit(str(e)) from None
        ident.add(json.dumps([s["target"], s["drafter_sha256"], s["max_new_tokens"]], sort_keys=True))
        run = runs.setdefault(float(s["temperature"]), {"block_sizes": None, "records": [], "files": []})
        blocks = [int(b) for b in s["block_sizes"]]
        if run["block_sizes"] not in (None, blocks):
            raise SystemExit(
                f"{f}: block sizes {blocks}, but another run at temperature {s['temperature']} "
                f"used {run['block_sizes']}; one temperature, one set of block sizes"
            )
        run["block_sizes"] = blocks
        run["records"] += records
        run["files"].append(f)
    if len(ident) > 1:
        raise SystemExit(f"{folder} mixes runs of different targets, drafters or max_new_tokens: {sorted(ident)}")
    return runs


def best_block(run: dict) -> int:
    """The block size with the highest pooled speedup (ties: the larger block)."""
    return max(run["block_sizes"], key=lambda b: (bench.summarise(run["records"], b).get("speedup", 0.0), b))


def table(runs: dict[float, dict]) -> dict:
    """``{"columns": [(T, block, label)], "rows": {dataset: [summary per column]}}``."""
    columns = []
    for t in sorted(runs):
        run = runs[t]
        best = best_block(run)
        if 16 in run["block_sizes"]:
            columns.append((t, 16, "block 16"))
        if best != 16 or 16 not in run["block_sizes"]:
            columns.append((t, best, f"best block ({best})"))
    present = {r["dataset"] for run in runs.values() for r in run["records"]}
    datasets = [d for d in ORDER if d in present] + sorted(present - set(ORDER))
    groups = {d: lambda r, d=d: r["dataset"] == d for d in datasets}
    multi = {r["dataset"] for run in runs.values() for r in run["records"] if r["turn"] > 0}
    for d in [d for d in datasets if d in multi]:  # MT-Bench: first turns alone too (no earlier reply in context)
        groups[f"{d} (first turns)"] = lambda r, d=d: r["dataset"] == d and r["turn"] == 0
    groups["all"] = lambda r: True
    rows = {
        name: [bench.summarise([r for r in runs[t]["records"] if keep(r)], b) for t, b, _ in columns]
        for name, keep in groups.items()
    }
    return {"columns": columns, "rows": rows}


def markdown(tab: dict) -> str:
    cols = tab["columns"]
    head = "| prompt set | " + " | ".join(f"T={t:g}, {label}: tau | speedup | turns" for t, _, label in cols) + " |"
    lines = [head, "|---|" + "---|---|---|" * len(cols)]
    for d, cells in tab["rows"].items():
        parts = []
        for s in cells:
            parts.append(f"{s['tau']:.2f} | {s['speedup']:.2f}x | {s['prompts']}" if s.get("prompts") else "- | - | 0")
        name = "**all**" if d == "all" else d
        lines.append(f"| {name} | " + " | ".join(parts) + " |")
    return "\n".join(lines) + "\n"


def plot(tab: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = list(tab["rows"])
    cols = tab["columns"]
    x = np.arange(len(names))
    width = 0.8 / max(len(cols), 1)
    fig, axes = plt.subplots(1, 2, figsize=(15, 4.5))
    for ax, key, ylabel in ((axes[0], "tau", "tau (tokens per verify)"), (axes[1], "speedup", "speedup over plain")):
        for j, (t, _, label) in enumerate(cols):
            vals = [tab["rows"][d][j].get(key, 0.0) if tab["rows"][d][j].get("prompts") else 0.0 for d in names]
            ax.bar(x + (j - (len(cols) - 1) / 2) * width, vals, width, label=f"T={t:g}, {label}")
        if key == "speedup":
            ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set_xticks(x, [n.replace(" (", "\n(") for n in names])  # "mt-bench\n(first turns)": no overlap
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", alpha=0.3)
        ax.margins(y=0.25)  # room above the bars for the legend
        ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("folder", type=Path, help="folder of bench records (*.records.jsonl)")
    ap.add_argument("--out", type=Path, default=None, help="output prefix (default: FOLDER/paper_table)")
    args = ap.parse_args(argv)
    if not args.folder.is_dir():
        raise SystemExit(f"{args.folder} is not a folder of bench records")
    out = args.out or args.folder / "paper_table"
    runs = load_runs(args.folder)
    tab = table(runs)
    md = [markdown(tab)]
    for t in sorted(runs):  # the detailed tables: loop-free figures, TTFT, identical outputs, every block size
        run = runs[t]
        present = [d for d in ORDER if any(r["dataset"] == d for r in run["records"])]
        note = (
            ""
            if t == 0
            else "Sampled: plain and speculative decoding draw from the same distribution, not the "
            "same tokens, so `identical` is no check here (tests/test_sampling.py tests the distribution).\n\n"
        )
        md.append(
            f"\nTemperature {t:g} ({', '.join(f.name for f in run['files'])}):\n\n"
            + note
            + bench.markdown(bench.report(run["records"], run["block_sizes"], present))
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.md").write_text("".join(md))
    Path(f"{out}.json").write_text(
        json.dumps(
            {
                "columns": [{"temperature": t, "block_size": b, "label": lab} for t, b, lab in tab["columns"]],
                "rows": tab["rows"],
            },
            indent=1,
        )
    )
    plot(tab, Path(f"{out}.png"))
    print("".join(md))
    print(f"wrote {out}.md, {out}.json, {out}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
