"""How a draft tree's scores should be read: temperature and depth discount, tuned on held-out
training answers (never on the benchmark sets).

The decoder's tree (``DraftStep.tree``) ranks prefixes by the drafter's log-probabilities at its
``tree_temperature`` (1 unless its config says otherwise). A drafter over- or under-confident at depth
wants them tempered, or discounted per depth (its offset-``j`` distribution does not see the tokens
before ``j``). This script measures the greedy tree tau (``study_tree_tau.acceptance``: no decoding,
every budget from one best-first tree) of variants (temperature ``T``, absolute, and log-probability
added per depth ``g``) on target answers the drafter was not trained on (``data/smollm2-mix`` shards
from ``--shard``: the drafter shipped since 2026-12-06, stage 8, saw shards 0-66), and prints tau per
variant and budget. Its ``tree_temperature`` of 1.5 was chosen so (shards 70 and 78; docs/BENCHMARKS.md,
"Draft trees").

    .venv/bin/python experiments/tune_tree_scores.py --shard 70 --count 24 --budgets 16 32 \\
        --variants 1,0 1.3,0 1.5,0 1.7,0 2,0 1,-0.2
"""

from __future__ import annotations

import argparse

import numpy as np
from anchor_acceptance import simulated_rounds
from study_tree_tau import acceptance


def main() -> None:
    from dflash_jax import checkpoint, data
    from dflash_jax.drafter_io import load_drafter, read_draft_vocab, resolve_drafter

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", default="auto")
    ap.add_argument("--data", default="data/smollm2-mix")
    ap.add_argument("--shard", type=int, default=70, help="first sequence: this shard's first")
    ap.add_argument("--count", type=int, default=24, help="sequences")
    ap.add_argument("--budgets", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--variants", nargs="+", default=["1,0", "0.7,0", "1.4,0", "1,-0.2", "1,-0.5"])
    args = ap.parse_args()

    variants = tuple(tuple(float(x) for x in v.split(",")) for v in args.variants)
    if any(g > 0 for _, g in variants):  # a node's own log-probability is capped at 0 (tree.build_tree_with)
        ap.error("a per-depth term must be <= 0 (a bonus would be capped away with the log-probability)")
    ck = checkpoint.load_target("smollm2-135m-instruct")
    folder = resolve_drafter(args.drafter, ck)
    dparams, dcfg, _ = load_drafter(folder)
    vocab = read_draft_vocab(folder)
    ds = data.TokenDataset(args.data)
    first = ds.shard_start(args.shard)
    chains, trees = [], {v: {m: [] for m in args.budgets} for v in variants}
    for i in range(first, first + args.count):
        tokens, mask = (np.asarray(x) for x in ds[i])
        answer = np.flatnonzero(mask)
        full = tokens[: answer[-1] + 1].tolist()
        chain, tree = acceptance(ck, dparams, dcfg, full, int(answer[0]), args.budgets, vocab, variants=variants)
        chains.append(simulated_rounds(np.add(chain, 1)))
        for v in variants:
            for m in args.budgets:
                trees[v][m].append(simulated_rounds(np.add(tree[v][m], 1)))
        print(f"sequence {i}: {len(full) - answer[0]} answer tokens", flush=True)
    tau = lambda rounds: sum(map(sum, rounds)) / max(sum(map(len, rounds)), 1)  # noqa: E731
    print(f"{args.count} held-out answers (shard {args.shard} on); chain tau {tau(chains):.3f}")
    print("| T, per-depth | " + " | ".join(f"tree {m}" for m in args.budgets) + " |")
    print("|---|" + "---|" * len(args.budgets))
    for v in variants:
        print(f"| {v[0]}, {v[1]} | " + " | ".join(f"{tau(trees[v][m]):.3f}" for m in args.budgets) + " |")


if __name__ == "__main__":
    main()
