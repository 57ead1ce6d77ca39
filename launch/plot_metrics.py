"""Plot a training run's ``metrics.jsonl`` to a PNG: loss, per-offset accuracy, acceptance length.

    .venv/bin/python launch/plot_metrics.py runs/smollm2_135m/metrics.jsonl --out runs/smollm2_135m/metrics.png

Panels: training loss (and validation loss where logged); accuracy per block offset at the
last logged step (training, and validation if present); the acceptance-length estimates
(``tau_est`` from per-offset accuracies, ``tau_blocks`` from leading correct offsets, and the
real decode ``val_decode_tau``) against the step.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dflash_jax.utils import read_jsonl


def load(path: Path) -> list[dict]:
    rows, skipped = read_jsonl(path)
    if skipped:
        print(f"warning: {path}: {skipped} line(s) not JSON (cut by a kill?); skipped", file=sys.stderr)
    if not rows:
        sys.exit(f"error: {path} holds no metrics")
    return rows


def smooth(xs: list[float], k: int) -> list[float]:
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x
        if i >= k:
            acc -= xs[i - k]
        out.append(acc / min(i + 1, k))
    return out


def plot(rows: list[dict], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    k = max(1, len(rows) // 50)
    fig, ax = plt.subplots(1, 3, figsize=(16, 4.5))
    ax[0].plot(steps, [r["loss"] for r in rows], alpha=0.3, color="C0")
    ax[0].plot(steps, smooth([r["loss"] for r in rows], k), color="C0", label=f"train (mean of {k})")
    val = [r for r in rows if "val_loss" in r]
    if val:
        ax[0].plot([r["step"] for r in val], [r["val_loss"] for r in val], "o-", color="C1", label="validation")
    ax[0].set(
        xlabel="step", ylabel="weighted cross-entropy (log scale)", title="loss", yscale="log"
    )  # the first steps are ~10x the rest
    ax[0].legend()

    last = rows[-1]
    offsets = list(range(1, len(last["acc"]) + 1))
    ax[1].plot(offsets, last["acc"], "o-", label=f"train, step {last['step']}")
    if val:
        ax[1].plot(offsets, val[-1]["val_acc"], "s-", label=f"validation, step {val[-1]['step']}")
    ax[1].set(xlabel="block offset k", ylabel="top-1 accuracy", title="accuracy per offset", ylim=(0, 1))
    ax[1].legend()

    ax[2].plot(steps, smooth([r["tau_est"] for r in rows], k), label="tau from per-offset accuracy")
    ax[2].plot(steps, smooth([r["tau_blocks"] for r in rows], k), label="tau from leading correct offsets")
    dec = [r for r in rows if "val_decode_tau" in r]
    if dec:
        ax[2].plot([r["step"] for r in dec], [r["val_decode_tau"] for r in dec], "o-", label="real decode (validation)")
    ax[2].set(xlabel="step", ylabel="tokens per round", title="acceptance length (tau)")
    ax[2].legend()
    fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("metrics", type=Path, help="metrics.jsonl of a run")
    ap.add_argument("--out", type=Path, default=None, help="PNG path (default: metrics.png beside the log)")
    args = ap.parse_args()
    if not args.metrics.exists():
        sys.exit(f"error: no such file {args.metrics}")
    out = args.out or args.metrics.with_name("metrics.png")
    plot(load(args.metrics), out, str(args.metrics.parent.name))
    print(out)


if __name__ == "__main__":
    main()
