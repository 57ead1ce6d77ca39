"""DFlash drafter for Gemma 3 27B (its language model: 62 layers, five sliding-window layers to one
global, each kind with its own RoPE) at the public recipe's settings, on one 8-chip host (weights
supplied by you; the multimodal gemma-3-27b-it folder converts to its language model).

dflash-jax convert --hf /path/to/gemma-3-27b-it --out ckpt/gemma3_27b
dflash-jax prepare-data --target ckpt/gemma3_27b --out data/gemma3_27b \\
    --prompts ../shared/data/train/gsm8k_train.jsonl
dflash-jax train --config configs/gemma3_27b.py

Per-device memory on this mesh: experiments/memory_plan.py --target gemma3_27b (docs/BENCHMARKS.md,
"Memory plans").
"""

from _recipe import recipe


def get_config():
    return recipe(target="ckpt/gemma3_27b", data="data/gemma3_27b", out_dir="runs/gemma3_27b")
