"""Prompt lookup on recorded plain answers, offline: how often its draft tokens are right, by matched
suffix length, and the speed a verify-length policy reaches with a table of round costs.

Reads the plain greedy outputs a bench run recorded (``output_ids`` of ``t0_<set>.records.jsonl``),
re-encodes each first turn's prompt, and walks every answer as the decoding loop would: at each
anchor the prompt-lookup proposal (SPEC "N-gram (prompt-lookup) drafting", written out here in
Python), then as many of its tokens as match the answer. This gives ``drafter_io.NGRAM_CONFIDENCE``
(per matched length n: the first token's acceptance, and each later token's given the earlier
ones) and, for the costs given, the tokens per unit of cost of (a) prompt lookup verifying the
whole block and (b) the policy of ``decode.choose_verify_length`` with those confidences.

    .venv/bin/python launch/ngram_acceptance.py --records docs/bench/full --per-set 40 \\
        --costs 1:1,2:1.57,4:2.3,8:2.55,16:3.78
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dflash_jax import checkpoint, prompts  # noqa: E402
from dflash_jax.tokens import chat_ids  # noqa: E402

SETS = ("gsm8k", "math500", "humaneval", "mbpp", "mt-bench")


def propose(seq: list[int], k: int, nmax: int = 4, nmin: int = 1) -> tuple[list[int], int]:
    """The rule for committed tokens ``seq`` (anchor last): (draft, matched length n; 0: none)."""
    s = len(seq) - 1
    for n in range(nmax, nmin - 1, -1):
        if n > len(seq):
            continue
        suffix = seq[s - n + 1 :]
        for end in range(s - 1, n - 2, -1):
            if seq[end - n + 1 : end + 1] == suffix:
                return seq[end + 1 : end + 1 + k], n
    return [], 0


def walk(full: list[int], start: int, choose, block: int) -> tuple[int, float, dict]:
    """Decode ``full[start + 1:]`` round by round: (tokens, cost, per-n [tried, right] by offset)."""
    tokens, cost, stats = 0, 0.0, defaultdict(lambda: [[0, 0] for _ in range(block - 1)])
    while start < len(full) - 1:
        draft, n = propose(full[: start + 1], block - 1)
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
    ap.add_argument("--records", type=Path, default=Path("docs/bench/full"), help="folder of t0_<set>.records.jsonl")
    ap.add_argument("--per-set", type=int, default=40, help="first turns per set")
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--costs", default="1:1,2:1.57,4:2.3,8:2.55,16:3.78", help="verify length:cost in plain steps")
    args = ap.parse_args()
    costs = {int(a): float(b) for a, b in (x.split(":") for x in args.costs.split(","))}
    from transformers import AutoTokenizer

    folder = checkpoint.resolve_target("smollm2-135m-instruct")
    tok = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
    answers = []
    for name in SETS:
        items = {p.id: p for p in prompts.load_eval_prompts(name, max_turns=1)}
        rows = [json.loads(line) for line in (args.records / f"t0_{name}.records.jsonl").read_text().splitlines()[1:]]
        rows = [r for r in rows if r["turn"] == 0 and r["id"] in items][: args.per_set]
        for r in rows:
            ids = chat_ids(tok, [{"role": "user", "content": items[r["id"]].turns[0]}])
            answers.append((name, ids + r["output_ids"], len(ids)))

    # 1. acceptance by matched length, every proposed token verified
    total = defaultdict(lambda: [[0, 0] for _ in range(args.block - 1)])
    for _, full, start in answers:
        for n, rows in walk(full, start, lambda n, num: (args.block, 0.0), args.block)[2].items():
            for k, (tried, right) in enumerate(rows):
                total[n][k][0] += tried
                total[n][k][1] += right
    table = {}
    print(f"{len(answers)} answers; acceptance of the k-th proposed token given the earlier ones were right:")
    for n in sorted(total):
        rate = [right / tried if tried else 0.0 for tried, right in total[n]]
        later = sum(r for t, r in total[n][1:]) / max(sum(t for t, _ in total[n][1:]), 1)
        table[n] = (round(rate[0], 2), round(later, 2))
        print(
            f"  matched n={n}: drafts {total[n][0][0]}, first {rate[0]:.2f}, later {later:.2f}, by offset "
            f"{[round(x, 2) for x in rate[:8]]}"
        )

    # 2. the policy against verifying the whole block, at these costs
    def policy(n, num):
        best, length = 1.0, 1
        for L, c in costs.items():
            e, p = 1.0, 1.0
            for k in range(min(L - 1, num)):
                p *= table[n][0] if k == 0 else table[n][1]
                e += p
            if e / c > best + 1e-9:
                best, length = e / c, L
        return length, costs[length]

    print(f"tokens per plain-step cost (costs {costs}):")
    for name in SETS:
        mine = [a for a in answers if a[0] == name]
        whole = [walk(f, s, lambda n, num: (args.block, costs[args.block]), args.block)[:2] for _, f, s in mine]
        chosen = [walk(f, s, policy, args.block)[:2] for _, f, s in mine]
        tw, cw = map(sum, zip(*whole))
        tc, cc = map(sum, zip(*chosen))
        print(f"  {name:10s} whole block {tw / cw:.2f}x   policy {tc / cc:.2f}x")


if __name__ == "__main__":
    main()
