"""DFlash drafter for Llama-3.1-8B-Instruct at the public recipe's settings (weights supplied by you).

dflash-jax convert --hf /path/to/Llama-3.1-8B-Instruct --out ckpt/llama31_8b
dflash-jax prepare-data --target ckpt/llama31_8b --prompts ../shared/data/train/gsm8k_train.jsonl --out data/llama31_8b
dflash-jax train --config configs/llama31_8b.py
"""

from _recipe import recipe


def get_config():
    return recipe(target="ckpt/llama31_8b", data="data/llama31_8b", out_dir="runs/llama31_8b")
