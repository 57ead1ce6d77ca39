"""The CPU recipe that made the shipped SmolLM2 drafter (dflash_jax/assets/smollm2-135m-instruct-dflash).

Sized for 2 CPU cores: 2 drafter layers reading target layers (1, 14, 27); 4 sequences of at
most 384 tokens per step with 64 anchors each (the public recipe: 32 x 3072 with 512); block
16, gamma 7; AdamW 1.5e-3, 4% warmup then cosine; 600 steps, about 10 s each here (1.8 h).
Data: the target's own greedy answers (cap 256 tokens) to GSM8K-train and Alpaca prompts,
first 5 shards (640 answers):

    dflash-jax prepare-data --prompts ../shared/data/train/gsm8k_train.jsonl \\
        ../shared/data/train/alpaca_en_1k.json --max-new-tokens 256 --batch-size 16 \\
        --shard-size 128 --out data/smollm2-gsm8k-alpaca        # stop (or let it run) after 5 shards
    dflash-jax train --config configs/smollm2_135m_cpu.py
"""

from smollm2_135m import get_config as base


def get_config():
    c = base()
    c.data = "data/smollm2-gsm8k-alpaca"
    c.data_shards = 5
    c.out_dir = "runs/smollm2_v1"
    c.drafter.num_layers = 2
    c.drafter.target_layer_ids = (1, 14, 27)
    c.train.steps = 600
    c.train.batch_size = 4
    c.train.max_len = 384
    c.train.num_anchors = 64
    c.train.lr = 1.5e-3
    c.eval.every = 100
    c.eval.val_size = 32
    c.eval.decode_prompts = 4
    c.ckpt.every = 50
    return c
