"""How much of the target's answers a drafter head over a few thousand tokens would cover.

The groundwork of a draft vocabulary (docs/BENCHMARKS.md, "Where a DFlash 2 round's time goes": the
LM head over all 49152 tokens is two thirds of the shipped drafter's forward on a CPU). Reads the
answer tokens (``loss_mask``) of a ``prepare-data`` folder's shards and reports, for each size N, the
share of answer tokens among (a) the first N token ids (BPE merge order) and (b) the N most frequent
answer tokens counted on every shard but the first, measured on the first (held out, so the figure
is what a vocabulary chosen from training answers would cover on new ones).

With ``--write DRAFTER`` it also stores the ``--size`` most frequent answer tokens, counted on every
shard, most frequent first (then, past the tokens ever counted, the others in token-id order), as
that drafter's draft vocabulary (``draft_vocab.json``, read by
``dflash-jax generate`` / ``bench`` / ``demo``; ``--draft-vocab N`` takes its first N).

    .venv/bin/python launch/draft_vocab.py data/smollm2-mix --sizes 2048 4096 8192 16384
    .venv/bin/python launch/draft_vocab.py data/smollm2-mix --write dflash_jax/assets/smollm2-135m-instruct-dflash \\
        --size 16384
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from dflash_jax.drafter_io import write_draft_vocab


def answer_tokens(shard: Path) -> np.ndarray:
    """The answer tokens of one shard (``tokens`` where ``loss_mask``), int64 ``[n]``."""
    tokens, mask = np.load(shard / "tokens.npy").ravel(), np.load(shard / "loss_mask.npy").ravel()
    if tokens.shape != mask.shape:
        raise SystemExit(f"{shard}: tokens.npy and loss_mask.npy differ in size; remake the shard")
    return tokens[mask.astype(bool)].astype(np.int64)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", type=Path, help="a prepare-data folder (shard_*/ or itself tokens.npy, loss_mask.npy)")
    ap.add_argument("--sizes", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
    ap.add_argument("--write", type=Path, metavar="DRAFTER", help="store a draft vocabulary with this drafter folder")
    ap.add_argument("--size", type=int, default=16384, help="how many tokens --write stores (default 16384)")
    args = ap.parse_args()
    shards = sorted(args.data.glob("shard_*")) or ([args.data] if (args.data / "tokens.npy").exists() else [])
    if len(shards) < (1 if args.write else 2):
        raise SystemExit(f"{args.data}: need 2 or more shards (the first is held out), found {len(shards)}")
    answers = [answer_tokens(s) for s in shards]
    if len(shards) > 1:  # the coverage table: counted on shards 1.., measured on shard 0
        held, train = answers[0], np.concatenate(answers[1:])
        by_count = np.argsort(-np.bincount(train), kind="stable")
        print(f"answer tokens: {train.size} counted on shards 1..{len(shards) - 1}, {held.size} held out (shard 0)")
        print("| N | first N ids | N most frequent (held out) | N most frequent (in sample) |")
        print("|---|---|---|---|")
        for n in args.sizes:
            top = by_count[:n]
            shares = (np.mean(held < n), np.mean(np.isin(held, top)), np.mean(np.isin(train, top)))
            print(f"| {n} | " + " | ".join(f"{x:.3f}" for x in shares) + " |")
    if args.write:
        config = args.write / "config.json"
        vocab = json.loads(config.read_text()).get("vocab_size", 0) if config.is_file() else 0
        if not vocab:
            raise SystemExit(f"--write {args.write}: not a drafter folder (no config.json with vocab_size)")
        if args.size > vocab:
            raise SystemExit(f"--size {args.size}: the drafter's vocabulary has {vocab} tokens; pass at most that")
        counts = np.bincount(np.concatenate(answers), minlength=vocab)[:vocab]
        # the counted tokens by count, then (past the tokens ever counted) the rest in token-id order,
        # which is BPE merge order: a rough frequency order of the tokenizer's own corpus
        ids = np.argsort(-counts, kind="stable")[: args.size]
        path = write_draft_vocab(
            args.write,
            ids.tolist(),
            counted_on=f"{args.data}: answer tokens of {len(shards)} shards ({counts.sum()} tokens)",
            covers=float(counts[ids].sum() / counts.sum()),
            command="python launch/draft_vocab.py " + " ".join(map(str, sys.argv[1:])),
        )
        print(f"wrote {path}: {len(ids)} tokens, {counts[ids].sum() / counts.sum():.3f} of the counted answer tokens")


if __name__ == "__main__":
    main()
