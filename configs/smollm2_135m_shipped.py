"""The recipe of the drafter shipped for SmolLM2-135M-Instruct (``dflash_jax/assets/smollm2-135m-instruct-dflash``,
what ``--drafter auto`` picks for the embedded target), as one file.

It reproduces the shipped drafter's last training stage, stage 11 (issue 38's long run: 512 steps, about 1 h on 2
CPU cores; ``experiments/smollm2/smollm2_135m_stage11.py`` but for ``out_dir``), whose final weights are then
averaged with the stage they continued, half and half (``ship-drafter --average-with``: checkpoint averaging), kept
so in ``assets/smollm2-135m-instruct-dflash-stage11``. It continues stage 10 (``assets/smollm2-135m-instruct-dflash-
stage10``, the drafter shipped before it; its recipe as one file: ``experiments/smollm2/smollm2_135m_stage10.py``,
which continued stage 8, ``experiments/smollm2/smollm2_135m_stage8.py``) on the same answers with another seed: 93
shards of ``data/smollm2-mix``, 8 of ``data/smollm2-math`` and 10 of ``data/smollm2-chats`` (the target's own
answers to templated competition mathematics and to open-ended chat prompts, ``experiments/math_prompts.py`` and
``experiments/chat_prompts.py``), the two domain folders repeated twice. The package reads it with a longer reach
(``experiments/longer_reach.py``, no training): prompt-lookup matches of up to 16 tokens with periodic
continuations, as it read stages 8 and 10. Its tau at block 16 on 40 answers a set is above stage 10's on all five
sets, and on 20 held-out answers a set (docs/BENCHMARKS.md, "Stage 11, averaged with stage 10,
shipped").

    .venv/bin/dflash-jax train --config configs/smollm2_135m_shipped.py   # resumable
    .venv/bin/dflash-jax ship-drafter runs/smollm2_135m_shipped --out assets/smollm2-135m-instruct-dflash-stage11 \\
        --which drafter --continues assets/smollm2-135m-instruct-dflash-stage10 --target-name SmolLM2-135M-Instruct \\
        --hardware '2 CPU cores' --average-with assets/smollm2-135m-instruct-dflash-stage10 --average-weight 0.5
    cp dflash_jax/assets/smollm2-135m-instruct-dflash/draft_vocab.json assets/smollm2-135m-instruct-dflash-stage11/
    .venv/bin/python experiments/longer_reach.py assets/smollm2-135m-instruct-dflash-stage11 \\
        dflash_jax/assets/smollm2-135m-instruct-dflash --ngram-max 16 --periodic --tree-temperature 1.5 \\
        --dtype bfloat16 --with-record --overwrite
    cp assets/smollm2-135m-instruct-dflash-stage11/draft_vocab.json dflash_jax/assets/smollm2-135m-instruct-dflash/
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    # Every field is stated here (no base config). Where a field differs from the from-scratch CPU recipe
    # configs/smollm2_135m.py (which describes each one), a comment gives that file's value.
    c = ConfigDict()
    c.target = "smollm2-135m-instruct"
    c.data = ("data/smollm2-mix", "data/smollm2-math", "data/smollm2-chats")  # smollm2_135m.py: "data/smollm2"
    c.data_shards = (93, 8, 10)  # smollm2_135m.py: 0
    c.data_repeats = (1, 2, 2)  # smollm2_135m.py: 1
    c.out_dir = "runs/smollm2_135m_shipped"  # smollm2_135m.py: "runs/smollm2_135m"
    c.seed = 7  # smollm2_135m.py: 0
    c.init_from = "assets/smollm2-135m-instruct-dflash-stage10"  # smollm2_135m.py: ""
    c.init_grow = False
    c.mesh = (1, 1, 1)

    c.drafter = ConfigDict()
    c.drafter.num_layers = 2  # smollm2_135m.py: 1
    c.drafter.block_size = 16
    c.drafter.mask_token_id = None
    c.drafter.target_layer_ids = (1, 14, 27)  # smollm2_135m.py: ()
    c.drafter.layer_types = ()
    c.drafter.sliding_window = None
    c.drafter.block_input = "ngram"  # smollm2_135m.py: "mask"
    c.drafter.ngram_max = 4
    c.drafter.ngram_min = 2  # smollm2_135m.py: 1
    c.drafter.copy_bias = 30.0  # smollm2_135m.py: None
    c.drafter.conv_kernel_size = 2  # smollm2_135m.py: 0
    c.drafter.conv_group_size = 16
    c.drafter.selector_rank = 64  # smollm2_135m.py: 0
    c.drafter.selector_top_k = 16

    c.train = ConfigDict()
    c.train.steps = 512  # smollm2_135m.py: 2000
    c.train.batch_size = 4  # smollm2_135m.py: 8
    c.train.grad_accum = 1
    c.train.max_len = 384  # smollm2_135m.py: 512
    c.train.num_anchors = 64
    c.train.anchor_chunk = 8  # smollm2_135m.py: 16
    c.train.remat = False  # smollm2_135m.py: True
    c.train.stored_features = False
    c.train.gamma = 7.0
    c.train.loss_offsets = 8  # smollm2_135m.py: 0
    c.train.length_buckets = ()
    c.train.lr = 0.0005  # smollm2_135m.py: 0.0006
    c.train.copy_bias_lr = 0.03  # smollm2_135m.py: 0.0
    c.train.objective = "ce"
    c.train.tv_weight = 0.5
    c.train.position_weights = "reach"  # smollm2_135m.py: "decay"
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
    c.eval.every = 128  # smollm2_135m.py: 200
    c.eval.val_size = 32
    c.eval.val_within_shards = 2  # smollm2_135m.py: 0
    c.eval.decode_prompts = 4
    c.eval.decode_max_new_tokens = 256  # smollm2_135m.py: 64
    c.eval.best_by = "loss"

    c.ckpt = ConfigDict()
    c.ckpt.every = 32  # smollm2_135m.py: 100
    c.ckpt.keep = 3
    return c
