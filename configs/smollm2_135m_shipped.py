"""The recipe of the drafter shipped for SmolLM2-135M-Instruct (``dflash_jax/assets/smollm2-135m-instruct-dflash``,
what ``--drafter auto`` picks for the embedded target), as one file.

It reproduces the shipped drafter's last stage, stage 6 (issue 21's arm ``copy2_off8_dflash2``, 259 steps, about
0.4 h on 2 CPU cores): it starts from the stage-5 drafter kept in the repository
(``assets/smollm2-135m-instruct-dflash-stage5``: a DFlash drafter, 2 layers reading target layers 1, 14, 27,
block 16, trained 3800 steps in five stages, ``experiments/smollm2/smollm2_135m_cpu*.py``) and continues it as a
DFlash 2 drafter (grouped dynamic causal convolutions of kernel 2 over groups of 16 channels, from the identity; a
candidate selector of rank 64 over the head's top 16, from random) whose block input is prompt lookup's
continuation where the last 2 or more committed tokens occurred before (mask tokens elsewhere), with a learned
copy bias starting at 30 on its own learning rate (0.03), on offsets 1..8, lr 7e-4, 4 x 384 tokens x 64 anchors a
step, stored target features, on the first 5 shards of ``data/smollm2-mix`` (640 of the target's own answers,
kept in git) with 32 answers of the first 2 held out. Every field equals the shipped drafter's
``train_config.json`` but ``out_dir`` and ``init_from`` (it named the stage-5 drafter by the folder it was in then,
``assets/smollm2-135m-instruct-dflash``; the same files) and ``eval.best_by`` (added later; the shipped drafter is
the run's final one, ``drafter/``, not ``best/``). Stages 1-5 and the studies that chose this recipe are in
``experiments/smollm2/`` (docs/BENCHMARKS.md, "The shipped SmolLM2 drafter").

    .venv/bin/dflash-jax prepare-data --prompts ../shared/data/train/gsm8k_train.jsonl \\
        ../shared/data/train/alpaca_en_1k.json ../shared/data/train/alpaca_5000.json \\
        ../shared/data/train/code_alpaca_2k.json ../shared/data/train/new_codealpaca.json \\
        --max-new-tokens 256 --batch-size 16 --shard-size 128 --out data/smollm2-mix   # 5 shards are in git
    .venv/bin/dflash-jax prepare-features --config configs/smollm2_135m_shipped.py     # about 3 min a shard
    .venv/bin/dflash-jax train --config configs/smollm2_135m_shipped.py                # about 5 s a step
    .venv/bin/dflash-jax ship-drafter runs/smollm2_135m_shipped --which drafter --out runs/shipped \\
        --continues assets/smollm2-135m-instruct-dflash-stage5 --draft-vocab data/smollm2-mix  # then: 6 shards

Resumable: rerun the same command after an interruption.
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    # Every field is stated here (no base config). Where a field differs from the from-scratch CPU recipe
    # configs/smollm2_135m.py (which describes each one), a comment gives that file's value.
    c = ConfigDict()
    c.target = "smollm2-135m-instruct"
    c.data = "data/smollm2-mix"  # smollm2_135m.py: "data/smollm2"
    c.data_shards = 5  # smollm2_135m.py: 0
    c.out_dir = "runs/smollm2_135m_shipped"  # smollm2_135m.py: "runs/smollm2_135m"
    c.seed = 0
    c.init_from = "assets/smollm2-135m-instruct-dflash-stage5"  # smollm2_135m.py: ""
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
    c.train.steps = 259  # smollm2_135m.py: 2000
    c.train.batch_size = 4  # smollm2_135m.py: 8
    c.train.grad_accum = 1
    c.train.max_len = 384  # smollm2_135m.py: 512
    c.train.num_anchors = 64
    c.train.anchor_chunk = 8  # smollm2_135m.py: 16
    c.train.remat = False  # smollm2_135m.py: True
    c.train.stored_features = True  # smollm2_135m.py: False
    c.train.gamma = 7.0
    c.train.loss_offsets = 8  # smollm2_135m.py: 0
    c.train.length_buckets = ()
    c.train.lr = 0.0007  # smollm2_135m.py: 0.0006
    c.train.copy_bias_lr = 0.03  # smollm2_135m.py: 0.0
    c.train.selector_alpha = 1.0
    c.train.selector_stop_grad = False
    c.train.warmup_frac = 0.04
    c.train.weight_decay = 0.0
    c.train.b1 = 0.9
    c.train.b2 = 0.999
    c.train.grad_clip = 1.0
    c.train.compute_dtype = "float32"

    c.eval = ConfigDict()
    c.eval.every = 259  # smollm2_135m.py: 200
    c.eval.val_size = 32
    c.eval.val_within_shards = 2  # smollm2_135m.py: 0
    c.eval.decode_prompts = 4
    c.eval.decode_max_new_tokens = 256  # smollm2_135m.py: 64
    c.eval.best_by = "loss"

    c.ckpt = ConfigDict()
    c.ckpt.every = 40  # smollm2_135m.py: 100
    c.ckpt.keep = 3
    return c
