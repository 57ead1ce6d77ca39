"""Stage 1 of the SmolLM2 drafter shipped until 2026-12-02 (assets/smollm2-135m-instruct-dflash-stage5), the CPU
recipe that the shipped drafter continues (configs/smollm2_135m_shipped.py).

Sized for 2 CPU cores: 2 drafter layers reading target layers (1, 14, 27); 4 sequences of at
most 384 tokens per step with 64 anchors each (the public recipe: 32 x 3072 with 512); block
16, gamma 7; AdamW 1.5e-3, 4% warmup then cosine; 600 steps, about 10 s each here (1.8 h).
Data: the target's own greedy answers (cap 256 tokens) to GSM8K-train and Alpaca prompts,
first 5 shards (640 answers):

    dflash-jax prepare-data --prompts ../shared/data/train/gsm8k_train.jsonl \\
        ../shared/data/train/alpaca_en_1k.json --max-new-tokens 256 --batch-size 16 \\
        --shard-size 128 --out data/smollm2-gsm8k-alpaca        # stop (or let it run) after 5 shards
    dflash-jax train --config experiments/smollm2/smollm2_135m_cpu.py
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    # Every field is stated here (no base config; each one is described in configs/smollm2_135m.py). Where a field
    # differs from configs/smollm2_135m.py, a comment gives that config's value.
    c = ConfigDict()
    c.target = "smollm2-135m-instruct"
    c.data = "data/smollm2-gsm8k-alpaca"  # configs/smollm2_135m.py: "data/smollm2"
    c.data_shards = 5  # configs/smollm2_135m.py: 0
    c.out_dir = "runs/smollm2_v1"  # configs/smollm2_135m.py: "runs/smollm2_135m"
    c.seed = 0
    c.init_from = ""
    c.mesh = (1, 1, 1)

    c.drafter = ConfigDict()
    c.drafter.num_layers = 2  # configs/smollm2_135m.py: 1
    c.drafter.block_size = 16
    c.drafter.mask_token_id = None
    c.drafter.target_layer_ids = (1, 14, 27)  # configs/smollm2_135m.py: ()
    c.drafter.layer_types = ()
    c.drafter.sliding_window = None
    c.drafter.block_input = "mask"
    c.drafter.ngram_max = 4
    c.drafter.ngram_min = 1
    c.drafter.copy_bias = None
    c.drafter.conv_kernel_size = 0
    c.drafter.conv_group_size = 16
    c.drafter.selector_rank = 0
    c.drafter.selector_top_k = 16

    c.train = ConfigDict()
    c.train.steps = 600  # configs/smollm2_135m.py: 2000
    c.train.batch_size = 4  # configs/smollm2_135m.py: 8
    c.train.grad_accum = 1
    c.train.max_len = 384  # configs/smollm2_135m.py: 512
    c.train.num_anchors = 64
    c.train.anchor_chunk = 16
    c.train.remat = True
    c.train.stored_features = False
    c.train.gamma = 7.0
    c.train.loss_offsets = 0
    c.train.length_buckets = ()
    c.train.lr = 0.0015  # configs/smollm2_135m.py: 0.0006
    c.train.copy_bias_lr = 0.0
    c.train.selector_alpha = 1.0
    c.train.selector_stop_grad = False
    c.train.warmup_frac = 0.04
    c.train.weight_decay = 0.0
    c.train.b1 = 0.9
    c.train.b2 = 0.999
    c.train.grad_clip = 1.0
    c.train.compute_dtype = "float32"

    c.eval = ConfigDict()
    c.eval.every = 100  # configs/smollm2_135m.py: 200
    c.eval.val_size = 32
    c.eval.val_within_shards = 0
    c.eval.decode_prompts = 4
    c.eval.decode_max_new_tokens = 64
    c.eval.best_by = "loss"

    c.ckpt = ConfigDict()
    c.ckpt.every = 50  # configs/smollm2_135m.py: 100
    c.ckpt.keep = 3
    return c
