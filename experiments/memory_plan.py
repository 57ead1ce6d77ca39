"""Per-device memory of the public drafter-training recipe on a simulated mesh, from the sharding
plan and XLA's compiled memory analysis (no weights needed; nothing is allocated).

Targets (``--target``), frozen, bfloat16, at their real shapes:
  qwen3_8b             Qwen3-8B (36 layers, width 4096, 32 / 8 heads of 128, MLP 12288, vocab 151936)
  qwen3_coder_30b_a3b  Qwen3-Coder-30B-A3B (48 layers, width 2048, 32 / 4 heads, 128 experts of 768,
                       8 per token, vocab 151936)
  gpt_oss_20b          gpt-oss-20b (24 layers, width 2880, 64 / 8 heads of 64, 32 experts of 2880,
                       4 per token, sliding window 128 on every other layer, vocab 201088)
  qwen3_5_9b           a Qwen3.5 9B language model (transformers' Qwen3_5TextConfig defaults: 32 layers,
                       width 4096, 24 Gated DeltaNet layers of 16 / 32 heads of 128, 8 gated attention
                       layers of 16 / 4 heads of 256, MLP 12288, vocab 248320)
  gemma3_27b           Gemma 3 27B's language model (62 layers, width 5376, 32 / 16 heads of 128, five
                       sliding layers (window 1024) to one global, MLP 21504, vocab 262208)
  gemma4_31b           Gemma 4 31B's language model (30.7B: 60 layers, width 5376, 32 heads; sliding layers
                       (window 1024) with 16 key/value heads of 256, every sixth layer full with 4 key/value
                       heads of 512 equal to its values; vocab 262144; the shape public model cards give)
  deepseek_v3          DeepSeek-V3 (671B: 61 layers, width 7168, 128 heads of latent attention (latent
                       512, rotary 64), 3 dense layers then 256 experts of 2048, 8 per token in 4 of 8
                       groups, one shared expert, vocab 129280); the same shape as Kimi-K2's language model
                       but for 384 experts and 64 heads
The drafter is the recipe's (5 layers, block 16, float32 master weights, bfloat16 compute, AdamW);
one micro-batch of the recipe (8 sequences of 3072 tokens, 512 anchors each, anchors 32 at a time)
is lowered and compiled for 8 simulated CPU devices arranged as (data, fsdp, tensor[, expert]).

For the mixture-of-experts targets the parameter columns are exact, but XLA's CPU backend expands
the experts' grouped matmul (``ragged_dot``) into a masked dense product whose temporaries say
nothing about an accelerator, so the temporaries come from compiling a dense stand-in instead:
the same target with each MoE MLP replaced by a SwiGLU of width ``experts_per_token * expert
width`` (the ``[tokens * k, 2F]`` activations of sorted dispatch; the ``[tokens * k, d]`` copies of
the routed rows are not in it). ``--compile`` compiles the real MoE step instead.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python experiments/memory_plan.py
    .venv/bin/python experiments/memory_plan.py --target qwen3_coder_30b_a3b --meshes "1,2,1,4;1,8,1,1;1,1,1,8"
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

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


QWEN3_CODER_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "vocab_size": 151936,
    "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000000.0,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "attention_bias": False,
}

GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "num_hidden_layers": 24,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "num_local_experts": 32,
    "num_experts_per_tok": 4,
    "sliding_window": 128,
    "vocab_size": 201088,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 150000.0,
        "factor": 32.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 4096,
    },
    "tie_word_embeddings": False,
    "attention_bias": True,
}

# transformers' Qwen3_5TextConfig defaults: a 9B-parameter hybrid (24 Gated DeltaNet layers, 8 gated
# full-attention layers), the shape of Qwen3.5-9B's language model
QWEN3_5_9B = {
    "architectures": ["Qwen3_5ForCausalLM"],
    "model_type": "qwen3_5_text",
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 32,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "vocab_size": 248320,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    "tie_word_embeddings": False,
}

# Gemma 3 27B's text config (google/gemma-3-27b-it's text_config, with transformers' defaults filled in)
GEMMA3_27B = {
    "model_type": "gemma3_text",
    "hidden_size": 5376,
    "intermediate_size": 21504,
    "num_hidden_layers": 62,
    "num_attention_heads": 32,
    "num_key_value_heads": 16,
    "head_dim": 128,
    "query_pre_attn_scalar": 168,
    "sliding_window": 1024,
    "vocab_size": 262208,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    },
    "tie_word_embeddings": True,
}

# Gemma 4 31B's text config as public model cards describe it (no config.json on this machine; the
# parameter count it gives, 30.70B, is the released one)
GEMMA4_31B = {
    "model_type": "gemma4_text",
    "hidden_size": 5376,
    "intermediate_size": 21504,
    "num_hidden_layers": 60,
    "num_attention_heads": 32,
    "num_key_value_heads": 16,
    "head_dim": 256,
    "global_head_dim": 512,
    "num_global_key_value_heads": 4,
    "attention_k_eq_v": True,
    "sliding_window": 1024,
    "hidden_size_per_layer_input": 0,
    "vocab_size": 262144,
    "max_position_embeddings": 262144,
    "final_logit_softcapping": 30.0,
    "tie_word_embeddings": True,
}

# transformers' DeepseekV3Config defaults: DeepSeek-V3's shape (its release adds YaRN, factor 40)
DEEPSEEK_V3 = {
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "n_group": 8,
    "topk_group": 4,
    "n_shared_experts": 1,
    "first_k_dense_replace": 3,
    "routed_scaling_factor": 2.5,
    "vocab_size": 129280,
    "max_position_embeddings": 163840,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 40.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
    "tie_word_embeddings": False,
}

TARGETS = {
    "qwen3_8b": QWEN3_8B,
    "qwen3_coder_30b_a3b": QWEN3_CODER_30B_A3B,
    "gpt_oss_20b": GPT_OSS_20B,
    "qwen3_5_9b": QWEN3_5_9B,
    "gemma3_27b": GEMMA3_27B,
    "gemma4_31b": GEMMA4_31B,
    "deepseek_v3": DEEPSEEK_V3,
}


def per_device_bytes(tree, shardings) -> int:
    import jax
    import numpy as np

    total = 0
    for x, sh in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings)):
        total += int(np.prod(sh.shard_shape(x.shape))) * x.dtype.itemsize
    return total


def plan(
    mesh_shape,
    micro_batch: int,
    seq_len: int,
    anchors: int,
    chunk: int,
    target: str = "qwen3_8b",
    compile_step=None,
    params_only: bool = False,
) -> dict:
    """One row: per-device GiB of target params, drafter params, AdamW state and (compiled) temporaries
    (``params_only``: the first three, exact from the sharding plan, nothing compiled)."""
    from functools import partial

    import jax
    import jax.numpy as jnp
    import optax

    from dflash_jax import checkpoint, hf_format
    from dflash_jax.drafter import DrafterConfig, init_drafter_params
    from dflash_jax.loss import LossSettings
    from dflash_jax.sharding import axis_rules, make_mesh
    from dflash_jax.train_step import sharded_step

    tcfg = hf_format.read_config(TARGETS[target], dtype="bfloat16")
    if compile_step is None:
        compile_step = tcfg.moe is None
    dcfg = DrafterConfig.for_target(
        tcfg, num_layers=5, block_size=16, mask_token_id=tcfg.vocab_size - 1, dtype="bfloat16"
    )
    mesh = make_mesh(mesh_shape)
    target_params = checkpoint._abstract_params(tcfg, jnp.bfloat16, mesh)
    params = jax.eval_shape(lambda: init_drafter_params(dcfg))
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(6e-4, weight_decay=0.0))
    step_for = partial(  # the step for a target's parameters and config
        sharded_step, mesh, params, dcfg=dcfg, opt=opt, num_anchors=anchors, loss=LossSettings(anchor_chunk=chunk)
    )
    step, param_sh, batch_sh, opt_sh = step_for(target_params, tcfg=tcfg)
    state = jax.eval_shape(opt.init, params)
    batch = {
        "tokens": jax.ShapeDtypeStruct((1, micro_batch, seq_len), jnp.int32),
        "loss_mask": jax.ShapeDtypeStruct((1, micro_batch, seq_len), jnp.bool_),
    }
    gib = 1 / 2**30
    row = {
        "target": target,
        "mesh": list(mesh.devices.shape),
        "target_params_gib": per_device_bytes(target_params, jax.tree.map(lambda x: x.sharding, target_params)) * gib,
        "drafter_params_gib": per_device_bytes(params, param_sh) * gib,
        "optimizer_gib": per_device_bytes(state, opt_sh) * gib,
    }
    stand_in = None
    if params_only:
        return row
    if not compile_step and tcfg.moe is not None:
        # activations of the MoE layers as sorted dispatch makes them: [tokens * k, 2F] -- what a dense
        # SwiGLU of width k * F holds; compile that stand-in (same attention, norms, vocabulary)
        stand_in = dataclasses.replace(
            tcfg, moe=None, intermediate_size=tcfg.moe.experts_per_token * tcfg.moe.intermediate_size
        )
        stand_params = checkpoint._abstract_params(stand_in, jnp.bfloat16, mesh)
        step, *_ = step_for(stand_params, tcfg=stand_in)
        compile_step, target_params = True, stand_params
        row["temp_from"] = f"dense stand-in, MLP width {stand_in.intermediate_size} (experts per token x expert width)"
    if compile_step:
        t0 = time.perf_counter()
        with axis_rules(), jax.set_mesh(mesh):
            compiled = step.jitted.lower(params, state, target_params, batch, jax.random.PRNGKey(0)).compile()
        mem = compiled.memory_analysis()
        row.update(
            compile_s=time.perf_counter() - t0,
            temp_gib=mem.temp_size_in_bytes * gib,
            argument_gib=mem.argument_size_in_bytes * gib,
            output_gib=mem.output_size_in_bytes * gib,
        )
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", choices=sorted(TARGETS), default="qwen3_8b")
    ap.add_argument(
        "--meshes", default="1,2,4;2,4,1;1,8,1", help="semicolon-separated data,fsdp,tensor[,expert] shapes"
    )
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=3072)
    ap.add_argument("--anchors", type=int, default=512)
    ap.add_argument("--anchor-chunk", type=int, default=32)
    ap.add_argument("--compile", action="store_true", help="compile the step for MoE targets too")
    ap.add_argument("--params-only", action="store_true", help="parameter columns only (no compile; pod-sized meshes)")
    ap.add_argument("--out", default=None, help="JSON output (default docs/memory_plan[_TARGET].json)")
    args = ap.parse_args()
    out = args.out or ("docs/memory_plan.json" if args.target == "qwen3_8b" else f"docs/memory_plan_{args.target}.json")
    rows = []
    for m in args.meshes.split(";"):
        shape = tuple(int(x) for x in m.split(","))
        print(f"{args.target} mesh {shape} ...", file=sys.stderr, flush=True)
        rows.append(
            plan(
                shape,
                args.micro_batch,
                args.seq_len,
                args.anchors,
                args.anchor_chunk,
                args.target,
                args.compile or None,
                args.params_only,
            )
        )
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    lines = [
        f"| {args.target}: mesh (data, fsdp, tensor, expert) | target params | drafter params | AdamW state "
        "| activations + temporaries (XLA) |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        temp = f"{r['temp_gib']:.2f} GiB" if "temp_gib" in r else "not compiled"
        temp += " (dense stand-in)" if "temp_from" in r else ""
        lines.append(
            f"| {tuple(r['mesh'])} | {r['target_params_gib']:.2f} GiB | {r['drafter_params_gib']:.2f} GiB | "
            f"{r['optimizer_gib']:.2f} GiB | {temp} |"
        )
    print("\n".join(lines))
    payload = {
        "target": args.target,
        "rows": rows,
        "table": "\n".join(lines),
        "micro_batch": args.micro_batch,
        "seq_len": args.seq_len,
        "anchors": args.anchors,
    }
    Path(out).write_text(json.dumps(payload, indent=1))


if __name__ == "__main__":
    main()
