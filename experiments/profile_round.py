"""Where a speculative round's time goes: the jitted pieces of the loop, timed alone.

SmolLM2-135M, batch 1, a KV cache of 512 slots, a random 1-layer drafter (or ``--drafter PATH``, e.g.
the shipped one); for T = 1, 2, 4, 8, 16 block tokens: target verify (forward + LM head + argmax),
the target forward alone, the drafter's draft (its layers + LM head on T-1 positions; DFlash 2: and
the selector's top-k and walk), its context write, and two parts of the draft alone: the LM head on
T-1 positions and the top-16 of those logits (DFlash 2's candidates). Milliseconds, mean of 20 runs
after two warm-up calls. With ``--draft-vocab N ...`` one more draft column per N: the draft with
the head over the first N tokens of the drafter's stored draft vocabulary (``draft_vocab.json``).

    .venv/bin/python experiments/profile_round.py
    .venv/bin/python experiments/profile_round.py --drafter dflash_jax/assets/smollm2-135m-instruct-dflash \\
        --draft-vocab 16384 8192 4096
"""

import time

import jax
import jax.numpy as jnp

from dflash_jax import checkpoint, hub
from dflash_jax.drafter import DrafterConfig, DraftStep, init_drafter_params
from dflash_jax.sampling import GREEDY
from dflash_jax.target import Target, init_cache
from dflash_jax.utils import enable_compilation_cache


def timeit(f, *args, n=20):
    jax.block_until_ready(f(*args))
    jax.block_until_ready(f(*args))
    t = time.perf_counter()
    for _ in range(n):
        r = f(*args)
    jax.block_until_ready(r)
    return (time.perf_counter() - t) / n * 1e3


def main(drafter: str, vocab_sizes: list[int]):
    enable_compilation_cache()
    ck = checkpoint.load_target(hub.SMOLLM2)
    cfg = ck.cfg
    if drafter:
        from dflash_jax.drafter_io import load_drafter

        dparams, dcfg, _ = load_drafter(drafter)
        dparams = jax.device_put(jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), dparams))
    else:
        dcfg = DrafterConfig.for_target(cfg, num_layers=1, block_size=16, mask_token_id=16)
        dparams = jax.device_put(init_drafter_params(dcfg, 0))
    step = DraftStep(dcfg, cfg)
    cut = {}
    if vocab_sizes:
        from dflash_jax.drafter import with_draft_vocab
        from dflash_jax.drafter_io import read_draft_vocab

        ids = read_draft_vocab(drafter) if drafter else None
        if ids is None or max(vocab_sizes) > len(ids):
            raise SystemExit(f"--draft-vocab: {drafter or 'the random drafter'} stores no list that long")
        cut = {n: jax.device_put(with_draft_vocab(dparams, ids[:n], ck.params, cfg)) for n in vocab_sizes}
    cache, dcache, s = init_cache(cfg, 1, 512), step.init_cache(1, 512), jnp.array([100])
    tokens = jnp.asarray(jax.random.randint(jax.random.key(0), (1, 512), 0, cfg.vocab_size), jnp.int32)
    head = jax.jit(lambda p, h: Target(cfg).apply({"params": p}, h, method="logits"))
    top = jax.jit(lambda x: jax.lax.top_k(x, 16))
    print(
        "T  verify  target-forward  draft  context-write  LM-head  top-16"
        + "".join(f"  draft@{n}" for n in cut)
        + "  (ms)"
    )
    for t in (1, 2, 4, 8, 16):
        pos = 100 + jnp.arange(t)[None]
        tok = jnp.ones((1, t), jnp.int32)

        @jax.jit
        def verify(p, c, tok):
            h, f, c2 = Target(cfg).apply({"params": p}, tok, pos, c, dcfg.target_layer_ids)
            return jnp.argmax(Target(cfg).apply({"params": p}, h, method="logits"), -1), f, c2

        @jax.jit
        def forward(p, c, tok):
            h, _, c2 = Target(cfg).apply({"params": p}, tok, pos, c, dcfg.target_layer_ids)
            return h, c2

        draft = jax.jit(
            lambda dp, p, dc: (
                step.propose(
                    dp, p, dc, jnp.ones((1,), jnp.int32), s, jnp.array([t]), t, tokens=tokens, key=None, sampling=GREEDY
                ).tokens
            )
        )
        feats = jnp.ones((1, t, len(dcfg.target_layer_ids) * cfg.hidden_size))
        write = jax.jit(lambda dp, dc, f: step.write_context(dp, dc, f, s))
        d = timeit(draft, dparams, ck.params, dcache) if t > 1 else 0.0
        hidden = jnp.ones((1, max(t - 1, 1), cfg.hidden_size), jnp.float32)
        logits = head(ck.params, hidden)
        print(
            f"{t:<3d}{timeit(verify, ck.params, cache, tok):7.1f}{timeit(forward, ck.params, cache, tok):16.1f}"
            f"{d:7.1f}{timeit(write, dparams, dcache, feats):15.1f}"
            f"{timeit(head, ck.params, hidden):9.1f}{timeit(top, logits):8.1f}"
            + "".join(
                f"{timeit(draft, c, ck.params, dcache) if t > 1 else 0.0:{len(str(n)) + 8}.1f}" for n, c in cut.items()
            )
        )


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--drafter", default="", help="a drafter folder (default: a random 1-layer DFlash drafter)")
    ap.add_argument(
        "--draft-vocab", type=int, nargs="*", default=[], metavar="N", help="draft vocabulary sizes to time"
    )
    args = ap.parse_args()
    main(args.drafter, args.draft_vocab)
