"""The weights' layout in the real verify: SmolLM2's target forward (taps 1, 14, 27, a KV cache of 512 slots,
batch 1) and its LM head with an argmax, at 1 / 2 / 4 / 8 / 16 positions, with the layers' matmul kernels as the
model stores them (``[in, out]``) and passed stored ``[out, in]`` (each ``.T`` inside the jitted function, which XLA
folds into the dot). Milliseconds, median of 15 calls, three repeats printed as ``[in,out]/[out,in]``.
``experiments/head_matmul.py --stack`` times the same matmuls alone (docs/BENCHMARKS.md, "The weights' layout").

    .venv/bin/python experiments/layout_verify.py
"""

import time

import jax
import jax.numpy as jnp

from dflash_jax import checkpoint, hub
from dflash_jax.target import Target, init_cache
from dflash_jax.utils import enable_compilation_cache

TAPS = (1, 14, 27)


def median_ms(f, *args, n: int = 15) -> float:
    for _ in range(2):
        jax.block_until_ready(f(*args))
    times = []
    for _ in range(n):
        t = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - t)
    return sorted(times)[n // 2] * 1e3


def transposed(params):
    """``params`` with every layer's matmul kernel (2-D, not the embedding the LM head shares) transposed: stored
    ``[out, in]`` outside the jitted function, and back to ``[in, out]`` inside it (a ``.T`` XLA folds into the dot)."""
    return jax.tree_util.tree_map_with_path(
        lambda p, x: jnp.transpose(x) if x.ndim == 2 and "embed" not in jax.tree_util.keystr(p) else x, params
    )


def main() -> None:
    enable_compilation_cache()
    ck = checkpoint.load_target(hub.SMOLLM2)
    cfg = ck.cfg
    stored_t = transposed(ck.params)
    cache = init_cache(cfg, 1, 512)
    print("positions  [in,out]/[out,in] ms, three repeats")
    for t in (1, 2, 4, 8, 16):
        pos = 100 + jnp.arange(t)[None]
        tok = jnp.ones((1, t), jnp.int32)

        def verify(p, c, tok, pos=pos):
            h, f, c2 = Target(cfg).apply({"params": p}, tok, pos, c, TAPS)
            return jnp.argmax(Target(cfg).apply({"params": p}, h, method="logits"), -1), f, c2

        def verify_t(q, c, tok):
            return verify(transposed(q), c, tok)

        a, b = jax.jit(verify), jax.jit(verify_t)
        r = [(median_ms(a, ck.params, cache, tok), median_ms(b, stored_t, cache, tok)) for _ in range(3)]
        print(f"{t:<10d} " + "  ".join(f"{x:.1f}/{y:.1f}" for x, y in r), flush=True)


if __name__ == "__main__":
    main()
