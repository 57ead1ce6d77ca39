"""DFlash drafter for gpt-oss-20b (32 experts, 4 per token; sliding and full attention layers,
attention sinks) at the public recipe's settings, on one 8-chip host with experts split 2 ways.

The released gpt-oss weights are MXFP4-quantised; save a bfloat16 copy first
(transformers: ``from_pretrained(..., quantization_config=Mxfp4Config(dequantize=True))`` then
``save_pretrained``), then:

dflash-jax convert --hf /path/to/gpt-oss-20b-bf16 --out ckpt/gpt_oss_20b
dflash-jax prepare-data --target ckpt/gpt_oss_20b --out data/gpt_oss_20b \\
    --prompts ../shared/data/train/gsm8k_train.jsonl
dflash-jax train --config configs/gpt_oss_20b.py
"""

from _recipe import recipe


def get_config():
    c = recipe(target="ckpt/gpt_oss_20b", data="data/gpt_oss_20b", out_dir="runs/gpt_oss_20b")
    c.mesh = (1, 4, 1, 2)  # data, fsdp, tensor, expert
    return c
