"""DFlash drafter for Qwen3-8B at the public recipe's settings (weights supplied by you).

    dflash-jax convert --hf /path/to/Qwen3-8B --out ckpt/qwen3_8b
    dflash-jax prepare-data --target ckpt/qwen3_8b --prompts ../shared/data/train/gsm8k_train.jsonl --out data/qwen3_8b
    dflash-jax train --config configs/qwen3_8b.py
"""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("_recipe", Path(__file__).with_name("_recipe.py"))
_recipe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_recipe)


def get_config():
    return _recipe.recipe(target="ckpt/qwen3_8b", data="data/qwen3_8b", out_dir="runs/qwen3_8b")
