"""Issue 20's pilot: the shipped SmolLM2 drafter (stage 5) continued on the new mixed answers.

The data is ``data/smollm2-mix``: the target's own greedy answers (cap 256 tokens) to GSM8K-train,
both Alpaca sets and both code-instruction sets (``../shared/data/train``), shuffled together by
``prepare-data``, so any prefix of its shards is a mix of all five. This config continues the
shipped drafter (``init_from`` the asset: 2 layers reading target layers 1, 14, 27, block 16)
on the first 5 shards with stage 5's settings (lr 7e-4, loss offsets 1..8, stored features), 32
answers of the first 2 shards held out. ``smollm2_135m_mix_ngram.py`` is the same run with the
n-gram continuation in the blocks (``drafter.block_input="ngram"``): the pair compares the two
block inputs at equal compute. Resumable: rerun the same command after an interruption.

    dflash-jax prepare-data --prompts ../shared/data/train/gsm8k_train.jsonl \\
        ../shared/data/train/alpaca_en_1k.json ../shared/data/train/alpaca_5000.json \\
        ../shared/data/train/code_alpaca_2k.json ../shared/data/train/new_codealpaca.json \\
        --max-new-tokens 256 --batch-size 16 --shard-size 128 --out data/smollm2-mix
    dflash-jax prepare-features --config experiments/smollm2/smollm2_135m_mix.py
    dflash-jax train --config experiments/smollm2/smollm2_135m_mix.py
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    # Every field is stated here (no base config; each one is described in configs/smollm2_135m.py). Where a field
    # differs from the config this one continues (smollm2_135m_cpu_v5.py), a comment gives that config's value.
    c = ConfigDict()
    c.target = "smollm2-135m-instruct"
    c.data = "data/smollm2-mix"  # smollm2_135m_cpu_v5.py: "data/smollm2-gsm8k-alpaca"
    c.data_shards = 5  # smollm2_135m_cpu_v5.py: 37
    c.out_dir = "runs/mix_mask"  # smollm2_135m_cpu_v5.py: "runs/smollm2_v5"
    c.seed = 0
    c.init_from = "assets/smollm2-135m-instruct-dflash-stage5"  # smollm2_135m_cpu_v5.py: "runs/smollm2_v4/best"
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
    c.train.steps = 100  # smollm2_135m_cpu_v5.py: 500
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
    c.eval.every = 100  # smollm2_135m_cpu_v5.py: 150
    c.eval.val_size = 32
    c.eval.val_within_shards = 2  # smollm2_135m_cpu_v5.py: 8
    c.eval.decode_prompts = 4
    c.eval.decode_max_new_tokens = 256
    c.eval.best_by = "loss"

    c.ckpt = ConfigDict()
    c.ckpt.every = 50
    c.ckpt.keep = 3
    return c
