"""Per-device memory of the Qwen3-8B drafter-training recipe on a 2x4 mesh, from the sharding
plan and XLA's compiled memory analysis (no weights needed; nothing is allocated).

The target is Qwen3-8B's shape (36 layers, width 4096, 32 heads / 8 KV heads of 128, MLP 12288,
vocabulary 151936), frozen, bfloat16; the drafter is the recipe's (5 layers, block 16,
float32 master weights, bfloat16 compute, AdamW); one micro-batch of the recipe (8 sequences
of 3072 tokens, 512 anchors each, anchors 32 at a time) is lowered and compiled for 8
simulated CPU devices arranged as (data, fsdp, tensor).

    XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python launch/memory_plan.py
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "attention_bias": False,
}


def per_device_bytes(tree, shardings) -> int:
    import jax
    import numpy as np

    total = 0
    for x, sh in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings)):
        total += int(np.prod(sh.shard_shape(x.shape))) * x.dtype.itemsize
    return total


def plan(mesh_shape, micro_batch: int, seq_len: int, anchors: int, chunk: int) -> dict:
    import jax
    import jax.numpy as jnp
    import optax

    from dflash_jax import checkpoint
    from dflash_jax.drafter import DrafterConfig, init_drafter_params
    from dflash_jax.sharding import make_mesh
    from dflash_jax.target import TargetConfig
    from dflash_jax.train_step import sharded_step

    tcfg = TargetConfig.from_hf(QWEN3_8B, dtype="bfloat16")
    dcfg = DrafterConfig.for_target(tcfg, num_layers=5, block_size=16, mask_token_id=151662, dtype="bfloat16")
    mesh = make_mesh(mesh_shape)
    target = checkpoint._abstract_params(tcfg, jnp.bfloat16, mesh)
    params = jax.eval_shape(lambda: init_drafter_params(dcfg))
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(6e-4, weight_decay=0.0))
    step, param_sh, batch_sh, opt_sh = sharded_step(
        mesh, params, target, tcfg=tcfg, dcfg=dcfg, opt=opt, num_anchors=anchors, gamma=7.0, anchor_chunk=chunk
    )
    state = jax.eval_shape(opt.init, params)
    batch = {
        "tokens": jax.ShapeDtypeStruct((1, micro_batch, seq_len), jnp.int32),
        "loss_mask": jax.ShapeDtypeStruct((1, micro_batch, seq_len), jnp.bool_),
    }
    t0 = time.perf_counter()
    from dflash_jax.sharding import axis_rules

    with axis_rules(), jax.set_mesh(mesh):
        compiled = step.jitted.lower(params, state, target, batch, jax.random.PRNGKey(0)).compile()
    mem = compiled.memory_analysis()
    gib = 1 / 2**30
    return {
        "mesh": list(mesh_shape),
        "compile_s": time.perf_counter() - t0,
        "target_params_gib": per_device_bytes(target, jax.tree.map(lambda x: x.sharding, target)) * gib,
        "drafter_params_gib": per_device_bytes(params, param_sh) * gib,
        "optimizer_gib": per_device_bytes(state, opt_sh) * gib,
        "temp_gib": mem.temp_size_in_bytes * gib,
        "argument_gib": mem.argument_size_in_bytes * gib,
        "output_gib": mem.output_size_in_bytes * gib,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--meshes", default="1,2,4;2,4,1;1,8,1", help="semicolon-separated data,fsdp,tensor shapes")
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=3072)
    ap.add_argument("--anchors", type=int, default=512)
    ap.add_argument("--anchor-chunk", type=int, default=32)
    ap.add_argument("--out", default="docs/memory_plan.json")
    args = ap.parse_args()
    rows = []
    for m in args.meshes.split(";"):
        shape = tuple(int(x) for x in m.split(","))
        print(f"mesh {shape} ...", file=sys.stderr, flush=True)
        rows.append(plan(shape, args.micro_batch, args.seq_len, args.anchors, args.anchor_chunk))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    lines = [
        "| mesh (data, fsdp, tensor) | target params | drafter params | AdamW state "
        "| activations + temporaries (XLA) |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {tuple(r['mesh'])} | {r['target_params_gib']:.2f} GiB | {r['drafter_params_gib']:.2f} GiB | "
            f"{r['optimizer_gib']:.2f} GiB | {r['temp_gib']:.2f} GiB |"
        )
    print("\n".join(lines))
    Path(args.out).write_text(
        json.dumps(
            {
                "rows": rows,
                "table": "\n".join(lines),
                "micro_batch": args.micro_batch,
                "seq_len": args.seq_len,
                "anchors": args.anchors,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
