"""Which drafting setup should ``--drafter auto`` pick on this machine? Candidates timed side by side.

SmolLM2-135M, greedy, batch 1, 256 new tokens, the first ``--per-set`` first turns of each of the
five benchmark sets (chat template), every candidate with verify lengths ``auto`` (costs measured
on this machine, calibrated), interleaved prompt by prompt so that a slow spell falls on all of
them. Prints tokens per second against plain decoding per set and candidate, and checks that every
output is plain decoding's. Candidates: prompt lookup alone (the CPU default until 2026-12-02); the
shipped drafter alone at blocks 16 and 8 (with its draft vocabulary, or ``--draft-vocab 0``
without); and the shipped drafter beside prompt lookup (``HybridStep``: prompt lookup where the
last ``m`` tokens occurred before, the drafter's forward skipped there) for m = 2, 3 at block 16
and m = 2 at block 8 (the CPU default since 2026-12-02, ``speculation_for``).

    .venv/bin/python experiments/default_candidates.py --per-set 2
    .venv/bin/python experiments/default_candidates.py --per-set 8 --only "prompt lookup" "hybrid m=2 @16"
"""

from __future__ import annotations

import argparse
import sys

SETS = ("gsm8k", "math500", "humaneval", "mbpp", "mt-bench")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-set", type=int, default=2, help="first turns per set")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--draft-vocab", type=int, default=None, help="as dflash-jax generate's (default: the stored list)")
    ap.add_argument("--only", nargs="+", default=None, metavar="NAME", help="time only these candidates (and plain)")
    args = ap.parse_args()

    from dflash_jax import checkpoint, prompts
    from dflash_jax.decode import Decoder
    from dflash_jax.drafter import DraftStep
    from dflash_jax.ngram import HybridStep, NgramStep
    from dflash_jax.speculation import NGRAM_CONFIDENCE, load, make_plan
    from dflash_jax.tokens import encode, stop_ids
    from dflash_jax.utils import enable_compilation_cache

    enable_compilation_cache()
    ck = checkpoint.load_target("smollm2-135m-instruct")
    tok = ck.tokenizer()
    stops = stop_ids(tok)
    shipped = load("auto", ck, tok, draft_vocab=args.draft_vocab)
    params, dcfg = shipped.params, shipped.cfg
    lookup = NgramStep(confidence=NGRAM_CONFIDENCE)
    alone = DraftStep(dcfg, ck.cfg)
    candidates = {
        "plain": Decoder(ck.params, ck.cfg),
        "prompt lookup": Decoder(ck.params, ck.cfg, make_plan(lookup, verify_lengths="auto")),
        "drafter @16": Decoder(ck.params, ck.cfg, make_plan(alone, params, verify_lengths="auto")),
        "drafter @8": Decoder(ck.params, ck.cfg, make_plan(alone, params, block_size=8, verify_lengths="auto")),
    }
    for m, block in ((2, 16), (3, 16), (2, 8)):
        hybrid = HybridStep(alone, NgramStep(4, 1, dcfg.block_size, confidence=NGRAM_CONFIDENCE), m)
        candidates[f"hybrid m={m} @{block}"] = Decoder(
            ck.params, ck.cfg, make_plan(hybrid, params, block_size=block, verify_lengths="auto")
        )
    if args.only:
        unknown = set(args.only) - set(candidates)
        if unknown:
            sys.exit(f"--only: unknown candidates {sorted(unknown)}; choose from {sorted(candidates)}")
        candidates = {k: v for k, v in candidates.items() if k == "plain" or k in args.only}
    items = [(s, p) for s in SETS for p in prompts.load_eval_prompts(s, max_turns=1)[: args.per_set]]
    ids = [encode(tok, p.turns[0], chat=True) for _, p in items]
    for dec in candidates.values():
        dec.generate([ids[0]], 8, stops)  # compile and measure the verify costs before the clock
    seconds = {name: {s: 0.0 for s in SETS} for name in candidates}
    tokens = {s: 0 for s in SETS}
    same = True
    for (s, _), p in zip(items, ids):
        want = None
        for name, dec in candidates.items():
            r = dec.generate([p], args.max_new_tokens, stops)[0]
            want = want or r.token_ids
            same &= r.token_ids == want
            seconds[name][s] += r.decode_s
        tokens[s] += len(want)
        print(".", end="", flush=True)
    print()
    print("| candidate | " + " | ".join(SETS) + " | all |")
    print("|---|" + "---|" * (len(SETS) + 1))
    for name in candidates:
        plain = sum(seconds["plain"].values()) / sum(seconds[name].values())
        cells = [f"{seconds['plain'][s] / seconds[name][s]:.2f}x" for s in SETS]
        print(f"| {name} | " + " | ".join(cells) + f" | {plain:.2f}x |")
    print(f"plain tokens/s {sum(tokens.values()) / sum(seconds['plain'].values()):.1f}; every output plain's: {same}")


if __name__ == "__main__":
    main()
