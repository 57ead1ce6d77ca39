"""Issue 38, a pilot: the math pilot's question for MT-Bench. Does a quarter of the answers in MT-Bench's manner
(open-ended writing, planning, role-play and reasoning, from ``experiments/chat_prompts.py``; ``data/smollm2-chats``,
the first 8 shards: 1024 answers) move the drafter's own tokens on MT-Bench, where 384 more steps on the mix did not
(stage 9d, ``smollm2_135m_stage9d.py``)? Stage 9d with that one change, as ``smollm2_135m_math_pilot.py`` is for
mathematics.

    .venv/bin/python experiments/chat_prompts.py --count 2048 --out data/prompts/chat_templates.jsonl --check
    .venv/bin/dflash-jax prepare-data --prompts data/prompts/chat_templates.jsonl --format plain \
        --max-new-tokens 256 --batch-size 16 --shard-size 128 --out data/smollm2-chats
    .venv/bin/dflash-jax train --config experiments/smollm2/smollm2_135m_chat_pilot.py   # resumable
    .venv/bin/python experiments/longer_reach.py runs/chat_pilot/drafter runs/chat_pilot/reach --ngram-max 16 \
        --periodic
    cp dflash_jax/assets/smollm2-135m-instruct-dflash/draft_vocab.json runs/chat_pilot/reach/
    .venv/bin/python experiments/study_tau.py --records docs/bench/tree/tree40.records.jsonl --per-set 40 \
        --blocks 16 --ngram off --draft-vocab 8192 --drafter chat_pilot=runs/chat_pilot/reach \
        --out docs/bench/issue38/chat_pilot_tau40.jsonl
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    # Every field is stated here (no base config; configs/smollm2_135m.py describes each one). Comments give
    # stage 9d's value where it differs; configs/smollm2_135m_shipped.py gives the from-scratch values.
    c = ConfigDict()
    c.target = "smollm2-135m-instruct"
    c.data = ("data/smollm2-mix", "data/smollm2-chats")  # stage 9d: the mix alone
    c.data_shards = (24, 8)  # stage 9d: 78
    c.out_dir = "runs/chat_pilot"
    c.seed = 5
    c.init_from = "assets/smollm2-135m-instruct-dflash-stage8"
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
    c.train.steps = 384
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
    c.eval.every = 128
    c.eval.val_size = 32
    c.eval.val_within_shards = 2
    c.eval.decode_prompts = 4
    c.eval.decode_max_new_tokens = 256
    c.eval.best_by = "loss"

    c.ckpt = ConfigDict()
    c.ckpt.every = 32
    c.ckpt.keep = 3
    return c
