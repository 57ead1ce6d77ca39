"""Race: dflash-jax against the reference implementations, same prompts, same process, greedy.

Speculative: our decoder against ``dflash==0.1.0``'s ``dflash_generate`` (PyTorch, CPU) with
the same drafter (the shipped one by default: it is already in the released format the
reference loads). Plain: our decoder without drafter against transformers ``generate``.
For every prompt the four runs are interleaved; each is timed from outside with a wall clock
(the reference's own timing needs CUDA), compilation excluded (one warm-up per shape). Checks,
recorded per prompt and counted in the summary: identical tokens (SPEC's floating-point rule
allows a divergence at a near-tie; none has been seen) and, for speculative decoding,
identical per-round acceptance lengths.

    python launch/race_reference.py --prompts 20 --out docs/race_reference.json   # or: make bench-reference
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ap.add_argument("--drafter", default=None, help="released-format drafter folder (default: the shipped one)")
    ap.add_argument("--dataset", default="gsm8k", help="bench prompt set")
    ap.add_argument("--prompts", type=int, default=20, help="first N prompts of the set")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--block-size", type=int, default=None, help="default: the drafter's")
    ap.add_argument("--out", default="docs/race_reference.json")
    args = ap.parse_args()

    import dflash.model
    import numpy as np
    import torch
    from dflash.model import DFlashDraftModel, dflash_generate
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM

    from dflash_jax import checkpoint, hub
    from dflash_jax.decode import Decoder
    from dflash_jax.prompts import load_eval_prompts
    from dflash_jax.speculation import load, plan_for
    from dflash_jax.tokens import chat_ids, stop_ids
    from dflash_jax.utils import enable_compilation_cache, log

    # return_stats=True (which carries the acceptance lengths) reads torch.cuda's clock; on CPU give it a
    # plain one. Its timings are not used: every run is timed from outside.
    dflash.model._cuda_time = time.perf_counter
    enable_compilation_cache()
    torch.set_num_threads(os.cpu_count())
    ck = checkpoint.load_target(hub.SMOLLM2)
    tok = ck.tokenizer()
    drafter_dir = Path(args.drafter) if args.drafter else hub.shipped_drafter(ck.identity)
    if drafter_dir is None:
        sys.exit("error: no shipped drafter for SmolLM2 in dflash_jax/assets/: pass --drafter (released format)")
    drafter = load(str(drafter_dir), ck, tok)
    block = args.block_size or drafter.cfg.block_size
    ours_spec = Decoder(
        ck.params, ck.cfg, plan_for(ck, drafter, prompt_lookup=False, block_size=block, verify_lengths=None)
    )
    ours_plain = Decoder(ck.params, ck.cfg)
    hf = AutoModelForCausalLM.from_pretrained(checkpoint.smollm2_hf_dir(), dtype=torch.float32).eval()
    ref = DFlashDraftModel.from_pretrained(drafter_dir, dtype=torch.float32).eval()
    stops = stop_ids(tok)
    prompts = load_eval_prompts(args.dataset, max_samples=args.prompts, max_turns=1)
    ids = [chat_ids(tok, [{"role": "user", "content": p.turns[0]}]) for p in prompts]

    def wall(fn):
        t0 = time.perf_counter()
        out = fn()
        return out, time.perf_counter() - t0

    rows = []
    for i, x in enumerate(tqdm(ids, desc="race", unit="prompt")):
        xt = torch.tensor([x])
        for dec in (ours_spec, ours_plain):  # compile this prompt's shape bucket outside the clock (no-op if done)
            dec.compile(dec.shape_for([len(x)], args.max_new_tokens), len(stops))
        with torch.no_grad():
            if i == 0:  # warm-up of the PyTorch paths
                dflash_generate(ref, hf, xt, max_new_tokens=8, stop_token_ids=stops, block_size=block)
                hf.generate(xt, max_new_tokens=8, do_sample=False)
            spec, t_spec = wall(lambda: ours_spec.generate([x], args.max_new_tokens, stops)[0])
            r_out, t_ref = wall(
                lambda: dflash_generate(
                    ref,
                    hf,
                    xt,
                    max_new_tokens=args.max_new_tokens,
                    stop_token_ids=stops,
                    block_size=block,
                    return_stats=True,
                )
            )
            plain, t_plain = wall(lambda: ours_plain.generate([x], args.max_new_tokens, stops)[0])
            h_out, t_hf = wall(
                lambda: hf.generate(
                    xt, max_new_tokens=args.max_new_tokens, do_sample=False, eos_token_id=stops, pad_token_id=stops[0]
                )
            )
        r_tokens = r_out.output_ids[0, len(x) :].tolist()
        h_tokens = h_out[0, len(x) :].tolist()
        rows.append(
            {
                "prompt": i,
                "prompt_tokens": len(x),
                "tokens": spec.num_output_tokens,
                "plain_tokens": plain.num_output_tokens,
                "ours_spec_s": t_spec,
                "ref_spec_s": t_ref,
                "ours_plain_s": t_plain,
                "hf_plain_s": t_hf,
                "spec_tokens_equal": spec.token_ids == r_tokens,
                "acceptance_equal": spec.acceptance_lengths == list(r_out.acceptance_lengths),
                "plain_tokens_equal": plain.token_ids == h_tokens,
                "spec_equals_plain": spec.token_ids == plain.token_ids,
                "tau": spec.tau,
                "ref_tau": float(np.mean(r_out.acceptance_lengths)) if r_out.acceptance_lengths else 0.0,
                "ref_tokens": len(r_tokens),
                "hf_tokens": len(h_tokens),
            }
        )

    def tps(key, tokens_key="tokens"):
        return sum(r[tokens_key] for r in rows) / sum(r[key] for r in rows)

    summary = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, "
        f"torch {torch.__version__}",
        "drafter": str(drafter_dir),
        "block_size": block,
        "dataset": args.dataset,
        "prompts": len(rows),
        "max_new_tokens": args.max_new_tokens,
        "ours_spec_tok_s": tps("ours_spec_s"),
        "ref_spec_tok_s": tps("ref_spec_s", "ref_tokens"),
        "ours_plain_tok_s": tps("ours_plain_s", "plain_tokens"),
        "hf_plain_tok_s": tps("hf_plain_s", "hf_tokens"),
        "spec_tokens_equal": sum(r["spec_tokens_equal"] for r in rows),
        "acceptance_equal": sum(r["acceptance_equal"] for r in rows),
        "plain_tokens_equal": sum(r["plain_tokens_equal"] for r in rows),
        "tau": statistics.mean(r["tau"] for r in rows),
    }
    summary["spec_ratio"] = summary["ours_spec_tok_s"] / summary["ref_spec_tok_s"]
    summary["plain_ratio"] = summary["ours_plain_tok_s"] / summary["hf_plain_tok_s"]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    n = len(rows)
    print(
        f"| decoding | dflash-jax tok/s | reference tok/s | ratio | same tokens | same acceptance lengths |\n"
        f"|---|---|---|---|---|---|\n"
        f"| DFlash, block {block} (vs dflash==0.1.0) | {summary['ours_spec_tok_s']:.1f} | "
        f"{summary['ref_spec_tok_s']:.1f} | {summary['spec_ratio']:.2f}x | {summary['spec_tokens_equal']}/{n} | "
        f"{summary['acceptance_equal']}/{n} |\n"
        f"| plain (vs transformers generate) | {summary['ours_plain_tok_s']:.1f} | {summary['hf_plain_tok_s']:.1f} | "
        f"{summary['plain_ratio']:.2f}x | {summary['plain_tokens_equal']}/{n} | - |"
    )
    log(f"tau {summary['tau']:.2f}; wrote {args.out}")


if __name__ == "__main__":
    main()
