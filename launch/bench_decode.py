"""Decoding benchmarks of SmolLM2-135M on this machine (three suites, each in its own subprocess).

``vs-hf``: plain greedy decoding, dflash-jax against transformers ``generate``, on the same
chat-formatted GSM8K test prompts, batch 1, exactly ``--new-tokens`` tokens (no stop token,
so both do the same work): decode tokens/s (tokens 2..N), time to first token (prefill +
first token), peak resident memory, and for ours the compile time (excluded from the rest).

``round``: the cost of one speculative round (draft + verify + commit) in units of one plain
autoregressive step, at block sizes 4, 8 and 16, with a freshly initialised 1-layer drafter.
Shapes are static, so a round costs the same whatever the drafter accepts; the figure is
(decode seconds / rounds) at block B over the same at block 1.

``batch``: plain decoding throughput (all sequences together) at batch 1, 4 and 16.

``stream``: the cost of streaming (``Decoder.stream``: an ordered host callback after every
round of the one compiled loop) against ``generate``, wall clock per prompt after compilation,
plain decoding and block 16 (random drafter: one token per round, the most callbacks).

    python launch/bench_decode.py --out docs/bench_decode.json      # or: make bench-decode
    python launch/bench_decode.py --suite round                     # one suite
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


def prompts(n: int) -> list[str]:
    from dflash_jax.prompts import PACKAGED_EVAL_DATA

    path = PACKAGED_EVAL_DATA / "gsm8k_test.jsonl"  # shipped with the package
    rows = [json.loads(line) for line in open(path)][:n]
    return [r["question"] + "\nPlease reason step by step, and put your final answer within \\boxed{}." for r in rows]


def run_jax(texts, n_new, batch):
    from dflash_jax import checkpoint, hub
    from dflash_jax.decode import Decoder
    from dflash_jax.tokens import encode
    from dflash_jax.utils import enable_compilation_cache

    enable_compilation_cache()
    ck = checkpoint.load_target(hub.SMOLLM2)
    tok = ck.tokenizer()
    dec = Decoder(ck.params, ck.cfg)
    ids = [encode(tok, t, chat=True) for t in texts]
    compile_s = dec.generate(ids[:batch], n_new)[0].compile_s  # warm-up for this shape bucket
    rows = []
    for i in range(0, len(ids), batch):
        res = dec.generate(ids[i : i + batch], n_new)
        r = res[0]
        rows.append({"ttft_s": r.prefill_s, "decode_tok_s": len(res) * (n_new - 1) / r.decode_s})
    return rows, compile_s


def run_round(texts, n_new, batch):
    """Milliseconds per round at block sizes 1 (plain), 4, 8, 16; random 1-layer drafter."""
    from dflash_jax import checkpoint, hub
    from dflash_jax.decode import Decoder
    from dflash_jax.speculation import load, plan_for
    from dflash_jax.tokens import encode
    from dflash_jax.utils import enable_compilation_cache

    enable_compilation_cache()
    ck = checkpoint.load_target(hub.SMOLLM2)
    tok = ck.tokenizer()
    ids = [encode(tok, t, chat=True) for t in texts]
    drafter = load("random", ck, tok)
    rows = []
    for bs in (1, 4, 8, 16):
        plan = plan_for(ck, drafter, prompt_lookup=False, block_size=bs, verify_lengths=None) if bs > 1 else None
        dec = Decoder(ck.params, ck.cfg, plan)
        compile_s = dec.generate(ids[:1], n_new)[0].compile_s
        secs, rounds, tokens = 0.0, 0, 0
        for p in ids:
            r = dec.generate([p], n_new)[0]
            secs, rounds, tokens = (
                secs + r.decode_s,
                rounds + len(r.acceptance_lengths),
                tokens + r.num_output_tokens - 1,
            )
        rows.append(
            {"block_size": bs, "ms_per_round": 1e3 * secs / rounds, "tau": tokens / rounds, "compile_s": compile_s}
        )
    for r in rows:
        r["round_cost_steps"] = r["ms_per_round"] / rows[0]["ms_per_round"]
    return rows, 0.0


def run_stream(texts, n_new, batch):
    """Wall seconds of generate vs stream (compiled), plain and block 16, alternating per prompt."""
    from dflash_jax import checkpoint, hub
    from dflash_jax.decode import Decoder
    from dflash_jax.speculation import plan_for
    from dflash_jax.tokens import encode
    from dflash_jax.utils import enable_compilation_cache

    enable_compilation_cache()
    ck = checkpoint.load_target(hub.SMOLLM2)
    tok = ck.tokenizer()
    ids = [encode(tok, t, chat=True) for t in texts]
    rows = []
    random = plan_for(ck, "random", tok, prompt_lookup=False, block_size=16, verify_lengths=None)
    for bs, plan in ((1, None), (16, random)):
        dec = Decoder(ck.params, ck.cfg, plan)
        dec.generate(ids[:1], n_new), list(dec.stream(ids[0], n_new))  # compile both executables
        gen = stream = 0.0
        for p in ids:
            t0 = time.perf_counter()
            dec.generate([p], n_new)
            t1 = time.perf_counter()
            list(dec.stream(p, n_new))
            stream, gen = stream + time.perf_counter() - t1, gen + t1 - t0
        rows.append(
            {
                "block_size": bs,
                "generate_s": gen,
                "stream_s": stream,
                "overhead": stream / gen - 1,
                "ms_per_callback": 1e3 * (stream - gen) / (len(ids) * (n_new - 1)),
            }
        )
    return rows, 0.0


def run_batch(texts, n_new, batch):
    """Plain decoding throughput (tokens/s over all rows) at batch 1, 4, 16 on 16 prompts."""
    from dflash_jax import checkpoint, hub
    from dflash_jax.decode import Decoder
    from dflash_jax.tokens import encode
    from dflash_jax.utils import enable_compilation_cache

    enable_compilation_cache()
    ck = checkpoint.load_target(hub.SMOLLM2)
    tok = ck.tokenizer()
    ids = [encode(tok, t, chat=True) for t in texts]
    dec = Decoder(ck.params, ck.cfg)
    rows = []
    for b in (1, 4, 16):
        compile_s = dec.generate(ids[:b], n_new)[0].compile_s
        secs = 0.0
        for i in range(0, len(ids), b):
            secs += dec.generate(ids[i : i + b], n_new)[0].decode_s
        rows.append(
            {
                "batch": b,
                "decode_tok_s": len(ids) * (n_new - 1) / secs,
                "ms_per_step": 1e3 * secs / (len(ids) // b) / (n_new - 1),
                "compile_s": compile_s,
            }
        )
    return rows, 0.0


def run_hf(texts, n_new, batch):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dflash_jax import checkpoint

    torch.set_num_threads(os.cpu_count())
    folder = checkpoint.smollm2_hf_dir()
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    rows = []
    for i, text in enumerate(texts):
        ids = tok.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )["input_ids"]
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
    run = {"jax": run_jax, "hf": run_hf, "round": run_round, "batch": run_batch, "stream": run_stream}[args.impl]
    rows, compile_s = run(texts, args.new_tokens, args.batch)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        json.dumps(
            {"impl": args.impl, "batch": args.batch, "rows": rows, "compile_s": compile_s, "peak_rss_mb": peak_mb}
        )
    )


def _child(impl: str, prompts: int, new_tokens: int, batch: int = 1) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--impl",
        impl,
        "--batch",
        str(batch),
        "--prompts",
        str(prompts),
        "--new-tokens",
        str(new_tokens),
    ]
    print(f"running {impl} ...", file=sys.stderr, flush=True)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def suite_vs_hf(args) -> dict:
    results = [_child("jax", args.prompts, args.new_tokens), _child("hf", args.prompts, args.new_tokens)]
    lines = [
        "| implementation | batch | decode tokens/s (mean) | time to first token (s, mean) | peak RSS (MB) "
        "| compile (s) |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        tps = statistics.mean(x["decode_tok_s"] for x in r["rows"])
        ttft = statistics.mean(x["ttft_s"] for x in r["rows"])
        r["decode_tok_s_mean"], r["ttft_s_mean"] = tps, ttft
        name = "dflash-jax (ours)" if r["impl"] == "jax" else "transformers generate"
        lines.append(
            f"| {name} | {r['batch']} | {tps:.1f} | {ttft:.3f} | {r['peak_rss_mb']:.0f} | {r['compile_s']:.1f} |"
        )
    ratio = results[0]["decode_tok_s_mean"] / results[1]["decode_tok_s_mean"]
    lines.append(f"\nratio ours / transformers (decode tokens/s): {ratio:.2f}x")
    return {
        "prompts": args.prompts,
        "new_tokens": args.new_tokens,
        "results": results,
        "ratio": ratio,
        "table": "\n".join(lines),
    }


def suite_round(args) -> dict:
    r = _child("round", args.prompts, args.new_tokens)
    lines = [
        "| block size | ms per round | round cost (plain steps) | tau (random drafter) | compile (s) |",
        "|---|---|---|---|---|",
    ]
    for x in r["rows"]:
        lines.append(
            f"| {x['block_size']} | {x['ms_per_round']:.1f} | {x['round_cost_steps']:.2f} | "
            f"{x['tau']:.2f} | {x['compile_s']:.1f} |"
        )
    return {"prompts": args.prompts, "new_tokens": args.new_tokens, "rows": r["rows"], "table": "\n".join(lines)}


def suite_batch(args) -> dict:
    r = _child("batch", 16, 64)
    lines = ["| batch | decode tokens/s (all rows) | ms per step | compile (s) |", "|---|---|---|---|"]
    for x in r["rows"]:
        lines.append(f"| {x['batch']} | {x['decode_tok_s']:.1f} | {x['ms_per_step']:.1f} | {x['compile_s']:.1f} |")
    return {"prompts": 16, "new_tokens": 64, "rows": r["rows"], "table": "\n".join(lines)}


def suite_stream(args) -> dict:
    r = _child("stream", args.prompts, args.new_tokens)
    lines = [
        "| block size | generate (s, all prompts) | stream (s) | overhead | ms per round callback |",
        "|---|---|---|---|---|",
    ]
    for x in r["rows"]:
        lines.append(
            f"| {x['block_size']} | {x['generate_s']:.2f} | {x['stream_s']:.2f} | "
            f"{100 * x['overhead']:+.1f}% | {x['ms_per_callback']:.2f} |"
        )
    return {"prompts": args.prompts, "new_tokens": args.new_tokens, "rows": r["rows"], "table": "\n".join(lines)}


SUITES = {"vs-hf": suite_vs_hf, "round": suite_round, "batch": suite_batch, "stream": suite_stream}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", choices=["all", *SUITES], default="all")
    ap.add_argument("--prompts", type=int, default=5, help="GSM8K test prompts (vs-hf and round suites)")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--out", default="docs/bench_decode.json", help="JSON file; suites run now replace their entry")
    ap.add_argument("--impl", choices=["jax", "hf", "round", "batch", "stream"], help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.impl:
        return worker(args)
    out = Path(args.out)
    report = json.loads(out.read_text()) if out.exists() else {}
    report.pop("results", None), report.pop("table", None), report.pop("ratio", None)  # the old single-suite layout
    report["machine"] = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    for name in SUITES if args.suite == "all" else [args.suite]:
        report[name] = SUITES[name](args)
        report[name]["date"] = time.strftime("%Y-%m-%d")
        print(f"\n## {name}\n{report[name]['table']}", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
