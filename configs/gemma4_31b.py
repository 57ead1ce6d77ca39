"""DFlash drafter for Gemma 4 31B (its language model: 60 layers, five sliding-window layers to one
full one, the full layers with heads of 512 whose keys are their values) at the public recipe's
settings, on one 8-chip host (weights supplied by you; the multimodal gemma-4-31B-it folder converts to
its language model).

dflash-jax convert --hf /path/to/gemma-4-31B-it --out ckpt/gemma4_31b
dflash-jax prepare-data --target ckpt/gemma4_31b --out data/gemma4_31b \\
    --prompts ../shared/data/train/gsm8k_train.jsonl
dflash-jax train --config configs/gemma4_31b.py

Per-device memory on this mesh: experiments/memory_plan.py --target gemma4_31b (docs/BENCHMARKS.md,
"Memory plans").
"""

from _recipe import recipe


def get_config():
    return recipe(target="ckpt/gemma4_31b", data="data/gemma4_31b", out_dir="runs/gemma4_31b")
