"""DFlash drafter for DeepSeek-V3 (671B: multi-head latent attention, 256 experts, 8 per token) or a
Kimi-K2 / K2.5 language model of its shape, at the public recipe's settings, on a 256-chip pod slice
with experts split 32 ways (weights supplied by you, in bfloat16: save a bfloat16 copy of an FP8
release with transformers first; a Kimi-K2.5 folder converts to its language model).

dflash-jax convert --hf /path/to/DeepSeek-V3-bf16 --out ckpt/deepseek_v3
dflash-jax prepare-data --target ckpt/deepseek_v3 --out data/deepseek_v3 \\
    --prompts ../shared/data/train/gsm8k_train.jsonl   # or --server URL: answers from vLLM / SGLang
dflash-jax train --config configs/deepseek_v3.py --distributed   # one process per host

Per-device memory of the parameters on this mesh: XLA_FLAGS=--xla_force_host_platform_device_count=256
experiments/memory_plan.py --target deepseek_v3 --params-only (docs/BENCHMARKS.md, "Memory plans").
"""

from _recipe import recipe


def get_config():
    c = recipe(target="ckpt/deepseek_v3", data="data/deepseek_v3", out_dir="runs/deepseek_v3")
    c.mesh = (1, 8, 1, 32)  # data, fsdp, tensor, expert: 256 devices
    return c
