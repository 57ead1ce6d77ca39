"""Training throughput and peak memory against the number of anchors (SmolLM2-135M, this CPU).

For each anchor count (default 64, 128, 256, 512) a fresh subprocess (so peak memory is its
own) runs the jitted training step of a 1-layer, block-16 drafter on SmolLM2-135M at sequence
length 1024, batch 1, float32, on random tokens with the second half supervised: a few warm-up
steps, then timed steps. Reported: drafter blocks/s, target tokens/s, seconds per step, and
the process's peak resident memory (which includes the target's weights and the JAX runtime).

    .venv/bin/python launch/bench_train.py --out docs/bench_train.json      # or: make bench-train

``--recipe``: the CPU recipe's step (``experiments/smollm2/smollm2_135m_cpu.py``: 2 layers reading target
layers 1, 14, 27; 4 sequences x 384 tokens x 64 anchors, 16 at a time) split into its parts:
the whole step, the target's feature forward alone (what stored features would save), and
the step with ``loss_offsets=8``, and that step at 8 anchors at a time and without activation
recomputation (``train.remat=False``, as in ``experiments/smollm2/smollm2_135m_cpu_v3.py``).

    .venv/bin/python launch/bench_train.py --recipe --out docs/bench_train_recipe.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path


def worker(anchors: int, seq_len: int, steps: int, chunk: int) -> dict:
    from functools import partial

    import jax
    import numpy as np
    from ml_collections import ConfigDict

    from dflash_jax import checkpoint, hub
    from dflash_jax.drafter import DrafterConfig, init_drafter_params
    from dflash_jax.loss import LossSettings
    from dflash_jax.train_step import make_optimizer, train_step
    from dflash_jax.utils import enable_compilation_cache

    enable_compilation_cache()
    ck = checkpoint.load_target(hub.SMOLLM2)
    dcfg = DrafterConfig.for_target(ck.cfg, num_layers=1, block_size=16, mask_token_id=16)
    t = ConfigDict(
        dict(lr=6e-4, warmup_frac=0.04, steps=1000, grad_clip=1.0, b1=0.9, b2=0.999, weight_decay=0.0, copy_bias_lr=0.0)
    )
    opt = make_optimizer(t)
    params = init_drafter_params(dcfg, 0)
    state = opt.init(params)
    rs = np.random.RandomState(0)
    batch = {
        "tokens": rs.randint(0, ck.cfg.vocab_size, (1, 1, seq_len)).astype(np.int32),
        "loss_mask": np.zeros((1, 1, seq_len), bool),
    }
    batch["loss_mask"][..., seq_len // 2 :] = True
    step = jax.jit(
        partial(
            train_step, tcfg=ck.cfg, dcfg=dcfg, opt=opt, num_anchors=anchors, loss=LossSettings(anchor_chunk=chunk)
        ),
        donate_argnums=(0, 1),
    )
    t0 = time.perf_counter()
    params, state, m = step(params, state, ck.params, batch, jax.random.PRNGKey(0))
    jax.block_until_ready(m)
    compile_s = time.perf_counter() - t0
    params, state, m = step(params, state, ck.params, batch, jax.random.PRNGKey(1))
    jax.block_until_ready(m)
    t0 = time.perf_counter()
    for i in range(steps):
        params, state, m = step(params, state, ck.params, batch, jax.random.PRNGKey(2 + i))
    jax.block_until_ready(m)
    dt = (time.perf_counter() - t0) / steps
    return {
        "anchors": anchors,
        "seq_len": seq_len,
        "s_per_step": dt,
        "blocks_per_s": anchors / dt,
        "target_tokens_per_s": seq_len / dt,
        "compile_s": compile_s,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def recipe_worker(steps: int) -> dict:
    from functools import partial

    import jax
    import numpy as np
    from ml_collections import ConfigDict

    from dflash_jax import checkpoint, hub
    from dflash_jax.drafter import DrafterConfig, init_drafter_params
    from dflash_jax.loss import LossSettings, target_features
    from dflash_jax.train_step import make_optimizer, train_step
    from dflash_jax.utils import enable_compilation_cache

    enable_compilation_cache()
    ck = checkpoint.load_target(hub.SMOLLM2)
    dcfg = DrafterConfig.for_target(ck.cfg, num_layers=2, block_size=16, mask_token_id=16, target_layer_ids=(1, 14, 27))
    opt = make_optimizer(
        ConfigDict(
            dict(
                lr=1.5e-3,
                warmup_frac=0.04,
                steps=600,
                grad_clip=1.0,
                b1=0.9,
                b2=0.999,
                weight_decay=0.0,
                copy_bias_lr=0.0,
            )
        )
    )
    rs = np.random.RandomState(0)
    batch = {
        "tokens": rs.randint(0, ck.cfg.vocab_size, (1, 4, 384)).astype(np.int32),
        "loss_mask": np.zeros((1, 4, 384), bool),
    }
    batch["loss_mask"][..., 100:] = True

    def timed(fn, *args):
        out = fn(*args)  # compile + first run
        jax.block_until_ready(out)
        t0 = time.perf_counter()
        for _ in range(steps):
            out = fn(*args)
        jax.block_until_ready(out)
        return (time.perf_counter() - t0) / steps

    feats = jax.jit(partial(target_features, tcfg=ck.cfg, layer_ids=dcfg.target_layer_ids))
    row = {"target_features_s": timed(feats, ck.params, batch["tokens"][0])}
    for k in (0, 8):
        params = init_drafter_params(dcfg, 0)
        step = jax.jit(
            partial(train_step, tcfg=ck.cfg, dcfg=dcfg, opt=opt, num_anchors=64, loss=LossSettings(loss_offsets=k))
        )
        row[f"step_s_loss_offsets_{k}"] = timed(
            lambda: step(params, opt.init(params), ck.params, batch, jax.random.PRNGKey(0))[2]
        )
    for chunk, remat in ((8, True), (16, False), (8, False)):  # train.anchor_chunk x train.remat, loss_offsets=8
        params = init_drafter_params(dcfg, 0)
        step = jax.jit(
            partial(
                train_step,
                tcfg=ck.cfg,
                dcfg=dcfg,
                opt=opt,
                num_anchors=64,
                loss=LossSettings(anchor_chunk=chunk, loss_offsets=8, remat=remat),
            )
        )
        row[f"step_s_loss_offsets_8_chunk_{chunk}_remat_{remat}"] = timed(
            lambda: step(params, opt.init(params), ck.params, batch, jax.random.PRNGKey(0))[2]
        )
    row["target_share"] = row["target_features_s"] / row["step_s_loss_offsets_0"]
    row["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--anchors", type=int, nargs="+", default=[64, 128, 256, 512])
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per setting")
    ap.add_argument("--anchor-chunk", type=int, default=32)
    ap.add_argument("--out", default="docs/bench_train.json")
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--recipe", action="store_true", help="the CPU recipe's step split into its parts (see above)")
    args = ap.parse_args()
    if args.recipe:
        row = recipe_worker(args.steps)
        print(json.dumps(row, indent=1))
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(
            json.dumps(
                {
                    "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                    "date": time.strftime("%Y-%m-%d"),
                    **row,
                },
                indent=1,
            )
        )
        return
    if args.worker:
        print(json.dumps(worker(args.worker, args.seq_len, args.steps, args.anchor_chunk)))
        return
    rows = []
    for a in args.anchors:
        print(f"anchors {a} ...", file=sys.stderr, flush=True)
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--worker",
                str(a),
                "--seq-len",
                str(args.seq_len),
                "--steps",
                str(args.steps),
                "--anchor-chunk",
                str(args.anchor_chunk),
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    lines = [
        "| anchors | s per step | drafter blocks/s | target tokens/s | peak RSS (MB) | compile (s) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['anchors']} | {r['s_per_step']:.2f} | {r['blocks_per_s']:.0f} | "
            f"{r['target_tokens_per_s']:.0f} | {r['peak_rss_mb']:.0f} | {r['compile_s']:.1f} |"
        )
    table = "\n".join(lines)
    print(table)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps(
            {
                "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                "date": time.strftime("%Y-%m-%d"),
                "seq_len": args.seq_len,
                "anchor_chunk": args.anchor_chunk,
                "rows": rows,
                "table": table,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
