"""Speculation plans side by side in the real loop: ms per round, tau, verify widths and speed over plain decoding.

Each prompt is decoded by plain decoding and then by every plan in turn (interleaved, so a slow spell
of the machine falls on all of them alike), greedy, batch 1, 256 new tokens, first turns; every output
must equal plain decoding's (the script stops at the first that does not). A plan is written
``KIND:N[:COSTS]``:

- ``default:N``: what ``generate`` does with ``--tree N`` (``0``: chains, ``--tree off``; ``auto``:
  ``--tree auto``, the default); ``COSTS`` (comma-separated) replace the measured verify costs;
- ``chain:W``: the shipped drafter alone at block 8, every round verifying ``W`` positions;
- ``tree:W`` / ``treel:W``: its tree of ``W - 1`` nodes, every node verified, alone / with prompt
  lookup's branches in every row's tree;
- ``treela:W[:COSTS]``: as ``treel``, each row verifying its best nodes that pay (widths up to ``W``);
- ``block:B[:COSTS]``: the defaults' chains (the shipped drafter beside prompt lookup, verify lengths auto)
  at block ``B`` instead of ``speculation.CPU_BLOCK_SIZE``;
- ``lengths:L1,L2,..[:COSTS]``: the defaults' chains verifying one of these lengths a round (the block the
  longest) instead of ``AUTO_VERIFY_LENGTHS`` up to ``speculation.CPU_BLOCK_SIZE``;
- ``hybrid:B:D``: those chains at block ``B`` with the drafter drafting at block ``D`` (``HybridStep.drafter_block``):
  prompt-lookup rows copy up to ``B - 1`` tokens, the drafter's rows hold ``D - 1``.

    .venv/bin/python experiments/compare_plans.py --sets gsm8k math500 humaneval mbpp mt-bench \\
        --per-set 6 default:0 default:7
"""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict

import numpy as np


def make(kind: str, n: str, rest: list[str], ck, tok, dr):
    from dflash_jax import speculation

    costs = [float(c) for c in rest[0].split(",")] if rest else None
    if kind == "default":
        tree = "off" if n == "0" else n
        return speculation.plan_for(ck, dr, tok, tree=tree, verify_costs=costs)
    if kind == "lengths":
        lengths = [int(x) for x in n.split(",")]
        return speculation.plan_for(
            ck, dr, tok, tree="off", block_size=max(lengths), verify_lengths=lengths, verify_costs=costs
        )
    w = int(n)
    if kind == "chain":
        return speculation.plan_for(ck, dr, tok, prompt_lookup=False, block_size=8, verify_lengths=[w], tree="off")
    if kind in ("tree", "treel"):
        lookup = kind == "treel"
        return speculation.plan_for(
            ck, dr, tok, prompt_lookup=lookup, block_size=8, tree=w - 1, verify_lengths=None, skip_drafter=False
        )
    if kind == "treela":
        return speculation.plan_for(
            ck, dr, tok, prompt_lookup=True, block_size=8, tree=w - 1, skip_drafter=False, verify_costs=costs
        )
    if kind == "block":
        return speculation.plan_for(ck, dr, tok, tree="off", block_size=w, verify_costs=costs)
    if kind == "hybrid":
        import dataclasses

        if len(rest) != 1:
            raise SystemExit(f"error: hybrid:{n}: give the drafter's block too, hybrid:B:D (no costs)")
        plan = speculation.plan_for(ck, dr, tok, tree="off", block_size=w)
        return dataclasses.replace(plan, step=dataclasses.replace(plan.step, drafter_block=int(rest[0])))
    raise SystemExit(f"error: unknown plan kind {kind!r} (default, chain, tree, treel, treela, block, lengths, hybrid)")


def main() -> None:
    from dflash_jax import checkpoint, prompts, speculation, tokens
    from dflash_jax.decode import Decoder

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plans", nargs="+", help="KIND:N[:COSTS], see the module docstring")
    ap.add_argument("--sets", nargs="+", default=["gsm8k", "mbpp", "mt-bench"])
    ap.add_argument("--per-set", type=int, default=3)
    ap.add_argument("--skip", type=int, default=0, help="start after this many prompts of each set")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    args = ap.parse_args()
    ck = checkpoint.load_target("smollm2-135m-instruct")
    tok = ck.tokenizer()
    dr = speculation.load("auto", ck, tok)
    decoders = {"plain": Decoder(ck.params, ck.cfg)}
    for spec in args.plans:
        kind, n, *rest = spec.split(":")
        decoders[spec] = Decoder(ck.params, ck.cfg, make(kind, n, rest, ck, tok, dr))
    items = [p for d in args.sets for p in prompts.load_eval_prompts(d, None, args.skip + args.per_set, 1)[args.skip :]]
    stops = tokens.stop_ids(tok)
    stats = defaultdict(lambda: [0.0, 0, 0, Counter()])  # (plan, set) -> seconds, rounds, tokens, verify widths
    seconds = defaultdict(list)  # plan -> decode seconds per prompt, in the prompts' order
    for item in items:
        ids = tokens.chat_ids(tok, [{"role": "user", "content": item.turns[0]}])
        want = None
        for name, dec in decoders.items():
            r = dec.generate([ids], args.max_new_tokens, stops)[0]
            want = r.token_ids if want is None else want
            if r.token_ids != want:
                raise SystemExit(f"error: {name} differs from plain decoding on {item.dataset} {item.id}")
            seconds[name].append(r.decode_s)
            for key in ((name, item.dataset), (name, "all")):
                s = stats[key]
                s[0], s[1], s[2] = s[0] + r.decode_s, s[1] + len(r.acceptance_lengths), s[2] + sum(r.acceptance_lengths)
                s[3].update(r.verify_widths)
    for d in args.sets + ["all"]:
        base = stats["plain", d][2] / stats["plain", d][0]
        print(f"\n{d} ({sum(i.dataset == d for i in items) if d != 'all' else len(items)} prompts)")
        print("| plan | ms per round | tau | mean verify width | rounds by width | tokens/s | over plain |")
        print("|---|---|---|---|---|---|---|")
        for name in decoders:
            t, rounds, toks, widths = stats[name, d]
            speed, mean_width = toks / t, sum(w * n for w, n in widths.items()) / rounds
            by_width = ", ".join(f"{w}: {n}" for w, n in sorted(widths.items()))
            print(
                f"| {name} | {1e3 * t / rounds:.1f} | {toks / rounds:.2f} | {mean_width:.2f} | {by_width} | "
                f"{speed:.1f} | {speed / base:.2f}x |"
            )
    first, *others = [n for n in decoders if n != "plain"]
    for name in others:  # paired by prompt: the same answers, so only the time differs
        ratio = np.asarray(seconds[first]) / np.asarray(seconds[name])
        se = ratio.std(ddof=1) / np.sqrt(len(ratio)) if len(ratio) > 1 else float("nan")
        print(f"\n{name} against {first}, speed per prompt: {ratio.mean():.3f} +- {se:.3f} ({len(ratio)} prompts)")


if __name__ == "__main__":
    main()
