"""Issue 20's pilot: the shipped SmolLM2 drafter (stage 5) continued on the new mixed answers.

The data is ``data/smollm2-mix``: the target's own greedy answers (cap 256 tokens) to GSM8K-train,
both Alpaca sets and both code-instruction sets (``../shared/data/train``), shuffled together by
``prepare-data``, so any prefix of its shards is a mix of all five. This config continues the
shipped drafter (``init_from`` the asset: 2 layers reading target layers 1, 14, 27, block 16)
on the first 5 shards with stage 5's settings (lr 7e-4, loss offsets 1..8, stored features), 32
answers of the first 2 shards held out. ``smollm2_135m_mix_ngram.py`` is the same run with the
n-gram continuation in the blocks (``drafter.block_input="ngram"``): the pair compares the two
block inputs at equal compute. Resumable: rerun the same command after an interruption.

    dflash-jax prepare-data --prompts ../shared/data/train/gsm8k_train.jsonl \\
        ../shared/data/train/alpaca_en_1k.json ../shared/data/train/alpaca_5000.json \\
        ../shared/data/train/code_alpaca_2k.json ../shared/data/train/new_codealpaca.json \\
        --max-new-tokens 256 --batch-size 16 --shard-size 128 --out data/smollm2-mix
    dflash-jax prepare-features --config configs/smollm2_135m_mix.py
    dflash-jax train --config configs/smollm2_135m_mix.py
"""

from smollm2_135m_cpu_v5 import get_config as stage5


def get_config():
    c = stage5()
    # the drafter shipped until 2026-12-02 (configs/smollm2_135m_cpu_v5.py's best), kept for the studies
    c.init_from = "assets/smollm2-135m-instruct-dflash-stage5"
    c.data = "data/smollm2-mix"
    c.data_shards = 5
    c.out_dir = "runs/mix_mask"
    c.eval.val_within_shards = 2
    c.eval.every = 100
    c.eval.decode_prompts = 4
    c.ckpt.every = 50
    c.train.steps = 100
    c.train.lr = 7e-4
    return c
