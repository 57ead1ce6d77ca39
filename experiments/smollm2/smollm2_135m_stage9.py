"""Stage 9 of issue 38's long run for SmolLM2: stage 8 (the drafter shipped 2026-12-06, its float32 run
``runs/long38_more/drafter``; where ``runs/`` is lost, its bfloat16 copy: add
``init_from=assets/smollm2-135m-instruct-dflash-stage8``) continued with a longer reach
for its block input: n-gram matches up to 16 tokens (``ngram_max`` 4 before), each length with its own row of the
copy bias (the 12 new rows start at ``copy_bias``, 30: ``init_from`` grows the table), and continuations that go
on past the anchor with the match's period (``ngram_periodic``: a loop continued). Measured before training
(stage 8's weights read this way, ``experiments/study_tau.py`` on 40 answers a set, block 16): 3.56 / 3.47 /
2.97 / 2.38 / 2.34 against stage 8's 3.52 / 3.33 / 2.86 / 2.36 / 2.29 (docs/BENCHMARKS.md, "A longer reach
for the block input"). The rest is stage 8's recipe (``experiments/smollm2/smollm2_135m_long38.py``)
with another data order (seed 2; it also draws another held-out split, so its validation figures do not compare
with stage 8's). Outcome (2026-12-06): below stage 8 read with the same reach untrained, GSM8K 3.48, MATH-500 3.28,
HumanEval 2.91 on those answers (``docs/bench/issue38/stage9_tau40.jsonl``); not shipped. Resumable:

    .venv/bin/dflash-jax train --config experiments/smollm2/smollm2_135m_stage9.py
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    # Every field is stated here (no base config; configs/smollm2_135m.py describes each one). Comments give
    # an earlier stage's value where it differs.
    c = ConfigDict()
    c.target = "smollm2-135m-instruct"
    c.data = "data/smollm2-mix"
    c.data_shards = 67
    c.out_dir = "runs/long38_s9"
    c.seed = 2  # stage 7: 0, stage 8: 1
    c.init_from = "runs/long38_more/drafter"  # stage 8 in float32
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
    c.train.steps = 512
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
    c.train.lr = 0.0005  # stage 7: 0.0007
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
    c.eval.every = 256
    c.eval.val_size = 32
    c.eval.val_within_shards = 2
    c.eval.decode_prompts = 4
    c.eval.decode_max_new_tokens = 256
    c.eval.best_by = "loss"

    c.ckpt = ConfigDict()
    c.ckpt.every = 32
    c.ckpt.keep = 3
    return c
