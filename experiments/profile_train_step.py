"""How much of a drafter training step the LM head costs: the step at the full vocabulary
against the same step with the target's embedding cut to its first V rows.

Shapes of the SmolLM2 CPU recipe (stages 3-5): 4 sequences x 384 tokens, 64 anchors each, 8 at a
time, loss offsets 1..8, no recomputation, stored features (random here), a 2-layer drafter reading
target layers (1, 14, 27). Random tokens below the cut, so every label exists in the cut
vocabulary. Seconds per gradient step, mean of 3 after two warm-up calls. A cut vocabulary is not
a training option: this only bounds what one (a sampled or restricted softmax) could save.

    .venv/bin/python experiments/profile_train_step.py
"""

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from dflash_jax import checkpoint, hub
from dflash_jax import loss as loss_lib
from dflash_jax.drafter import DrafterConfig, init_drafter_params


def step_seconds(dparams, tparams, tcfg, dcfg, tokens, mask, anchors, feats, n=3) -> float:
    def objective(p):
        s = loss_lib.block_loss(
            p,
            tparams,
            tokens,
            mask,
            anchors,
            tcfg=tcfg,
            cfg=dcfg,
            gamma=7.0,
            anchor_chunk=8,
            loss_offsets=8,
            remat=False,
            feats=feats,
        )
        return s.loss / s.weight

    grad = jax.jit(jax.grad(objective))
    jax.block_until_ready(grad(dparams))
    jax.block_until_ready(grad(dparams))
    t = time.perf_counter()
    for _ in range(n):
        g = grad(dparams)
    jax.block_until_ready(g)
    return (time.perf_counter() - t) / n


def main():
    ck = checkpoint.load_target(hub.SMOLLM2)
    tcfg = ck.cfg
    dcfg = DrafterConfig.for_target(tcfg, num_layers=2, block_size=16, mask_token_id=16, target_layer_ids=(1, 14, 27))
    dparams = init_drafter_params(dcfg, 0)
    rng = np.random.default_rng(0)
    b, t = 4, 384
    tokens = jnp.asarray(rng.integers(0, 2048, (b, t)), jnp.int32)
    mask = jnp.ones((b, t), bool)
    feats = jnp.asarray(rng.standard_normal((b, t, 3 * tcfg.hidden_size), np.float32))
    anchors = loss_lib.sample_anchors(jax.random.key(0), mask, 64)
    print("vocabulary  s per step")
    for v in (tcfg.vocab_size, 8192, 2048):
        tparams = dict(ck.params, embedding=ck.params["embedding"][:v])
        s = step_seconds(dparams, tparams, dataclasses.replace(tcfg, vocab_size=v), dcfg, tokens, mask, anchors, feats)
        print(f"{v:10d}  {s:.2f}")


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
