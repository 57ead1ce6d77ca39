"""``smollm2_135m_mix_ngram.py`` with a learned copy bias: a logit bonus for the token the n-gram
block input proposes, one per matched n-gram length (1..4) and offset, all starting at 4.0
(``drafter.copy_bias``, ``drafter.copy_prior``), so the drafter starts out keeping prompt lookup's
continuation unless its own logits disagree by more than the bonus, and learns per matched length
and offset how far to trust it. Same data, steps and starting weights (the table the mask-token
drafter lacks starts at 4.0). Resumable: rerun the same command after an interruption.

    dflash-jax train --config experiments/smollm2/smollm2_135m_mix_copy.py   # features: as smollm2_135m_mix.py
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    # Every field is stated here (no base config; each one is described in configs/smollm2_135m.py). Where a field
    # differs from the config this one continues (smollm2_135m_mix_ngram.py), a comment gives that config's value.
    c = ConfigDict()
    c.target = "smollm2-135m-instruct"
    c.data = "data/smollm2-mix"
    c.data_shards = 5
    c.out_dir = "runs/mix_copy"  # smollm2_135m_mix_ngram.py: "runs/mix_ngram"
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
    c.drafter.block_input = "ngram"
    c.drafter.ngram_max = 4
    c.drafter.ngram_min = 1
    c.drafter.copy_bias = 4.0  # smollm2_135m_mix_ngram.py: None
    c.drafter.conv_kernel_size = 0
    c.drafter.conv_group_size = 16
    c.drafter.selector_rank = 0
    c.drafter.selector_top_k = 16

    c.train = ConfigDict()
    c.train.steps = 100
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
    c.train.copy_bias_lr = 0.0
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
    c.ckpt.every = 50
    c.ckpt.keep = 3
    return c
