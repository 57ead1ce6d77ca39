"""Stage 9d of issue 38's long run for SmolLM2: stage 8 continued in the reach it was trained with (matches of
2-4 tokens, no periodic continuation, its copy-bias table learning at 0.03), then read with the longer reach as
the shipped drafter is (``experiments/longer_reach.py``). Stage 8's recipe (``smollm2_135m_stage8.py``)
with these changes: it starts from stage 8 as kept (``assets/smollm2-135m-instruct-dflash-stage8``, bfloat16), 78
shards (11 new to it), 384 steps, seed 5, the validation every 128 steps (``train.steps=1
out_dir=runs/long38_s9d_val0`` gives stage 8's own on the same held-out answers, step 1's learning rate being 0).

Why: stages 9, 9b and 9c trained stage 8 with the longer reach (16-token matches, their copy-bias rows at 30) and
lost tau (9, 9b) or accuracy (9c: in 128 steps its held-out loss fell from 2.24 to 2.11 while the accuracy at
offsets 1-4 fell by 1-2 points and the decoded tau of its 4 held-out prompts from 2.75 to 2.66). The likely cause:
a copy at 30 logits that is wrong costs about 30 nats of cross-entropy, so the few wrong long copies lead the loss,
and the weights learn to outshout the copy rather than to predict better (docs/BENCHMARKS.md, "Stages 9c and
9d"). Stage 7 to 8, in the short reach, gained on every set. Ship only if, read with the longer reach, its tau at
block 16 beats the shipped drafter's on every set (3.56 / 3.47 / 2.97 / 2.38 / 2.34 on
``experiments/study_tau.py``'s 40 answers a set):

    .venv/bin/dflash-jax train --config experiments/smollm2/smollm2_135m_stage9d.py   # resumable
    .venv/bin/python experiments/longer_reach.py runs/long38_s9d/drafter runs/long38_s9d/reach --ngram-max 16 \\
        --periodic
    cp dflash_jax/assets/smollm2-135m-instruct-dflash/draft_vocab.json runs/long38_s9d/reach/
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    # Every field is stated here (no base config; configs/smollm2_135m.py describes each one). Comments give
    # stage 8's value where it differs; the others' from-scratch values are in configs/smollm2_135m_shipped.py.
    c = ConfigDict()
    c.target = "smollm2-135m-instruct"
    c.data = "data/smollm2-mix"
    c.data_shards = 78  # stage 8: 67
    c.out_dir = "runs/long38_s9d"
    c.seed = 5  # stage 8: 1
    c.init_from = "assets/smollm2-135m-instruct-dflash-stage8"  # stage 8: stage 7
    c.init_grow = False
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
    c.train.steps = 384  # stage 8: 512
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
    c.train.lr = 0.0005
    c.train.copy_bias_lr = 0.03
    c.train.objective = "ce"
    c.train.tv_weight = 0.5
    c.train.position_weights = "reach"
    c.train.selector_alpha = 1.0
    c.train.selector_stop_grad = False
    c.train.selector_objective = "ce"
    c.train.warmup_frac = 0.04
    c.train.weight_decay = 0.0
    c.train.b1 = 0.9
    c.train.b2 = 0.999
    c.train.grad_clip = 1.0
    c.train.compute_dtype = "float32"

    c.eval = ConfigDict()
    c.eval.every = 128  # stage 8: 256
    c.eval.val_size = 32
    c.eval.val_within_shards = 2
    c.eval.decode_prompts = 4
    c.eval.decode_max_new_tokens = 256
    c.eval.best_by = "loss"

    c.ckpt = ConfigDict()
    c.ckpt.every = 32
    c.ckpt.keep = 3
    return c
