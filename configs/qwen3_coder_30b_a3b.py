"""DFlash drafter for Qwen3-Coder-30B-A3B (qwen3_moe: 128 experts, 8 per token) at the public
recipe's settings, on one 8-chip host with experts split 4 ways (weights supplied by you).

dflash-jax convert --hf /path/to/Qwen3-Coder-30B-A3B-Instruct --out ckpt/qwen3_coder_30b_a3b
dflash-jax prepare-data --target ckpt/qwen3_coder_30b_a3b --out data/qwen3_coder_30b_a3b \\
    --prompts ../shared/data/train/code_alpaca_2k.json
dflash-jax train --config configs/qwen3_coder_30b_a3b.py

Per-device memory of the parameters on this mesh: experiments/memory_plan.py --target qwen3_coder_30b_a3b
(docs/BENCHMARKS.md, "Memory plans").
"""

from _recipe import recipe


def get_config():
    c = recipe(target="ckpt/qwen3_coder_30b_a3b", data="data/qwen3_coder_30b_a3b", out_dir="runs/qwen3_coder_30b_a3b")
    c.mesh = (1, 2, 1, 4)  # data, fsdp, tensor, expert
    return c
