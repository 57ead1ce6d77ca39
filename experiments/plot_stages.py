"""How a drafter trained in stages improved: validation loss and measured tau, stage by stage.

Each ``--stage RUN BENCH`` names a training run folder (its ``out_dir``, with ``config.json`` and
``metrics.jsonl``) and the ``dflash-jax bench --json-out`` file measured with the drafter that run
produced (its ``best``). Stages are given oldest first; each continues the one before it through
``init_from`` from its lowest-validation-loss step, so stage ``k`` starts at the sum of the earlier
stages' best steps on the common step axis.

Tau is recomputed from the per-turn records on the turns every bench file has (same dataset, prompt
and turn; greedy turns only, with the same ``max_new_tokens``), so stages measured on different numbers
of prompts are compared on the same ones. Validation losses are plotted only for stages that share
the last stage's objective (``train.loss_offsets``, ``train.gamma``) and held-out answers
(``eval.val_size``, ``seed``, and the shards they are drawn from); the others are listed as not
comparable.

    .venv/bin/python experiments/plot_stages.py --dataset gsm8k \\
        --stage runs/smollm2_v1 docs/bench/interim_v1.json --stage runs/smollm2_v2 docs/bench/interim_v2.json \\
        --out docs/bench/stages.png

Prints a Markdown table (one row per stage) and writes the PNG: validation loss against total
steps (left), and tau per block size against total steps (right; each point labelled with the
number of training answers the stage read).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

from dflash_jax.utils import read_jsonl

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def held_out_split(cfg: dict) -> tuple:
    """What decides a run's held-out answers: seed, val_size and the shard range drawn from."""
    within = cfg["eval"].get("val_within_shards") or cfg.get("data_shards")
    hashable = lambda x: tuple(x) if isinstance(x, list) else x  # noqa: E731  (several data folders)
    return cfg.get("seed"), cfg["eval"].get("val_size"), hashable(within), hashable(cfg.get("data"))


def shard_size(cfg: dict) -> int:
    """Answers per shard of the run's dataset (its first folder's ``meta.json``)."""
    data = cfg["data"]
    meta = Path(data if isinstance(data, str) else data[0]) / "meta.json"
    if not meta.is_file():
        raise SystemExit(f"{meta} not found: the run's dataset must be here to count its answers")
    return int(json.loads(meta.read_text())["settings"]["shard_size"])


def objective(cfg: dict) -> tuple:
    return cfg["train"].get("loss_offsets", 0), cfg["train"].get("gamma")


def stage_taus(benches: list[dict], dataset: str) -> tuple[list[dict[int, float]], int]:
    """Per bench: {block size: tau} over the (dataset, id, turn) keys every bench has."""

    def keys(b):
        return {(r["dataset"], r["id"], r["turn"]) for r in b["records"] if r["dataset"] == dataset}

    common = set.intersection(*(keys(b) for b in benches))
    if not common:
        raise SystemExit(f"no {dataset} turn is in every bench file; measure the stages on the same prompts")
    out = []
    for b in benches:
        taus = {}
        for bs in b["settings"]["block_sizes"]:
            acc = [
                n
                for r in b["records"]
                if (r["dataset"], r["id"], r["turn"]) in common
                for n in r[f"b{bs}"]["acceptance_lengths"]
            ]
            taus[int(bs)] = sum(acc) / len(acc)
        out.append(taus)
    return out, len(common)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--stage",
        nargs=2,
        action="append",
        metavar=("RUN", "BENCH_JSON"),
        required=True,
        help="a training run folder and the bench JSON of its drafter; oldest first, repeatable",
    )
    ap.add_argument("--dataset", default="gsm8k", help="bench dataset whose turns give tau")
    ap.add_argument("--out", default="docs/bench/stages.png", help="PNG to write")
    args = ap.parse_args(argv)

    runs, benches = [], []
    for run, bench in args.stage:
        run = Path(run)
        for need in (run / "config.json", run / "metrics.jsonl", Path(bench)):
            if not need.is_file():
                raise SystemExit(f"{need} not found: --stage takes a run folder (out_dir) and a bench JSON")
        cfg = json.loads((run / "config.json").read_text())
        metrics = read_jsonl(run / "metrics.jsonl")[0]
        val = [(m["step"], m["val_loss"]) for m in metrics if "val_loss" in m]
        if not val:
            raise SystemExit(f"{run}/metrics.jsonl has no validation loss; the run never validated")
        runs.append({"name": run.name, "cfg": cfg, "val": val, "best": min(val, key=lambda v: v[1])})
        b = json.loads(Path(bench).read_text())
        if b["settings"].get("temperature", 0.0) != 0.0:
            raise SystemExit(f"{bench}: measured with sampling; stage tau is compared greedy only")
        benches.append(b)
    new_tokens = {b["settings"]["max_new_tokens"] for b in benches}
    if len(new_tokens) > 1:
        raise SystemExit(f"the bench files use different max_new_tokens {sorted(new_tokens)}; tau depends on it")
    taus, n_turns = stage_taus(benches, args.dataset)
    blocks = sorted(set.intersection(*(set(t) for t in taus)))

    last = runs[-1]["cfg"]  # losses are compared with the newest stage's
    comparable = [
        objective(r["cfg"]) == objective(last) and held_out_split(r["cfg"]) == held_out_split(last) for r in runs
    ]

    offset, rows = 0, []
    fig, (ax_loss, ax_tau) = plt.subplots(1, 2, figsize=(11, 4))
    for i, (r, t) in enumerate(zip(runs, taus)):
        shards = r["cfg"].get("data_shards") or 0
        answers = shards * shard_size(r["cfg"]) - int(r["cfg"]["eval"]["val_size"])
        end = offset + r["best"][0]
        if comparable[i]:
            ax_loss.plot(
                [offset + s for s, _ in r["val"]], [v for _, v in r["val"]], "o-", ms=3, label=f"stage {i + 1}"
            )
        for j, bs in enumerate(blocks):
            ax_tau.plot(end, t[bs], "os^"[j % 3], color=f"C{j}", label=f"block {bs}" if i == 0 else None)
        ax_tau.annotate(
            f"{answers}", (end, t[blocks[-1]]), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8
        )
        rows.append(
            (
                i + 1,
                r["name"],
                shards,
                answers,
                r["best"][0],
                end,
                f"{r['best'][1]:.3f}" if comparable[i] else "n/c",
                *(f"{t[bs]:.2f}" for bs in blocks),
            )
        )
        offset = end
    for j, bs in enumerate(blocks):
        xs = [row[5] for row in rows]
        ax_tau.plot(xs, [t[bs] for t in taus], "-", color=f"C{j}", alpha=0.5)
    ax_loss.set(
        xlabel="total training steps", ylabel="validation loss", title="validation loss (same held-out answers)"
    )
    ax_loss.legend(fontsize=8)
    ax_tau.set(
        xlabel="total training steps (at each stage's shipped step)",
        ylabel="tau",
        title=f"{args.dataset} tau, {n_turns} turns (labels: training answers)",
    )
    ax_tau.legend(fontsize=8)
    ax_tau.margins(x=0.08, y=0.15)
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)

    print(
        f"{args.dataset}: tau over the {n_turns} turns every stage's bench has; "
        f"validation loss n/c = other objective or held-out answers than stage {len(runs)}"
    )
    print(
        "| stage | run | shards | training answers | best step | total steps | val loss | "
        + " | ".join(f"tau b{bs}" for bs in blocks)
        + " |"
    )
    print("|" + "---|" * (7 + len(blocks)))
    for row in rows:
        print("| " + " | ".join(map(str, row)) + " |")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
