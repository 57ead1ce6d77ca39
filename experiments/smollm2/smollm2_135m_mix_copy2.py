"""Issue 20's long run: the shipped drafter reading prompt lookup, trained on the mixed answers.

It starts where ``experiments/copy_drafter.py`` puts the shipped (mask-token) drafter without training:
the prompt-lookup continuation as the block input wherever the last 2 or more committed tokens
occurred before (``drafter.ngram_min=2``; the shorter matches are right a quarter of the time), a
copy bias of 30 on every matched length and offset (larger than the drafter's logit margins, so
it starts out keeping the continuation: a bias of 6 lost to prompt lookup on four sets of five,
docs/BENCHMARKS.md "A mask-token drafter reading prompt lookup"), and mask tokens where there is
no match, exactly the blocks the shipped drafter was trained on. From there it learns, with the
table on its own learning rate, how far to trust each matched length and offset, and what follows
a continuation: every offset 1..15 is supervised (the shipped drafter's offsets 9..15 never were),
since a block-16 copy needs all of them.

Data: the first 5 shards of ``data/smollm2-mix`` (kept in git; ``prepare-data`` adds shards) with
32 answers of the first 2 held out, as the fixed-budget study. Resumable: rerun the same command
after an interruption (a later stage on more shards continues it through ``init_from``).

    dflash-jax prepare-data ...     # the command in smollm2_135m_mix.py (5 shards at least)
    dflash-jax prepare-features --config experiments/smollm2/smollm2_135m_mix_copy2.py   # about 3 min a shard here
    dflash-jax train --config experiments/smollm2/smollm2_135m_mix_copy2.py
    .venv/bin/python experiments/study_tau.py --per-set 20 --blocks 4 8 16 \\
        --drafter copy2=runs/mix_copy2/best --out docs/bench/issue20/study_tau.jsonl
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    # Every field is stated here (no base config; each one is described in configs/smollm2_135m.py). Where a field
    # differs from the config this one continues (smollm2_135m_mix.py), a comment gives that config's value.
    c = ConfigDict()
    c.target = "smollm2-135m-instruct"
    c.data = "data/smollm2-mix"
    c.data_shards = 5
    c.out_dir = "runs/mix_copy2"  # smollm2_135m_mix.py: "runs/mix_mask"
    c.seed = 0
    c.init_from = "assets/smollm2-135m-instruct-dflash-stage5"
    c.mesh = (1, 1, 1)

    c.drafter = ConfigDict()
    c.drafter.num_layers = 2
    c.drafter.block_size = 16
    c.drafter.mask_token_id = None
    c.drafter.target_layer_ids = (1, 14, 27)
    c.drafter.layer_types = ()
    c.drafter.sliding_window = None
    c.drafter.block_input = "ngram"  # smollm2_135m_mix.py: "mask"
    c.drafter.ngram_max = 4
    c.drafter.ngram_min = 2  # smollm2_135m_mix.py: 1
    c.drafter.copy_bias = 30.0  # smollm2_135m_mix.py: None
    c.drafter.conv_kernel_size = 0
    c.drafter.conv_group_size = 16
    c.drafter.selector_rank = 0
    c.drafter.selector_top_k = 16

    c.train = ConfigDict()
    c.train.steps = 600  # smollm2_135m_mix.py: 100
    c.train.batch_size = 4
    c.train.grad_accum = 1
    c.train.max_len = 384
    c.train.num_anchors = 64
    c.train.anchor_chunk = 8
    c.train.remat = False
    c.train.stored_features = True
    c.train.gamma = 7.0
    c.train.loss_offsets = 0  # smollm2_135m_mix.py: 8
    c.train.length_buckets = ()
    c.train.lr = 0.0007
    c.train.copy_bias_lr = 0.03  # smollm2_135m_mix.py: 0.0
    c.train.selector_alpha = 1.0
    c.train.selector_stop_grad = False
    c.train.warmup_frac = 0.04
    c.train.weight_decay = 0.0
    c.train.b1 = 0.9
    c.train.b2 = 0.999
    c.train.grad_clip = 1.0
    c.train.compute_dtype = "float32"

    c.eval = ConfigDict()
    c.eval.every = 100
    c.eval.val_size = 32
    c.eval.val_within_shards = 2
    c.eval.decode_prompts = 4
    c.eval.decode_max_new_tokens = 256
    c.eval.best_by = "loss"

    c.ckpt = ConfigDict()
    c.ckpt.every = 40  # smollm2_135m_mix.py: 50
    c.ckpt.keep = 3
    return c
