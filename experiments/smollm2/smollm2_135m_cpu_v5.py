"""Stage 5 of the SmolLM2 drafter shipped until 2026-12-02: stage 4 (smollm2_135m_cpu_v4.py) on more answers.

Stage 4's validation loss was still falling when its schedule ended, and every batch of new
answers has paid so far (stage 4's 1536 new answers: validation loss 3.46 -> 3.20), so stage 5
starts from stage 4's best drafter (``init_from``) on the first 37 shards (4736 answers, 2176 of
them new), holding out the same 32 answers as stages 2-4 (``eval.val_within_shards=8``, the same
seed and ``val_size``). Fresh AdamW state, warmup + cosine schedule at stage 4's peak (7e-4).
500 steps (about 32 min here) read 2000 answers: 43% of the training split, the most one
session's time allowed after generating the new shards.
Resumable: rerun the same command after an interruption.

    dflash-jax prepare-data ...          # as in experiments/smollm2/smollm2_135m_cpu.py, until 37 shards exist
    dflash-jax train --config experiments/smollm2/smollm2_135m_cpu.py       # stage 1 -> runs/smollm2_v1/best
    dflash-jax train --config experiments/smollm2/smollm2_135m_cpu_v2.py    # stage 2 -> runs/smollm2_v2/best
    dflash-jax train --config experiments/smollm2/smollm2_135m_cpu_v3.py    # stage 3 -> runs/smollm2_v3/best
    dflash-jax prepare-features --config experiments/smollm2/smollm2_135m_cpu_v4.py   # about 70 s per shard here
    dflash-jax train --config experiments/smollm2/smollm2_135m_cpu_v4.py    # stage 4 -> runs/smollm2_v4/best
    dflash-jax prepare-features --config experiments/smollm2/smollm2_135m_cpu_v5.py   # the new shards' features
    dflash-jax train --config experiments/smollm2/smollm2_135m_cpu_v5.py    # stage 5 -> runs/smollm2_v5/best
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    # Every field is stated here (no base config; each one is described in configs/smollm2_135m.py). Where a field
    # differs from the config this one continues (smollm2_135m_cpu_v4.py), a comment gives that config's value.
    c = ConfigDict()
    c.target = "smollm2-135m-instruct"
    c.data = "data/smollm2-gsm8k-alpaca"
    c.data_shards = 37  # smollm2_135m_cpu_v4.py: 20
    c.out_dir = "runs/smollm2_v5"  # smollm2_135m_cpu_v4.py: "runs/smollm2_v4"
    c.seed = 0
    c.init_from = "runs/smollm2_v4/best"  # smollm2_135m_cpu_v4.py: "runs/smollm2_v3/best"
    c.mesh = (1, 1, 1)

    c.drafter = ConfigDict()
    c.drafter.num_layers = 2
    c.drafter.block_size = 16
    c.drafter.mask_token_id = None
    c.drafter.target_layer_ids = (1, 14, 27)
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
    c.train.steps = 500  # smollm2_135m_cpu_v4.py: 1000
    c.train.batch_size = 4
    c.train.grad_accum = 1
    c.train.max_len = 384
    c.train.num_anchors = 64
    c.train.anchor_chunk = 8
    c.train.remat = False
    c.train.stored_features = True
    c.train.gamma = 7.0
    c.train.loss_offsets = 8
    c.train.length_buckets = ()
    c.train.lr = 0.0007
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
    c.eval.every = 150
    c.eval.val_size = 32
    c.eval.val_within_shards = 8
    c.eval.decode_prompts = 4
    c.eval.decode_max_new_tokens = 256
    c.eval.best_by = "loss"

    c.ckpt = ConfigDict()
    c.ckpt.every = 50
    c.ckpt.keep = 3
    return c
