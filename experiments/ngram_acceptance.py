"""Prompt lookup on recorded plain answers, offline: how often its draft tokens are right, by matched
suffix length, and the speed a verify-length policy reaches with a table of round costs.

Reads the plain greedy outputs a bench run recorded (``output_ids`` of ``t0_<set>.records.jsonl``),
re-encodes each first turn's prompt, and walks every answer as the decoding loop would: at each
anchor the prompt-lookup proposal (SPEC "N-gram (prompt-lookup) drafting", written out here in
Python), then as many of its tokens as match the answer. This gives ``drafter_io.NGRAM_CONFIDENCE``
(per matched length n: the first token's acceptance, and each later token's given the earlier
ones), the same by the full length over which the occurrence matches (up to 64 tokens), and, for
the costs given, the tokens per unit of cost of prompt lookup (a) verifying the whole block, (b)
under the policy of ``decode.choose_verify_length`` with either table, and (c) with the verify
length an oracle that knows the acceptance would choose (a bound on any policy).

    .venv/bin/python experiments/ngram_acceptance.py --records docs/bench/full --per-set 40 \\
        --costs 1:1,2:1.57,4:2.3,8:2.55,16:3.78
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from dflash_jax import checkpoint, prompts
from dflash_jax.tokens import chat_ids

SETS = ("gsm8k", "math500", "humaneval", "mbpp", "mt-bench")


def recorded_answers(records: Path, name: str) -> list[dict]:
    """The plain answers a bench run recorded for set ``name``, in its order: ``records`` is a folder of
    ``t0_<set>.records.jsonl`` (``make bench-full``) or one run's ``.records.jsonl`` with every set (``bench
    --dataset all``); either way the first line is the run's settings."""
    path = records if records.is_file() else records / f"t0_{name}.records.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()[1:]]
    return [r for r in rows if r.get("dataset", name) == name]


def first_turns(records: Path, name: str, tok, skip: int = 0, count: int = 20) -> list[tuple[str, list[int], int]]:
    """Set ``name``'s recorded first turns ``skip .. skip + count`` (``recorded_answers``, in the run's order):
    ``(prompt id, prompt + answer token ids, index of the first answer token)``, the prompt re-encoded
    with the target's chat template."""
    items = {p.id: p for p in prompts.load_eval_prompts(name, max_turns=1)}
    rows = [r for r in recorded_answers(records, name) if r["turn"] == 0 and r["id"] in items][skip : skip + count]
    out = []
    for r in rows:
        ids = chat_ids(tok, [{"role": "user", "content": items[r["id"]].turns[0]}])
        out.append((r["id"], ids + r["output_ids"], len(ids)))
    return out


def propose(seq: list[int], k: int, nmax: int = 4, nmin: int = 1) -> tuple[list[int], int]:
    """The rule for committed tokens ``seq`` (anchor last): (draft, matched length n; 0: none)."""
    draft, n, _ = _match(seq, k, nmax, nmin)
    return draft, n


def _match(seq: list[int], k: int, nmax: int, nmin: int) -> tuple[list[int], int, int]:
    """``propose`` plus where the matched occurrence ends (-1: no match)."""
    s = len(seq) - 1
    for n in range(nmax, nmin - 1, -1):
        if n > len(seq):
            continue
        suffix = seq[s - n + 1 :]
        for end in range(s - 1, n - 2, -1):
            if seq[end - n + 1 : end + 1] == suffix:
                return seq[end + 1 : end + 1 + k], n, end
    return [], 0, -1


RUN_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)  # upper ends of the full-match-length bins


def matched_occurrence(seq: list[int], k: int, cap: int = 64) -> tuple[list[int], int]:
    """``propose(seq, k)``'s draft (n = 4 .. 1) and the full length, up to ``cap``, of the common suffix of
    the committed tokens and the occurrence that matched (0: no match). The rule matches at most 4 tokens;
    in a loop the occurrence agrees much further back."""
    draft, n, end = _match(seq, k, 4, 1)
    if not n:
        return draft, 0
    s, run = len(seq) - 1, 0
    while run < cap and end - run >= 0 and seq[end - run] == seq[s - run]:
        run += 1
    return draft, run


def matched_run(seq: list[int], k: int, cap: int = 64) -> tuple[list[int], int]:
    """``matched_occurrence`` with the length as its bin (``RUN_BUCKETS``; 0: no match)."""
    draft, run = matched_occurrence(seq, k, cap)
    return draft, next(b for b in RUN_BUCKETS if run <= b) if run else 0


def accepted(draft: list[int], full: list[int], pos: int) -> int:
    """How many leading tokens of ``draft`` the answer ``full`` confirms after position ``pos``: at
    most up to ``full``'s last token but one (the round then ends with the target's own token)."""
    a = 0
    while a < min(len(draft), len(full) - 2 - pos) and draft[a] == full[pos + 1 + a]:
        a += 1
    return a


