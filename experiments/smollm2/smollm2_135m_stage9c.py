"""Stage 9c of issue 38's long run for SmolLM2: the drafter shipped since 2026-12-06's sixth session (stage 8 read
with a longer reach) trained 384 more steps at a fifth of the peak learning rate (1e-4, not 5e-4), on 78 shards
(11 of them new to it), its copy-bias table held where it is, as stage 9b. Stages 9 and 9b, warm restarts to 5e-4
from the same drafter (9 from its float32 run, 9b from the package's bfloat16 copy), lost tau (docs/BENCHMARKS.md,
after "Issue 38's long run: stages 7 and 8"). A lower rate should keep the drafter nearer where stage 8 left it and
let the new shards move it. Another data order (seed 4); the validation every 128 steps. The seed also draws the
32 held-out answers from the first 2 shards: held out from this run only (stages 7 and 8 trained on most of them),
so the validation compares this run's steps with its start, not stages with each other.
Ship it only if its tau at block 16 beats the shipped drafter's on every set (3.56 /
3.47 / 2.97 / 2.38 / 2.34 on ``experiments/study_tau.py``'s 40 answers a set). Resumable:

    .venv/bin/dflash-jax train --config experiments/smollm2/smollm2_135m_stage9c.py

The shipped drafter's own validation under this config (the same held-out answers and reach), the start
point: ``train.steps=1 out_dir=runs/long38_s9c_val0`` (step 1's learning rate is 0 in the warm-up).
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    # Every field is stated here (no base config; configs/smollm2_135m.py describes each one). Comments give
    # an earlier stage's value where it differs.
    c = ConfigDict()
    c.target = "smollm2-135m-instruct"
    c.data = "data/smollm2-mix"
    c.data_shards = 78  # stages 8-9b: 67, stage 7: 66
    c.out_dir = "runs/long38_s9c"
    c.seed = 4  # stage 7: 0, stage 8: 1, stage 9: 2, stage 9b: 3
    c.init_from = "dflash_jax/assets/smollm2-135m-instruct-dflash"  # the package folder: stage 8, longer reach
    c.mesh = (1, 1, 1)

    c.drafter = ConfigDict()
    c.drafter.num_layers = 2
    c.drafter.block_size = 16
    c.drafter.mask_token_id = None
    c.drafter.target_layer_ids = (1, 14, 27)
    c.drafter.layer_types = ()
    c.drafter.sliding_window = None
    c.drafter.block_input = "ngram"
    c.drafter.ngram_max = 16  # stage 8: 4
    c.drafter.ngram_min = 2
    c.drafter.ngram_periodic = True  # stage 8: False
    c.drafter.copy_bias = 30.0
    c.drafter.conv_kernel_size = 2
    c.drafter.conv_group_size = 16
    c.drafter.selector_rank = 64
    c.drafter.selector_top_k = 16

    c.train = ConfigDict()
    c.train.steps = 384  # stage 9: 512
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
    c.train.lr = 0.0001  # stages 8-9b: 0.0005, stage 7: 0.0007
    c.train.copy_bias_lr = 1e-6  # as stage 9b; stage 9: 0.03 (0 would mean train.lr)
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
    c.eval.every = 128  # stage 9b: 256
    c.eval.val_size = 32
    c.eval.val_within_shards = 2
    c.eval.decode_prompts = 4
    c.eval.decode_max_new_tokens = 256
    c.eval.best_by = "loss"

    c.ckpt = ConfigDict()
    c.ckpt.every = 32
    c.ckpt.keep = 3
    return c
