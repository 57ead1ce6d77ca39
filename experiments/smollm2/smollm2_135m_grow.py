"""Issue 38, drafter depth: stage 6 (the 2-layer drafter shipped then,
``assets/smollm2-135m-instruct-dflash-stage6``) grown to 4 layers (``init_grow``: its two layers first, two
added layers that start as the identity, so step 0 predicts exactly what stage 6 does), continued on the 61
made shards of ``data/smollm2-mix`` (36 of them new to it) for 192 steps. The
same-budget 2-layer arm is this config with ``drafter.num_layers=2 init_grow=False
out_dir=runs/grow/2layers``. Every other field is the long run's (``smollm2_135m_long38.py``); comments give
its value where a field differs. Judged by ``experiments/study_tau.py`` on the five sets (20 answers each,
block 16). Resumable:

    .venv/bin/dflash-jax train --config experiments/smollm2/smollm2_135m_grow.py
    .venv/bin/dflash-jax train --config experiments/smollm2/smollm2_135m_grow.py drafter.num_layers=2 \
        init_grow=False out_dir=runs/grow/2layers
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    # Every field is stated here (no base config; configs/smollm2_135m.py describes each one). Comments give
    # the long run's value ("long38:") where a field differs.
    c = ConfigDict()
    c.target = "smollm2-135m-instruct"
    c.data = "data/smollm2-mix"
    c.data_shards = 61  # long38: 48
    c.out_dir = "runs/grow/4layers"  # long38: "runs/long38"
    c.seed = 0
    c.init_from = "assets/smollm2-135m-instruct-dflash-stage6"  # stage 6, shipped when this ran
    c.init_grow = True  # long38: False
    c.mesh = (1, 1, 1)

    c.drafter = ConfigDict()
    c.drafter.num_layers = 4  # long38: 2
    c.drafter.block_size = 16
    c.drafter.mask_token_id = None
    c.drafter.target_layer_ids = (1, 14, 27)
    c.drafter.layer_types = ()
    c.drafter.sliding_window = None
    c.drafter.block_input = "ngram"
    c.drafter.ngram_max = 4
    c.drafter.ngram_min = 2
    c.drafter.copy_bias = 30.0
    c.drafter.conv_kernel_size = 2
    c.drafter.conv_group_size = 16
    c.drafter.selector_rank = 64
    c.drafter.selector_top_k = 16

    c.train = ConfigDict()
    c.train.steps = 192  # long38: 1536
    c.train.batch_size = 4
    c.train.grad_accum = 1
    c.train.max_len = 384
    c.train.num_anchors = 64
    c.train.anchor_chunk = 8
    c.train.remat = False
    c.train.stored_features = False
    c.train.gamma = 7.0
    c.train.loss_offsets = 8
    c.train.length_buckets = ()
    c.train.lr = 0.0007
    c.train.copy_bias_lr = 0.03
    c.train.selector_alpha = 1.0
    c.train.selector_stop_grad = False
    c.train.warmup_frac = 0.04
    c.train.weight_decay = 0.0
    c.train.b1 = 0.9
    c.train.b2 = 0.999
    c.train.grad_clip = 1.0
    c.train.compute_dtype = "float32"
    c.train.objective = "ce"
    c.train.tv_weight = 0.5
    c.train.position_weights = "reach"

    c.eval = ConfigDict()
    c.eval.every = 96  # long38: 256
    c.eval.val_size = 32
    c.eval.val_within_shards = 2
    c.eval.decode_prompts = 0  # long38: 4 (study_tau judges)
    c.eval.decode_max_new_tokens = 256
    c.eval.best_by = "loss"

    c.ckpt = ConfigDict()
    c.ckpt.every = 32
    c.ckpt.keep = 3
    return c
