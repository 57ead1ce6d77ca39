"""DFlash drafter for Qwen3-8B at the public recipe's settings (weights supplied by you).

dflash-jax convert --hf /path/to/Qwen3-8B --out ckpt/qwen3_8b
dflash-jax prepare-data --target ckpt/qwen3_8b --prompts ../shared/data/train/gsm8k_train.jsonl --out data/qwen3_8b
dflash-jax train --config configs/qwen3_8b.py
"""

from _recipe import recipe


def get_config():
    return recipe(target="ckpt/qwen3_8b", data="data/qwen3_8b", out_dir="runs/qwen3_8b")
