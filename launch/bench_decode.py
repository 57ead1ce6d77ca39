"""Plain greedy decoding of SmolLM2-135M on this machine: dflash-jax against transformers `generate`.

Each implementation runs in its own subprocess (so peak memory is its own) on the same
chat-formatted GSM8K test prompts, greedy, batch 1, exactly ``--new-tokens`` tokens
(no stop token, so both do the same work). Reported per implementation:
decode tokens/s (tokens 2..N, after the first), time to first token (prefill + first
token), peak resident memory, and for ours the compile time (excluded from the rest).

    python launch/bench_decode.py --out docs/bench_decode.json      # or: make bench-decode
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def prompts(n: int) -> list[str]:
    path = ROOT.parent / "shared" / "data" / "eval" / "gsm8k_test.jsonl"
    rows = [json.loads(line) for line in open(path)][:n]
    return [r["question"] + "\nPlease reason step by step, and put your final answer within \\boxed{}." for r in rows]


def run_jax(texts, n_new, batch):
    from dflash_jax import checkpoint, hub
    from dflash_jax.cli import encode
    from dflash_jax.decode import Decoder
    from dflash_jax.utils import enable_compilation_cache

    enable_compilation_cache()
    ck = checkpoint.load_target(hub.SMOLLM2)
    tok = ck.tokenizer()
    dec = Decoder(ck.params, ck.cfg)
    ids = [encode(tok, t, chat=True) for t in texts]
    compile_s = dec.generate(ids[:batch], n_new)[0].compile_s  # warm-up for this shape bucket
    rows = []
    for i in range(0, len(ids), batch):
        res = dec.generate(ids[i:i + batch], n_new)
        r = res[0]
        rows.append({"ttft_s": r.prefill_s, "decode_tok_s": len(res) * (n_new - 1) / r.decode_s})
    return rows, compile_s


def run_hf(texts, n_new, batch):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dflash_jax import hub

    torch.set_num_threads(os.cpu_count())
    folder = hub.smollm2_hf_dir()
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    rows = []
    for i, text in enumerate(texts):
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)["input_ids"]
        kw = dict(do_sample=False, eos_token_id=None, pad_token_id=2)
        with torch.no_grad():
            if i == 0:
                model.generate(ids, max_new_tokens=4, min_new_tokens=4, **kw)  # warm-up
            t0 = time.perf_counter()
            model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw)
            t1 = time.perf_counter()
            model.generate(ids, max_new_tokens=n_new, min_new_tokens=n_new, **kw)
            t2 = time.perf_counter()
        rows.append({"ttft_s": t1 - t0, "decode_tok_s": (n_new - 1) / ((t2 - t1) - (t1 - t0))})
    return rows, 0.0


def worker(args):
    texts = prompts(args.prompts)
    rows, compile_s = (run_jax if args.impl == "jax" else run_hf)(texts, args.new_tokens, args.batch)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"impl": args.impl, "batch": args.batch, "rows": rows, "compile_s": compile_s,
                      "peak_rss_mb": peak_mb}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=5, help="GSM8K test prompts")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--out", default="docs/bench_decode.json")
    ap.add_argument("--impl", choices=["jax", "hf"], help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.impl:
        return worker(args)
    results = []
    for impl, batch in (("jax", 1), ("hf", 1)):
        cmd = [sys.executable, __file__, "--impl", impl, "--batch", str(batch), "--prompts", str(args.prompts),
               "--new-tokens", str(args.new_tokens)]
        print(f"running {impl} (batch {batch}) ...", file=sys.stderr, flush=True)
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        results.append(json.loads(out.strip().splitlines()[-1]))
    lines = ["| implementation | batch | decode tokens/s (mean) | time to first token (s, mean) | peak RSS (MB) | compile (s) |",
             "|---|---|---|---|---|---|"]
    for r in results:
        tps = statistics.mean(x["decode_tok_s"] for x in r["rows"])
        ttft = statistics.mean(x["ttft_s"] for x in r["rows"])
        r["decode_tok_s_mean"], r["ttft_s_mean"] = tps, ttft
        name = "dflash-jax (ours)" if r["impl"] == "jax" else "transformers generate"
        lines.append(f"| {name} | {r['batch']} | {tps:.1f} | {ttft:.3f} | {r['peak_rss_mb']:.0f} | {r['compile_s']:.1f} |")
    ratio = results[0]["decode_tok_s_mean"] / results[1]["decode_tok_s_mean"]
    lines.append(f"\nratio ours / transformers (decode tokens/s): {ratio:.2f}x")
    table = "\n".join(lines)
    print(table)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                                          "prompts": args.prompts, "new_tokens": args.new_tokens,
                                          "results": results, "ratio": ratio, "table": table}, indent=1))


if __name__ == "__main__":
    main()
