"""Issue 38's objective study for SmolLM2 on this 2-core CPU: stage 6, the drafter shipped
then (``assets/smollm2-135m-instruct-dflash-stage6``, a DFlash 2 drafter reading prompt lookup), continued with its
own recipe on every made shard of ``data/smollm2-mix`` (48: the 5 it saw
and 43 it never did), the target's forward in every step (the distribution objectives read its head, which
stored features do not hold), one arm per objective (``experiments/smollm2/study_issue38.sh`` sets
``train.objective`` / ``train.position_weights`` and equal wall-clock step counts). Comments give the
value in stage 6's recipe (``assets/smollm2-135m-instruct-dflash-stage6/train_config.json``) where a field
differs from it.

    bash experiments/smollm2/study_issue38.sh   # resumable
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    # Every field is stated here (no base config). Where a field differs from the from-scratch CPU recipe
    # configs/smollm2_135m.py (which describes each one), a comment gives that file's value.
    c = ConfigDict()
    c.target = "smollm2-135m-instruct"
    c.data = "data/smollm2-mix"
    c.data_shards = 48  # stage 6: 5
    c.out_dir = "runs/study38/ce"
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
    c.train.steps = 259
    c.train.batch_size = 4
    c.train.grad_accum = 1
    c.train.max_len = 384
    c.train.num_anchors = 64
    c.train.anchor_chunk = 8
    c.train.remat = False
    c.train.stored_features = False  # stage 6: True
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
    c.train.objective = "ce"  # the arm's (study_issue38.sh): ce, kl, kl_tv
    c.train.tv_weight = 0.5
    c.train.position_weights = "decay"  # the arm's: decay, reach

    c.eval = ConfigDict()
    c.eval.every = 259
    c.eval.val_size = 32
    c.eval.val_within_shards = 2
    c.eval.decode_prompts = 4
    c.eval.decode_max_new_tokens = 256
    c.eval.best_by = "loss"

    c.ckpt = ConfigDict()
    c.ckpt.every = 40
    c.ckpt.keep = 3
    return c
