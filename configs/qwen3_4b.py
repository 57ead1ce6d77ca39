"""DFlash drafter for Qwen3-4B at the public recipe's settings (weights supplied by you).

dflash-jax convert --hf /path/to/Qwen3-4B --out ckpt/qwen3_4b
dflash-jax prepare-data --target ckpt/qwen3_4b --prompts ../shared/data/train/gsm8k_train.jsonl --out data/qwen3_4b
dflash-jax train --config configs/qwen3_4b.py
"""

from _recipe import recipe


def get_config():
    return recipe(target="ckpt/qwen3_4b", data="data/qwen3_4b", out_dir="runs/qwen3_4b")
