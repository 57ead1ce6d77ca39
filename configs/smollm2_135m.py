"""Train a DFlash drafter for the embedded SmolLM2-135M-Instruct on this kind of machine (CPU).

    dflash-jax train --config configs/smollm2_135m.py data=data/smollm2 train.steps=2000

Data: a token dataset made by ``dflash-jax prepare-data`` (the target's own responses).
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    c = ConfigDict()
    c.target = "smollm2-135m-instruct"  # a converted checkpoint folder or a known name
    c.data = "data/smollm2"  # token dataset folder (dflash-jax prepare-data), or a tuple of them read as one
    c.data_shards = 0  # 0: all shards (prepare-data must have finished); N: only the first N; a tuple: per folder
    c.data_repeats = 1  # several folders: a tuple, how many times each folder's answers appear in an epoch
    c.out_dir = "runs/smollm2_135m"
    c.seed = 0
    c.init_from = ""  # a drafter folder whose weights start a fresh run (its config must match drafter.*)
    c.init_grow = False  # True: init_from may have fewer layers; each added layer starts as the identity
    c.mesh = (1, 1, 1)  # (data, fsdp, tensor[, expert]) device counts; their product = devices used

    c.drafter = ConfigDict()
    c.drafter.num_layers = 1
    c.drafter.block_size = 16
    c.drafter.mask_token_id = None  # None: an unused special token of the tokenizer (<empty_output> for SmolLM2)
    c.drafter.target_layer_ids = ()  # () = the SPEC default for num_layers
    c.drafter.layer_types = ()  # () = all full_attention
    c.drafter.sliding_window = None
    # what fills a block after its anchor: "mask" (DFlash) or "ngram" (the prompt-lookup continuation
    # of the committed tokens, n-gram lengths ngram_max .. ngram_min; mask tokens where it ends)
    c.drafter.block_input = "mask"
    c.drafter.ngram_max = 4
    c.drafter.ngram_min = 1
    # with "ngram": a continuation that reaches the anchor goes on with the match's period (a loop
    # continued) instead of stopping there
    c.drafter.ngram_periodic = False
    # with "ngram": a learned logit bonus for the proposed token per matched length and offset,
    # starting at this value (None: no bonus)
    c.drafter.copy_bias = None
    # DFlash 2 (SPEC "DFlash 2"): grouped dynamic causal convolutions of this kernel size around each
    # sublayer (0 = DFlash, none; 2 in released DFlash 2 drafters) over channel groups of
    # conv_group_size, and a candidate selector of rank selector_rank (>= 1 with DFlash 2) over the
    # head's top selector_top_k tokens per offset
    c.drafter.conv_kernel_size = 0
    c.drafter.conv_group_size = 16
    c.drafter.selector_rank = 0
    c.drafter.selector_top_k = 16

    c.train = ConfigDict()
    c.train.steps = 2000
    c.train.batch_size = 8  # sequences per optimiser step (all accumulation steps together)
    c.train.grad_accum = 1
    c.train.max_len = 512  # tokens per sequence (longer ones are cut)
    c.train.num_anchors = 64  # blocks per sequence
    c.train.anchor_chunk = 16  # blocks processed together (activation memory)
    c.train.remat = True  # recompute each chunk in the backward pass (memory); False: faster, more memory
    c.train.stored_features = False  # read the target's features from `dflash-jax prepare-features` (no target forward)
    c.train.gamma = 7.0  # loss decay w_k = exp(-(k-1)/gamma); 7 for block size 16
    c.train.loss_offsets = 0  # supervise block offsets 1..N only (0 = all B-1, the recipe); the LM head runs on N
    c.train.length_buckets = ()  # e.g. (256, 320): pad each batch to the smallest that holds it (() = max_len)
    c.train.lr = 6e-4
    c.train.copy_bias_lr = 0.0  # the copy-bias table's peak lr (logit units; 0 = train.lr like the rest)
    c.train.objective = "ce"  # ce: the answer's tokens; kl: the target's next-token distribution; kl_tv: KL + TV
    c.train.tv_weight = 0.5  # kl_tv: TV's share
    c.train.position_weights = "decay"  # decay: w_k alone; reach: w_k x the block's chance of reaching offset k
    c.train.selector_alpha = 1.0  # DFlash 2: the selector loss's weight beside the block loss
    c.train.selector_stop_grad = False  # DFlash 2: True = the selector loss trains the selector only
    c.train.selector_objective = "ce"  # DFlash 2: ce: the answer's token; kl: the target's distribution on candidates
    c.train.warmup_frac = 0.04
    c.train.weight_decay = 0.0
    c.train.b1 = 0.9
    c.train.b2 = 0.999
    c.train.grad_clip = 1.0
    c.train.compute_dtype = "float32"  # float32 is faster on CPU; bfloat16 on GPU/TPU

    c.eval = ConfigDict()
    c.eval.every = 200  # steps between validations
    c.eval.val_size = 32  # held-out sequences
    c.eval.val_within_shards = 0  # N: draw them from the first N shards only (keep the split of an earlier
    # stage that drew from N shards; carry the same N, seed and val_size to every later stage); 0: all
    c.eval.decode_prompts = 4  # validation prompts decoded for a real tau (0 = skip)
    c.eval.decode_max_new_tokens = 64
    # what makes best/: "loss" (the objective trained: the block loss, plus DFlash 2's weighted selector
    # loss; lowest), "tau_blocks" (tau from the held-out blocks, highest) or "decode_tau" (tau of the
    # decoded validation prompts, highest). A drafter whose block reads prompt lookup pays about 30 of
    # loss for every wrong forced copy, so its loss and its tau can move apart: rank it by a tau.
    c.eval.best_by = "loss"

    c.ckpt = ConfigDict()
    c.ckpt.every = 100
    c.ckpt.keep = 3
    return c
