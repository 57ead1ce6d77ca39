"""DFlash drafter for Llama-3.1-8B-Instruct at the public recipe's settings (weights supplied by you).

    dflash-jax convert --hf /path/to/Llama-3.1-8B-Instruct --out ckpt/llama31_8b
    dflash-jax prepare-data --target ckpt/llama31_8b --prompts ../shared/data/train/gsm8k_train.jsonl --out data/llama31_8b
    dflash-jax train --config configs/llama31_8b.py
"""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("_recipe", Path(__file__).with_name("_recipe.py"))
_recipe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_recipe)


def get_config():
    return _recipe.recipe(target="ckpt/llama31_8b", data="data/llama31_8b", out_dir="runs/llama31_8b")
