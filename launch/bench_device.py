"""Round costs on an accelerator at a real target's shapes: one script that fits the `device` tool.

Random weights at Qwen3-8B's shapes in bfloat16 (a dense model's speed does not depend on its
weight values; acceptance is measured on CPU with real weights), batch 1, one prompt of
``--prompt-len`` random tokens, ``--new-tokens`` new tokens:

- plain decoding: ms per step;
- DFlash at blocks 8 and 16 with a random 1-layer drafter (tau ~1: the round's cost) and with an
  *oracle* draft step that proposes the target's own greedy continuation (tau = the block: the
  best a drafter can do), ms per round and in plain steps;
- prompt lookup (``NgramStep``, block 16): ms per round;
- with ``--verify-lengths``, the defaults' adaptive verify at block 16 with the oracle;
- draft trees of ``--trees`` nodes (16, 32, 64, 128) from the random drafter (``TreeStep``, the whole
  tree verified every round): what a tree round costs in plain steps, where trees pay.

Every arm's output is checked against plain decoding (greedy: identical tokens). Writes a JSON
report and prints a Markdown table. On the H200 (the device tool, about 3 min with compiles):

    PYTHONUNBUFFERED=1 python launch/bench_device.py --shape qwen3-8b --out $OUT/bench_device.json

On CPU at tiny shapes (what tests/test_bench_device.py runs):

    .venv/bin/python launch/bench_device.py --shape tiny --out /tmp/bench_device.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from dflash_jax import hf_format
from dflash_jax.decode import Decoder
from dflash_jax.drafter import DrafterConfig, DraftStep, init_drafter_params
from dflash_jax.ngram import NgramStep
from dflash_jax.speculation import make_plan
from dflash_jax.steps import Draft, all_real
from dflash_jax.target import init_params
from dflash_jax.tree_step import TreeStep

SHAPES = {
    "qwen3-8b": dict(
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
    ),
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=96,
    ),
}


class OracleStep:
    """A draft step proposing the target's own greedy tokens (its parameters: ``int32 [1, W]``, the
    greedy sequence by absolute position), so that every draft token is accepted."""

    tap_layers = ()

    def __init__(self, block_size: int):
        self.max_block_size = self.default_block_size = block_size

    def init_cache(self, batch, cache_len):
        return None

    def write_context(self, params, cache, feats, start):
        return cache

    def propose(self, params, target_params, cache, anchor, start, block_valid, block_len, *, tokens, key, sampling):
        take = jax.vmap(lambda s: jax.lax.dynamic_slice_in_dim(params[0], s + 1, block_len - 1))
        draft = take(start).astype(jnp.int32)
        return Draft(draft, all_real(draft), jnp.ones(draft.shape, jnp.float32))


def random_target(shape: str, dtype: str, seed: int = 0):
    hf = dict(
        SHAPES[shape],
        model_type="qwen3",
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=False,
    )
    cfg = hf_format.read_config(hf, dtype=dtype)
    init = jax.jit(
        lambda: jax.tree.map(
            lambda x: (x * (2.0 if x.ndim > 1 else 1.0)).astype(cfg.compute_dtype), init_params(cfg, seed)
        )
    )
    return cfg, init()


def timed(dec: Decoder, prompt, n: int):
    """The second of two runs (the first compiles): (result, ms per round, compile s)."""
    first = dec.generate([prompt], n)[0]
    r = dec.generate([prompt], n)[0]
    rounds = max(len(r.acceptance_lengths), 1) if dec.drafter is not None else max(r.num_output_tokens - 1, 1)
    return r, 1e3 * r.decode_s / rounds, first.compile_s


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-8b", choices=sorted(SHAPES))
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--verify-lengths", default="1,2,4,8,16", help="the adaptive arm's lengths ('' to skip it)")
    ap.add_argument("--trees", default="16,32,64,128", help="tree node budgets to time ('' to skip them)")
    ap.add_argument("--out", type=Path, default=Path("bench_device.json"))
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    cfg, params = random_target(args.shape, args.dtype)
    rs = np.random.RandomState(0)
    prompt = rs.randint(0, cfg.vocab_size, args.prompt_len).tolist()
    plain, step_ms, plain_compile = timed(Decoder(params, cfg), prompt, args.new_tokens)
    oracle_params = np.zeros((1, args.prompt_len + args.new_tokens + 32), np.int32)
    oracle_params[0, : args.prompt_len + plain.num_output_tokens] = prompt + plain.token_ids
    dcfg = DrafterConfig.for_target(cfg, num_layers=1, block_size=16, mask_token_id=0, dtype=args.dtype)
    dparams = init_drafter_params(dcfg, 0)
    arms = {}
    for block in (8, 16):
        arms[f"DFlash random drafter, block {block}"] = Decoder(
            params, cfg, make_plan(DraftStep(dcfg, cfg), dparams, block_size=block)
        )
        arms[f"oracle, block {block}"] = Decoder(
            params, cfg, make_plan(OracleStep(16), oracle_params, block_size=block)
        )
    arms["prompt lookup, block 16"] = Decoder(params, cfg, make_plan(NgramStep(block_size=16)))
    if args.verify_lengths:
        lengths = [int(x) for x in args.verify_lengths.split(",")]
        costs = [1.0] * len(set(lengths) | {16})  # a long verify is nearly free on an accelerator: equal costs
        arms["oracle, block 16, verify lengths " + args.verify_lengths] = Decoder(
            params, cfg, make_plan(OracleStep(16), oracle_params, verify_lengths=lengths, verify_costs=costs)
        )
    for n in [int(x) for x in args.trees.split(",") if x]:
        arms[f"DFlash random drafter, tree of {n}"] = Decoder(
            params, cfg, make_plan(TreeStep(DraftStep(dcfg, cfg), n), dparams)
        )
    rows = [
        {
            "arm": "plain",
            "ms_per_round": step_ms,
            "round_cost": 1.0,
            "tau": 1.0,
            "tokens_per_s": (plain.num_output_tokens - 1) / plain.decode_s,
            "compile_s": plain_compile,
            "identical": True,
        }
    ]
    for name, dec in arms.items():
        r, ms, compile_s = timed(dec, prompt, args.new_tokens)
        rows.append(
            {
                "arm": name,
                "ms_per_round": ms,
                "round_cost": ms / step_ms,
                "tau": r.tau,
                "tokens_per_s": (r.num_output_tokens - 1) / r.decode_s,
                "compile_s": compile_s,
                "identical": r.token_ids == plain.token_ids,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    report = {
        "shape": args.shape,
        "dtype": args.dtype,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "device": str(jax.devices()[0].device_kind),
        "backend": jax.default_backend(),
        "host": platform.node(),
        "seconds": time.perf_counter() - t0,
        "rows": rows,
    }
    lines = [
        "| arm | ms per round | round cost (plain steps) | tau | tokens/s | identical |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['arm']} | {r['ms_per_round']:.2f} | {r['round_cost']:.2f} | {r['tau']:.2f} | "
        f"{r['tokens_per_s']:.1f} | {r['identical']} |"
        for r in rows
    ]
    report["table"] = "\n".join(lines)
    print(report["table"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
