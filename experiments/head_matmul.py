"""What a matmul costs here by its number of rows: SmolLM2-135M's LM head (576 x 49152) and MLP shapes.

``x @ W`` (``x [T, d]``, ``W [d, f]``), ``(W^T @ x^T)^T`` and an einsum over ``W^T [f, d]``, for
T = 1, 2, 4, 8, 16 rows, float32, jitted; milliseconds, mean of 30 calls after two warm-up calls. A
target's verify of T block tokens runs every layer's matmuls at T rows, so this is why a verify on
a CPU costs more than a plain step (docs/BENCHMARKS.md, "A draft vocabulary").

    .venv/bin/python experiments/head_matmul.py
    XLA_FLAGS=... .venv/bin/python experiments/head_matmul.py --stack

``--stack``: a 30-layer stack of SmolLM2's matmuls (fused QKV, output, gate-up, down; random weights) and
its LM head with an argmax, at 1 / 2 / 4 / 8 / 16 rows, under XLA (any ``XLA_FLAGS`` given), under XLA with every
weight stored ``[out, in]`` (an einsum over the transposed layout) and numpy's BLAS;
milliseconds, median of 15 calls: what a verify of 8 positions costs against a plain step on this machine.
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np
from profile_round import timeit


def stack() -> None:
    import os
    import time

    d, f, layers, v = 576, 1536, 30, 49152
    rs = np.random.default_rng(0)
    shapes = {"qkv": (d, d + 2 * 192), "o": (d, d), "gu": (d, 2 * f), "dn": (f, d)}
    ws = [{k: (rs.standard_normal(sh, dtype=np.float32) * 0.02) for k, sh in shapes.items()} for _ in range(layers)]
    head = rs.standard_normal((v, d), dtype=np.float32) * 0.02

    def forward(x, ws, head, silu):
        for w in ws:
            x = x + (x @ w["qkv"])[:, :d] @ w["o"]
            g = x @ w["gu"]
            x = x + (silu(g[:, :f]) * g[:, f:]) @ w["dn"]
        return (x @ head.T).argmax(-1)

    def forward_t(x, wts, head):  # the same with every weight stored [out, in] (PyTorch's layout)
        mm = lambda x, wt: jnp.einsum("td,fd->tf", x, wt)  # noqa: E731
        for w in wts:
            x = x + mm(mm(x, w["qkv"])[:, :d], w["o"])
            g = mm(x, w["gu"])
            x = x + mm(jax.nn.silu(g[:, :f]) * g[:, f:], w["dn"])
        return mm(x, head).argmax(-1)

    xla = jax.jit(lambda x, ws, head: forward(x, ws, head, jax.nn.silu))
    xla_t = jax.jit(forward_t)
    jws, jhead = jax.tree.map(jnp.asarray, ws), jnp.asarray(head)
    jwts = jax.tree.map(lambda w: jnp.asarray(w.T.copy()), ws)
    numpy_silu = lambda g: g / (1 + np.exp(-g))  # noqa: E731
    print("XLA_FLAGS:", os.environ.get("XLA_FLAGS", "(none)"))
    for rows in (1, 2, 4, 8, 16):
        x = np.ones((rows, d), np.float32)
        times = {}
        for name, run in (
            ("xla", lambda: xla(x, jws, jhead).block_until_ready()),
            ("xla [out, in]", lambda: xla_t(x, jwts, jhead).block_until_ready()),
            ("numpy", lambda: forward(x, ws, head, numpy_silu)),
        ):
            run()
            t = []
            for _ in range(15):
                start = time.perf_counter()
                run()
                t.append(time.perf_counter() - start)
            times[name] = 1e3 * float(np.median(t))
        print(
            ", ".join(
                [f"{rows} rows: XLA {times['xla']:.1f} ms"]
                + [f"{k} {v:.1f} ms" for k, v in times.items() if k != "xla"]
            )
        )


def main() -> None:
    if "--stack" in sys.argv[1:]:
        return stack()
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
