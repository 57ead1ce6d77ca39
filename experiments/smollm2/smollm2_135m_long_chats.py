"""Issue 38, long context: stage 6, the drafter shipped then (``assets/smollm2-135m-instruct-dflash-stage6``, trained
on single-turn sequences of at most 384 tokens) continued on multi-turn chats of about 2048 tokens
(``experiments/long_chats.py`` over shards 0-29 of ``data/smollm2-mix``, 468 chats, the loss on every
assistant turn), so that it sees the positions and the earlier turns it is served with. Every other field
is the long run's (``smollm2_135m_long38.py``); comments give its value where a field differs. Measured
before and after on ``experiments/study_long_context.py --kinds chat-paired`` (shards 30-41, held out
here) and on the five benchmark sets (``experiments/study_tau.py``). Resumable:

    .venv/bin/python experiments/long_chats.py --shards 0 30 --length 2048 --out runs/long_chats/chats.jsonl
    .venv/bin/dflash-jax prepare-data --conversations runs/long_chats/chats.jsonl --out runs/long_chats/data \
        --shard-size 128
    .venv/bin/dflash-jax train --config experiments/smollm2/smollm2_135m_long_chats.py
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    # Every field is stated here (no base config; configs/smollm2_135m.py describes each one). Comments give
    # the long run's value ("long38:") where a field differs from it.
    c = ConfigDict()
    c.target = "smollm2-135m-instruct"
    c.data = "runs/long_chats/data"  # long38: "data/smollm2-mix"
    c.data_shards = 0  # long38: 48
    c.out_dir = "runs/long_chats"
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
    c.train.steps = 128  # long38: 1536
    c.train.batch_size = 1  # long38: 4 (of 384 tokens)
    c.train.grad_accum = 1
    c.train.max_len = 2048  # long38: 384
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
    c.eval.every = 128  # long38: 256
    c.eval.val_size = 8  # long38: 32
    c.eval.val_within_shards = 0  # long38: 2
    c.eval.decode_prompts = 0  # long38: 4 (measured apart, study_long_context.py)
    c.eval.decode_max_new_tokens = 256
    c.eval.best_by = "loss"

    c.ckpt = ConfigDict()
    c.ckpt.every = 32
    c.ckpt.keep = 3
    return c
