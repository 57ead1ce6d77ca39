"""The public DFlash recipe (SpecForge example for Qwen3-8B; SPEC "Training" 7), shared by the
large-target configs. Not a config itself (no get_config)."""

from ml_collections import ConfigDict
from smollm2_135m import get_config as base  # every field, documented there


def recipe(target: str, data: str, out_dir: str, num_layers: int = 5) -> ConfigDict:
    """AdamW lr 6e-4, 4% warmup then cosine, clip 1.0, length 3072, 32 sequences per step, 512
    anchors, block 16, gamma 7, bf16 compute with float32 master weights, 10k steps; on 8 devices as
    (data 1, fsdp 2, tensor 4), the memory plan's first mesh for an 8B target (about 16 GiB a device,
    docs/BENCHMARKS.md "Memory plans"; override with mesh=(...) for other device counts)."""
    c = base()
    c.target, c.data, c.out_dir = target, data, out_dir
    c.mesh = (1, 2, 4)  # data, fsdp, tensor
    c.drafter.num_layers = num_layers
    c.drafter.block_size = 16
    c.train.update(
        dict(
            steps=10_000,
            batch_size=32,
            grad_accum=4,
            max_len=3072,
            num_anchors=512,
            anchor_chunk=32,
            gamma=7.0,
            lr=6e-4,
            warmup_frac=0.04,
            weight_decay=0.0,
            grad_clip=1.0,
            compute_dtype="bfloat16",
        )
    )
    c.eval.update(dict(every=500, val_size=256, decode_prompts=8, decode_max_new_tokens=256))
    c.ckpt.update(dict(every=500, keep=3))
    return c
