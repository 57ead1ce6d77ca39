"""Issue 38's long run for SmolLM2 on this 2-core CPU: stage 6, the drafter shipped
then (``assets/smollm2-135m-instruct-dflash-stage6``), continued on ``data/smollm2-mix`` with the objective study's
choice (``experiments/smollm2/smollm2_135m_objectives.py``, docs/BENCHMARKS.md "Issue 38's objective study"): the
answer's tokens with each offset weighted by the block's chance of reaching it (``ce_reach``). Every other field is
the study's; comments give its value where a field differs. About 8 s a step of 4 answers here; resumable.

As it ran (docs/BENCHMARKS.md, "Issue 38's long run: stages 7 and 8"), in two stages:

    # 1024 steps on the 66 shards made then (2.4 h); kept in bfloat16 as assets/smollm2-135m-instruct-dflash-long1024
    .venv/bin/dflash-jax train --config experiments/smollm2/smollm2_135m_long38.py \\
        data_shards=66 train.steps=1024 out_dir=runs/long38_1024
    # 512 more on 67 shards, another data order (seed 1), a lower peak learning rate (1.3 h)
    .venv/bin/dflash-jax train --config experiments/smollm2/smollm2_135m_long38.py \\
        init_from=runs/long38_1024/drafter data_shards=67 seed=1 train.lr=0.0005 train.steps=512 \\
        out_dir=runs/long38_more

The fields below are the plan it was written with (48 shards, 1536 steps).
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    # Every field is stated here (no base config; configs/smollm2_135m.py describes each one). Comments give
    # the objective study's value ("objectives:") or stage 6's recipe ("stage 6:") where a field differs.
    c = ConfigDict()
    c.target = "smollm2-135m-instruct"
    c.data = "data/smollm2-mix"
    c.data_shards = 48
    c.out_dir = "runs/long38"  # objectives: "runs/study38/<arm>"
    c.seed = 0
    c.init_from = "assets/smollm2-135m-instruct-dflash-stage6"  # stage 6, shipped when this ran
    c.mesh = (1, 1, 1)

    c.drafter = ConfigDict()
    c.drafter.num_layers = 2
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
    c.train.steps = 1536  # objectives: the arm's (127-167)
    c.train.batch_size = 4
    c.train.grad_accum = 1
    c.train.max_len = 384
    c.train.num_anchors = 64
    c.train.anchor_chunk = 8
    c.train.remat = False
    c.train.stored_features = False  # stage 6: True
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
    c.train.position_weights = "reach"  # objectives: the arm's

    c.eval = ConfigDict()
    c.eval.every = 256  # objectives: the arm's steps
    c.eval.val_size = 32
    c.eval.val_within_shards = 2
    c.eval.decode_prompts = 4
    c.eval.decode_max_new_tokens = 256
    c.eval.best_by = "loss"

    c.ckpt = ConfigDict()
    c.ckpt.every = 32  # objectives: 40
    c.ckpt.keep = 3
    return c
