"""What a matmul costs here by its number of rows: SmolLM2-135M's LM head (576 x 49152) and MLP shapes.

``x @ W`` (``x [T, d]``, ``W [d, f]``), ``(W^T @ x^T)^T`` and an einsum over ``W^T [f, d]``, for
T = 1, 2, 4, 8, 16 rows, float32, jitted; milliseconds, mean of 30 calls after two warm-up calls. A
target's verify of T block tokens runs every layer's matmuls at T rows, so this is why a verify on
a CPU costs more than a plain step (docs/BENCHMARKS.md, "A draft vocabulary").

    .venv/bin/python experiments/head_matmul.py
"""

import jax
import jax.numpy as jnp
from profile_round import timeit


def main() -> None:
    key = jax.random.key(0)
    layouts = {
        "x@W": (jax.jit(lambda x, w: x @ w), False),
        "Wt@xT": (jax.jit(lambda x, wt: (wt @ x.T).T), True),
        "einsum vd": (jax.jit(lambda x, wt: jnp.einsum("td,vd->tv", x, wt)), True),
    }
    print("d f layout  ms at 1 2 4 8 16 rows")
    for d, f in [(576, 49152), (576, 1536), (1536, 576)]:
        w = jax.random.normal(key, (d, f))
        wt = jnp.asarray(w.T)
        for name, (fn, transposed) in layouts.items():
            row = [timeit(fn, jax.random.normal(key, (t, d)), wt if transposed else w, n=30) for t in (1, 2, 4, 8, 16)]
            print(d, f, name, " ".join(f"{v:.3f}" for v in row))


if __name__ == "__main__":
    main()
