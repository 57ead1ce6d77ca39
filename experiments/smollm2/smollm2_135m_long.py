"""Issue 20's long run, stage 1: the recipe that won the fixed-budget studies, on the mixed answers.

The studies (docs/BENCHMARKS.md, "Fixed-budget study, second plan" and "DFlash against DFlash 2 at
equal budget") picked a DFlash 2 drafter that reads prompt lookup (the n-gram continuation, n >= 2,
as the block input; a learned copy bias from 30 on its own lr 0.03) trained on offsets 1..8
(``smollm2_135m_mix_copy2_dflash2.py``). This stage continues the drafter shipped from that study
(stage 6, ``init_from`` its copy in ``assets/``) on every mixed shard made so far (6: 768 answers,
the same 32 of the first 2 held out), for 1500 steps with checkpoints every 40 and an evaluation
(held-out loss, tau from held-out blocks, decoded tau on 4 held-out prompts) every 100, keeping as
``best/`` the drafter with the highest tau from the held-out blocks (``eval.best_by``: a wrong forced copy costs about
30 of loss, so this drafter's loss and tau can move apart; the 4 decoded prompts are too few to rank by).
Resumable: rerun the same command after an interruption (SIGKILL included). It ended no better than
the shipped drafter (docs/BENCHMARKS.md, "The long run's end"), so stage 2
(``smollm2_135m_long2.py``, on more shards) starts from the shipped drafter again, not from it.

    .venv/bin/dflash-jax prepare-features --config experiments/smollm2/smollm2_135m_long.py  # shard 5's (3 min)
    .venv/bin/dflash-jax train --config experiments/smollm2/smollm2_135m_long.py             # about 5 s a step here
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    # Every field is stated here (no base config; each one is described in configs/smollm2_135m.py). Where a field
    # differs from the config this one continues (smollm2_135m_mix_copy2_dflash2.py), a comment gives that config's
    # value.
    c = ConfigDict()
    c.target = "smollm2-135m-instruct"
    c.data = "data/smollm2-mix"
    c.data_shards = 6  # smollm2_135m_mix_copy2_dflash2.py: 5
    c.out_dir = "runs/long1"  # smollm2_135m_mix_copy2_dflash2.py: "runs/mix_copy2_dflash2"
    c.seed = 0
    # smollm2_135m_mix_copy2_dflash2.py: "assets/smollm2-135m-instruct-dflash-stage5"
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
    c.train.steps = 1500  # smollm2_135m_mix_copy2_dflash2.py: 600
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
    c.eval.best_by = "tau_blocks"  # smollm2_135m_mix_copy2_dflash2.py: "loss"

    c.ckpt = ConfigDict()
    c.ckpt.every = 40
    c.ckpt.keep = 3
    return c
