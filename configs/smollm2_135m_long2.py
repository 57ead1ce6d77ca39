"""Issue 20's long run, stage 2: the shipped drafter's recipe on four times the mixed answers.

Stage 1 (``smollm2_135m_long.py``, 1500 steps on the 6 mixed shards then made) stopped improving at
step 1100 and was not better than the shipped drafter on the benchmark sets (docs/BENCHMARKS.md,
"The long run's end"): it had seen each of its 768 answers about 30 times. This stage continues the
shipped drafter again (``init_from`` the asset, not stage 1), with the same recipe (a DFlash 2
drafter reading prompt lookup, offsets 1..8, lr 7e-4, warmup + cosine) and the same 32 held-out
answers of the first 2 shards, on the first 24 mixed shards (3072 answers), for 3000 steps: 0.98 steps per
answer, two thirds of stage 1's 1.43 at step 1100, where its held-out loss stopped falling. ``best/``
by the held-out blocks' tau, as stage 1. Resumable: rerun the same command after an interruption
(SIGKILL included); then decode it against the shipped drafter the studies' way.

    .venv/bin/dflash-jax prepare-features --config configs/smollm2_135m_long2.py   # the new shards' features
    .venv/bin/dflash-jax train --config configs/smollm2_135m_long2.py              # about 5 s a step here
    .venv/bin/python launch/study_tau.py --per-set 20 --blocks 16 --ngram off \\
        --drafter long2=runs/long2/best --out docs/bench/issue20/long2_tau.jsonl
"""

from smollm2_135m_long import get_config as stage1


def get_config():
    c = stage1()
    c.data_shards = 24
    c.out_dir = "runs/long2"
    c.train.steps = 3000
    return c
