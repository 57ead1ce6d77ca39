"""Where prompt lookup beats the drafter, anchor by anchor, on recorded plain answers.

For each answer of a bench run's records (first turns), the drafter's acceptance length at every
anchor (``anchor_acceptance.acceptance_at_anchors``, block ``--block``) and prompt lookup's
(``ngram_acceptance.propose``, n = 4 .. 1, ``block - 1`` tokens) at the same anchor. Prints per
set: tau of the rounds each gives alone, of taking the longer of the two each round, of the best
choice of one chain a round (``best_choice_tau``: a bound for any rule that picks one of the two per
round), and of rules that take prompt lookup's chain when its matched run (the common suffix of the
committed tokens and the occurrence it copies) is at least R tokens, or 1-3 tokens with the answer's
own record of short matches at least h (``short_record``). Also how the anchors where lookup accepts
more split by that run. Writes one JSON line per answer to ``--out`` (per-anchor lengths and runs,
keyed by the drafter's weights, the block and the draft vocabulary), so the table can be recomputed
without the models; ``--skip`` leaves out each set's first answers (a held-out split).

    .venv/bin/python experiments/lookup_vs_drafter.py --records docs/bench/tree/tree40.records.jsonl \\
        --sets math500 mt-bench --per-set 40 --drafter dflash_jax/assets/smollm2-135m-instruct-dflash \\
        --draft-vocab 8192 --out runs/lookup_vs_drafter.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from anchor_acceptance import simulated_rounds
from ngram_acceptance import SETS, accepted, first_turns, matched_occurrence
from study_tau import at_block_size, drafter_lengths


def lookup_at_anchors(full: list[int], start: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    """(acceptance length 1..block, matched run in tokens, 0 without a match) of prompt lookup at each
    anchor ``start .. len(full) - 2``."""
    acc, runs = [], []
    for p in range(start, len(full) - 1):
        draft, run = matched_occurrence(full[: p + 1], block - 1)
        acc.append(1 + accepted(draft, full, p))  # at most the anchors left: accepted stops at the answer's end
        runs.append(run)
    return np.asarray(acc), np.asarray(runs)


def tau(rounds: list[int]) -> tuple[int, int]:
    return sum(rounds), len(rounds)


def main() -> None:
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from dflash_jax import checkpoint
    from dflash_jax.bench import drafter_fingerprint
    from dflash_jax.drafter_io import load_drafter, read_draft_vocab

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=Path, required=True, help="one bench run's .records.jsonl or a folder")
    ap.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    ap.add_argument("--per-set", type=int, default=40)
    ap.add_argument("--skip", type=int, default=0, help="leave out each set's first SKIP first turns")
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--drafter", required=True, help="a drafter folder")
    ap.add_argument("--draft-vocab", type=int, default=0, metavar="N")
    ap.add_argument("--out", type=Path, required=True, help="JSON lines, one per answer (resumable)")
    args = ap.parse_args()

    dparams, dcfg, _ = load_drafter(args.drafter)
    vocab = read_draft_vocab(args.drafter)[: args.draft_vocab] if args.draft_vocab else None
    fp = drafter_fingerprint(dparams if vocab is None else {**dparams, "draft_vocab": vocab}, dcfg)
    key = f"{fp}/block{args.block}"
    done = {}
    if args.out.exists():
        for line in args.out.read_text().splitlines():
            r = json.loads(line)
            if r.get("key") == key:  # another drafter's, block's or vocabulary's lengths are not these
                done[(r["set"], r["id"])] = r
    dparams, dcfg = at_block_size(dparams, dcfg, args.block)
    ck = checkpoint.load_target("smollm2-135m-instruct")
    tok = AutoTokenizer.from_pretrained(str(checkpoint.resolve_target("smollm2-135m-instruct")))
    thresholds = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 65)
    for name in args.sets:
        turns = first_turns(args.records, name, tok, args.skip, args.per_set)
        for pid, full, start in tqdm(turns, desc=name, leave=False):
            if (name, pid) in done:
                continue
            a = drafter_lengths(ck, dparams, dcfg, full, start, vocab)
            lk, runs = lookup_at_anchors(full, start, args.block)
            rec = dict(set=name, id=pid, key=key, drafter=a.tolist(), lookup=lk.tolist(), run=runs.tolist())
            done[(name, pid)] = rec
            with args.out.open("a") as f:
                f.write(json.dumps(rec) + "\n")
        recs = [done[(name, pid)] for pid, _, _ in turns if (name, pid) in done]
        if not recs:
            continue
        report(name, recs, thresholds)


def short_record(lookup: np.ndarray, run: np.ndarray, short: int = 3, prior: float = 1.0) -> np.ndarray:
    """Per anchor, the answer's own record of short matches so far: the share of earlier anchors whose
    prompt-lookup match ran 1..``short`` tokens and whose first copied token was right, with ``prior``
    pseudo-counts at 1/2 (causal: anchor ``p`` reads anchors before it, whose next token is committed)."""
    seen = (run >= 1) & (run <= short)
    hits = np.cumsum(seen & (lookup >= 2)) - (seen & (lookup >= 2))
    tries = np.cumsum(seen) - seen
    return (hits + prior / 2) / (tries + prior)


def best_choice_tau(drafter: list[np.ndarray], lookup: list[np.ndarray]) -> float:
    """The highest tau any rule choosing one of the two chains per round can reach on these answers (per
    answer, per-anchor acceptance lengths, each at most the anchors left): fewest rounds to the end,
    ``r[p] = 1 + min(r[p + drafter[p]], r[p + lookup[p]])``, ``r[end] = 0`` (taking the longer chain each
    round is greedy and can lose to it)."""
    tokens = rounds = 0
    for d, lk in zip(drafter, lookup):
        m = len(d)
        r = np.zeros(m + 1, np.int64)
        for p in range(m - 1, -1, -1):
            r[p] = 1 + min(r[p + d[p]], r[p + lk[p]])
        tokens, rounds = tokens + m, rounds + int(r[0])
    return tokens / rounds


def report(name: str, recs: list[dict], thresholds) -> None:
    """Prints the set's tau for the drafter, prompt lookup, the per-anchor best of the two, and rules that
    take prompt lookup's chain by its run (and by the answer's record of short matches)."""
    d = [np.asarray(v["drafter"]) for v in recs]
    lk = [np.asarray(v["lookup"]) for v in recs]
    rn = [np.asarray(v["run"]) for v in recs]

    def t(arrs):
        c, r_ = map(sum, zip(*(tau(simulated_rounds(x)) for x in arrs)))
        return c / r_

    greedy, best = t([np.maximum(x, y) for x, y in zip(d, lk)]), best_choice_tau(d, lk)
    print(
        f"\n{name} ({len(recs)} answers): drafter {t(d):.3f}, lookup {t(lk):.3f}, the longer chain each round "
        f"{greedy:.3f}, the best choice of chains {best:.3f}"
    )
    rules = [f"R={R}: {t([np.where(z >= R, y, x) for x, y, z in zip(d, lk, rn)]):.2f}" for R in thresholds]
    print("  lookup's chain where its run >= R: " + ", ".join(rules))
    rules = []
    for h in (0.0, 0.3, 0.4, 0.5, 0.6, 0.7):
        pick = [(z >= 1) & (z <= 3) & (short_record(y, z) >= h) for y, z in zip(lk, rn)]
        rules.append(f"h={h}: {t([np.where(c, y, x) for x, y, c in zip(d, lk, pick)]):.2f}")
    print("  lookup's chain where its run is 1-3 and the answer's short-match record >= h: " + ", ".join(rules))
    allr, alld, alll = np.concatenate(rn), np.concatenate(d), np.concatenate(lk)
    print("  anchors by run: run bin, anchors, share lookup > drafter, mean length drafter, lookup")
    edges = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)
    for lo, hi in zip(edges, edges[1:] + (99,)):
        m = (allr >= lo) & (allr < hi) if lo else allr == 0
        if m.any():
            share = np.mean(alll[m] > alld[m])
            print(f"   [{lo},{hi}) {m.sum():6d} {share:.2f} {alld[m].mean():.2f} {alll[m].mean():.2f}")


if __name__ == "__main__":
    main()
