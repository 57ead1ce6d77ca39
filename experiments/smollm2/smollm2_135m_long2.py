"""Issue 20's long run, stage 2: stage 6's recipe (the drafter shipped then) on four times the mixed answers.

Stage 1 (``smollm2_135m_long.py``, 1500 steps on the 6 mixed shards then made) stopped improving at
step 1100 and was not better than the shipped drafter on the benchmark sets (docs/BENCHMARKS.md,
"The long run's end"): it had seen each of its 768 answers about 30 times. This stage continues the
shipped drafter again (stage 6, ``init_from`` its copy in ``assets/``, not stage 1), with the same recipe (a DFlash 2
drafter reading prompt lookup, offsets 1..8, lr 7e-4, warmup + cosine) and the same 32 held-out
answers of the first 2 shards, on the first 24 mixed shards (3072 answers), for 3000 steps: 0.98 steps per
answer, two thirds of stage 1's 1.43 at step 1100, where its held-out loss stopped falling. ``best/``
by the held-out blocks' tau, as stage 1. Resumable: rerun the same command after an interruption
(SIGKILL included); then decode it against the shipped drafter the studies' way.

    .venv/bin/dflash-jax prepare-features --config experiments/smollm2/smollm2_135m_long2.py  # the new shards'
    .venv/bin/dflash-jax train --config experiments/smollm2/smollm2_135m_long2.py             # about 5 s a step here
    .venv/bin/python experiments/study_tau.py --per-set 20 --blocks 16 --ngram off \\
        --drafter long2=runs/long2/best --out docs/bench/issue20/long2_tau.jsonl
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    # Every field is stated here (no base config; each one is described in configs/smollm2_135m.py). Where a field
    # differs from the config this one continues (smollm2_135m_long.py), a comment gives that config's value.
    c = ConfigDict()
    c.target = "smollm2-135m-instruct"
    c.data = "data/smollm2-mix"
    c.data_shards = 24  # smollm2_135m_long.py: 6
    c.out_dir = "runs/long2"  # smollm2_135m_long.py: "runs/long1"
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
    c.train.steps = 3000  # smollm2_135m_long.py: 1500
    c.train.batch_size = 4
    c.train.grad_accum = 1
    c.train.max_len = 384
    c.train.num_anchors = 64
    c.train.anchor_chunk = 8
    c.train.remat = False
    c.train.stored_features = True
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

    c.eval = ConfigDict()
    c.eval.every = 100
    c.eval.val_size = 32
    c.eval.val_within_shards = 2
    c.eval.decode_prompts = 4
    c.eval.decode_max_new_tokens = 256
    c.eval.best_by = "tau_blocks"

    c.ckpt = ConfigDict()
    c.ckpt.every = 40
    c.ckpt.keep = 3
    return c
