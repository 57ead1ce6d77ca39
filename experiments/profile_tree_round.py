"""Where a tree round's time goes, against a chain round: each piece jitted alone, batch 1.

On the embedded SmolLM2-135M with the shipped drafter (a DFlash 2 drafter over its draft vocabulary):
the drafter's chain proposal (its selector walk) and its tree, the tree's sort and mask, the
target's verify of a 16-token chain and of a 16-node tree (with its anchor), the accept walk, moving
the accepted path's keys and values into place, and writing the drafter's context. Milliseconds,
the mean of 10 runs after a warm-up.

    .venv/bin/python experiments/profile_tree_round.py --budget 16
    .venv/bin/python experiments/profile_tree_round.py --budget 7 --chain-length 8  # equal widths
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp


def timed(fn, *args, repeats: int = 10) -> float:
    fn = jax.jit(fn)
    jax.block_until_ready(fn(*args))
    t0 = time.perf_counter()
    for _ in range(repeats):
        jax.block_until_ready(fn(*args))
    return (time.perf_counter() - t0) / repeats * 1e3


def main() -> None:
    from dflash_jax import checkpoint, speculation
    from dflash_jax.decode import verify_block, verify_tree
    from dflash_jax.sampling import GREEDY
    from dflash_jax.target import compact_cache, init_cache
    from dflash_jax.tree import accept_walk, ancestor_mask, sort_tree

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=int, default=16, help="tree nodes")
    ap.add_argument("--cache-len", type=int, default=768)
    ap.add_argument("--chain-length", type=int, help="the chain verify's tokens (default: the drafter's block)")
    args = ap.parse_args()
    ck = checkpoint.load_target("smollm2-135m-instruct")
    plan = speculation.plan_for(ck, "auto", ck.tokenizer(), prompt_lookup=False, tree=args.budget, verify_lengths=None)
    step, dp, b, s = plan.step, plan.params, 1, args.cache_len
    bs = step.max_block_size
    chain = args.chain_length or bs
    cache, dcache = init_cache(ck.cfg, b, s), step.init_cache(b, s)
    tokens = jnp.zeros((b, s + bs), jnp.int32)
    start, anchor, valid = jnp.full((b,), 200, jnp.int32), jnp.ones((b,), jnp.int32), jnp.full((b,), bs, jnp.int32)
    draft = dict(tokens=tokens, key=None, sampling=GREEDY)
    tree = step.propose(dp, ck.params, dcache, anchor, start, valid, bs, **draft).tree
    taps = step.tap_layers
    rows = {
        "drafter: chain (DraftStep.propose)": timed(
            lambda: step.dflash.propose(dp, ck.params, dcache, anchor, start, valid, bs, **draft)
        ),
        f"drafter: tree of {args.budget} (TreeStep.propose)": timed(
            lambda: step.propose(dp, ck.params, dcache, anchor, start, valid, bs, **draft)
        ),
        "sort_tree": timed(sort_tree, tree),
        "ancestor_mask": timed(ancestor_mask, tree),
        f"target: verify a chain of {chain}": timed(
            lambda c: verify_block(ck.params, jnp.zeros((b, chain), jnp.int32), start, c, chain, cfg=ck.cfg, taps=taps),
            cache,
        ),
        f"target: verify the tree ({args.budget} nodes + anchor)": timed(
            lambda c: verify_tree(ck.params, anchor, tree, start, c, None, cfg=ck.cfg, taps=taps), cache
        ),
        "accept_walk": timed(lambda: accept_walk(tree, jnp.zeros((b, args.budget + 1), jnp.int32), bs - 1)),
        "compact_cache (the path's keys/values into place)": timed(
            lambda c: compact_cache(c, start, jnp.broadcast_to(jnp.arange(bs), (b, bs))), cache
        ),
        "drafter: write_context": timed(
            lambda c: step.write_context(dp, c, jnp.zeros((b, bs, len(taps) * ck.cfg.hidden_size)), start), dcache
        ),
    }
    print("| piece | ms |\n|---|---|")
    for name, ms in rows.items():
        print(f"| {name} | {ms:.1f} |")


if __name__ == "__main__":
    main()
