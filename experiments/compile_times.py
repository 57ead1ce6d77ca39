"""First-compile and steady-state times of each target family at tiny shapes (random weights, CPU).

For each family (llama, qwen2, qwen3, qwen3_moe, gpt_oss, qwen3_5, qwen3_5_moe, gemma3, deepseek_v3,
glm4_moe, gemma4; ``--families`` picks some) a tiny random model is built with transformers (4 layers, width
64, 8 experts of 32 with 2 per token for the MoE ones, three Gated DeltaNet layers and one gated
attention layer for the Qwen3.5 ones, the tests' variants for the later ones), converted,
and decoded: plain greedy (32 new tokens) and speculative with a random 1-layer drafter at block 4.
The first call compiles the whole loop; the second one reuses it.

    .venv/bin/python experiments/compile_times.py [--out docs/bench/compile_times.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

# the tests' tiny-model builder (tests/helpers.py: a folder of test helpers, not a package)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

VARIANTS = {
    "llama": {},
    "qwen2": {},
    "qwen3": {},
    "qwen3_moe": dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True),
    "gpt_oss": dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=32, sliding_window=8),
    "qwen3_5": dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16),
    "qwen3_5_moe": dict(
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
    ),
}
# the tests' variants (tests/helpers.py: GEMMA3, DEEPSEEK_V3, GLM4_MOE, GEMMA4), at 4 layers as the others here
LATER = ("gemma3", "deepseek_v3", "glm4_moe", "gemma4")


def four_layers(kw: dict) -> dict:
    """A tests' variant at 4 layers (its layer pattern repeated)."""
    types = kw.get("layer_types")
    return {**kw, "num_hidden_layers": 4, **({"layer_types": (types * 4)[:4]} if types else {})}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="docs/bench/compile_times.json")
    ap.add_argument("--families", nargs="+", choices=[*VARIANTS, *LATER], default=[*VARIANTS, *LATER])
    args = ap.parse_args()
    import helpers
    from helpers import make_hf_model

    VARIANTS.update({f: four_layers(getattr(helpers, f.upper())) for f in LATER})

    from dflash_jax import checkpoint
    from dflash_jax.decode import Decoder
    from dflash_jax.drafter import DrafterConfig, DraftStep, init_drafter_params
    from dflash_jax.speculation import make_plan

    rows = []
    prompts = [list(range(4, 20)), list(range(30, 41))]
    with tempfile.TemporaryDirectory() as tmp:
        for family in args.families:
            kw = VARIANTS[family]
            make_hf_model(family, Path(tmp) / family, **kw)
            ck = checkpoint.load_target(checkpoint.convert_hf(Path(tmp) / family, Path(tmp) / f"{family}-ck"))
            dcfg = DrafterConfig.for_target(ck.cfg, num_layers=1, block_size=4, mask_token_id=3)
            decoders = {
                "plain": Decoder(ck.params, ck.cfg),
                "dflash_b4": Decoder(
                    ck.params, ck.cfg, make_plan(DraftStep(dcfg, ck.cfg), init_drafter_params(dcfg), block_size=4)
                ),
            }
            row = {"family": family}
            for name, dec in decoders.items():
                t0 = time.perf_counter()
                dec.generate(prompts, 32)
                first = time.perf_counter() - t0
                t0 = time.perf_counter()
                dec.generate(prompts, 32)
                row[f"{name}_first_s"], row[f"{name}_again_s"] = first, time.perf_counter() - t0
            rows.append(row)
            print(json.dumps(row), flush=True)
    lines = ["| family | plain: first call (compile) | plain: again | DFlash b4: first call | DFlash b4: again |"]
    lines.append("|---|---|---|---|---|")
    for r in rows:
        lines.append(
            f"| {r['family']} | {r['plain_first_s']:.1f} s | {r['plain_again_s']:.2f} s | "
            f"{r['dflash_b4_first_s']:.1f} s | {r['dflash_b4_again_s']:.2f} s |"
        )
    print("\n".join(lines))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"rows": rows, "table": "\n".join(lines)}, indent=1))


if __name__ == "__main__":
    main()