def walk(full: list[int], start: int, choose, block: int, key=propose) -> tuple[int, float, dict]:
    """Decode ``full[start + 1:]`` round by round: (tokens, cost, per-key [tried, right] by offset);
    ``key(seq, k)`` gives the draft and what the statistics and ``choose`` are keyed by (the matched
    length ``n`` by default)."""
    tokens, cost, stats = 0, 0.0, defaultdict(lambda: [[0, 0] for _ in range(block - 1)])
    while start < len(full) - 1:
        draft, n = key(full[: start + 1], block - 1)
        length, c = choose(n, len(draft))
        a = 0
        for k, (d, t) in enumerate(zip(draft[: length - 1], full[start + 1 :])):
            stats[n][k][0] += 1
            if d != t:
                break
            stats[n][k][1] += 1
            a += 1
        a = min(a, len(full) - 2 - start)
        tokens, cost, start = tokens + a + 1, cost + c, start + a + 1
    return tokens, cost, stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--records",
        type=Path,
        default=Path("docs/bench/full"),
        help="folder of t0_<set>.records.jsonl, or one bench run's .records.jsonl holding every set",
    )
    ap.add_argument("--per-set", type=int, default=40, help="first turns per set")
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--costs", default="1:1,2:1.57,4:2.3,8:2.55,16:3.78", help="verify length:cost in plain steps")
    args = ap.parse_args()
    costs = {int(a): float(b) for a, b in (x.split(":") for x in args.costs.split(","))}
    if args.block not in costs:
        sys.exit(f"--costs {args.costs}: give the cost of the whole block too ({args.block}:...), or pass --block")
    from transformers import AutoTokenizer

    folder = checkpoint.resolve_target("smollm2-135m-instruct")
    tok = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
    answers = [
        (name, full, start) for name in SETS for _, full, start in first_turns(args.records, name, tok, 0, args.per_set)
    ]

    # 1. acceptance by matched length n (the rule's, up to 4) and by the full matched length (its
    # bin, up to 64), every proposed token verified; 2. the policy with each table, the whole block,
    # and a verify length chosen by an oracle that knows the acceptance, at these costs
    tables = {}
    for label, key in (("matched n", propose), ("full matched length <=", matched_run)):
        total = defaultdict(lambda: [[0, 0] for _ in range(args.block - 1)])
        for _, full, start in answers:
            for n, rows in walk(full, start, lambda n, num: (args.block, 0.0), args.block, key)[2].items():
                for k, (tried, right) in enumerate(rows):
                    total[n][k][0] += tried
                    total[n][k][1] += right
        table = tables[label] = {}
        print(f"{len(answers)} answers; acceptance of the k-th proposed token given the earlier ones were right:")
        for n in sorted(total):
            rate = [right / tried if tried else 0.0 for tried, right in total[n]]
            later = sum(r for t, r in total[n][1:]) / max(sum(t for t, _ in total[n][1:]), 1)
            table[n] = (round(rate[0], 2), round(later, 2))
            print(
                f"  {label} {n}: drafts {total[n][0][0]}, first {rate[0]:.2f}, later {later:.2f}, by offset "
                f"{[round(x, 2) for x in rate[:8]]}"
            )

    def policy(table):
        def choose(n, num):
            best, length = 1.0, 1
            for L, c in costs.items():
                e, p = 1.0, 1.0
                for k in range(min(L - 1, num)):
                    p *= table[n][0] if k == 0 else table[n][1]
                    e += p
                if e / c > best + 1e-9:
                    best, length = e / c, L
            return length, costs[length]

        return choose

    def oracle(full, start):
        tokens, cost = 0, 0.0
        while start < len(full) - 1:
            a = accepted(propose(full[: start + 1], args.block - 1)[0], full, start)
            length = max(costs, key=lambda L: (min(a, L - 1) + 1) / costs[L])
            got = min(a, length - 1) + 1  # the accepted tokens it verified, and the target's own
            tokens, cost, start = tokens + got, cost + costs[length], start + got
        return tokens, cost

    print(f"tokens per plain-step cost (costs {costs}):")
    for name in SETS:
        mine = [a for a in answers if a[0] == name]
        runs = {
            "whole block": [walk(f, s, lambda n, num: (args.block, costs[args.block]), args.block) for _, f, s in mine],
            "policy (n)": [walk(f, s, policy(tables["matched n"]), args.block) for _, f, s in mine],
            "policy (full length)": [
                walk(f, s, policy(tables["full matched length <="]), args.block, matched_run) for _, f, s in mine
            ],
            "oracle length": [oracle(f, s) for _, f, s in mine],
        }
        cells = [f"{k} {sum(r[0] for r in v) / sum(r[1] for r in v):.2f}x" for k, v in runs.items()]
        print(f"  {name:10s} " + "   ".join(cells))


if __name__ == "__main__":
    main()
