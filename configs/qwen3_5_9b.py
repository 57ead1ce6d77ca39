"""DFlash drafter for a Qwen3.5 9B hybrid target (Gated DeltaNet and gated attention layers) at the
public recipe's settings (weights supplied by you; a multimodal Qwen3.5 folder converts to its
language model).

dflash-jax convert --hf /path/to/Qwen3.5-9B --out ckpt/qwen3_5_9b
dflash-jax prepare-data --target ckpt/qwen3_5_9b --out data/qwen3_5_9b \\
    --prompts ../shared/data/train/gsm8k_train.jsonl
dflash-jax train --config configs/qwen3_5_9b.py

Per-device memory on this mesh: experiments/memory_plan.py --target qwen3_5_9b (docs/BENCHMARKS.md).
"""

from _recipe import recipe


def get_config():
    return recipe(target="ckpt/qwen3_5_9b", data="data/qwen3_5_9b", out_dir="runs/qwen3_5_9b")
