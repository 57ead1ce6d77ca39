"""Shared fixtures. Fixtures that build models, data or trained drafters are session-scoped, also in
the test modules: under pytest-xdist's worksteal a worker can leave a module and come back to it, and
a module-scoped fixture is torn down and built again each time (a trained drafter: about a minute)."""

import os

# Eight simulated CPU devices for the mesh tests; must be set before jax is imported. LLVM's -O1
# instead of its default for the CPU code XLA emits: most of the suite's time is compiling tiny
# programs, which this makes about 30% faster, while running them gets a few percent slower (measured:
# docs/BENCHMARKS.md "Test-suite time"). Results move by rounding only (no fast-math at either level;
# SmolLM2's logits moved by 5e-6 of their scale), which every tolerance here allows (SPEC); a test
# compares runs within this one setting.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=1")
os.environ.setdefault("TQDM_DISABLE", "1")  # progress bars off in test logs
# Verify costs the tests time stay with this run (timed on a busy machine, they would mislead the
# user's own runs for good): decode.verify_costs_path.
os.environ.setdefault(
    "DFLASH_JAX_VERIFY_COSTS", os.path.join(__import__("tempfile").mkdtemp(prefix="dflash-jax-costs-"), "costs.json")
)

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from dflash_jax.utils import enable_compilation_cache  # noqa: E402

enable_compilation_cache()

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """One converted tiny checkpoint per family: {family: (hf_model, hf_dir, ckpt_dir)} (and "gemma4_moe":
    Gemma 4 with experts beside its MLPs)."""
    from helpers import DEEPSEEK_V3, GEMMA3, GEMMA4, GEMMA4_MOE, GLM4_MOE, LLAMA3_ROPE, make_hf_model

    from dflash_jax import checkpoint

    variants = {
        "llama": dict(rope_scaling=LLAMA3_ROPE, attention_bias=True),
        "qwen2": dict(),
        "qwen3": dict(tie_word_embeddings=True),
        # mixture of experts: 8 experts, 2 per token; Qwen3-MoE with one dense layer between MoE layers,
        # gpt-oss with sliding (window 8) and full layers, attention sinks, YaRN RoPE (its defaults)
        "qwen3_moe": dict(
            num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True, mlp_only_layers=[1]
        ),
        "gpt_oss": dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=32, sliding_window=8),
        # hybrid: three Gated DeltaNet layers, then one gated full-attention layer (partial RoPE, 4 of 16 dims)
        "qwen3_5": dict(
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16
        ),
        # hybrid with experts in every layer and a gated shared expert; two layers, one of each kind
        "qwen3_5_moe": dict(
            num_hidden_layers=2,
            layer_types=["linear_attention", "full_attention"],
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
        ),
        "gemma3": GEMMA3,
        "deepseek_v3": DEEPSEEK_V3,
        "glm4_moe": GLM4_MOE,
        "gemma4": GEMMA4,
        "gemma4_moe": GEMMA4_MOE,
    }
    root = tmp_path_factory.mktemp("tiny")

    class Made(dict):  # each family built the first time a test asks for it (a worker may never need most)
        def __missing__(self, family):
            if family not in variants:
                raise KeyError(family)
            hf_family = "gemma4" if family == "gemma4_moe" else family
            model = make_hf_model(hf_family, root / f"{family}-hf", **variants[family])
            checkpoint.convert_hf(root / f"{family}-hf", root / f"{family}-ckpt")
            self[family] = (model, root / f"{family}-hf", root / f"{family}-ckpt")
            return self[family]

    return Made()


@pytest.fixture(scope="session")
def smollm2():
    """The embedded SmolLM2-135M-Instruct: (TargetCheckpoint, tokenizer, HF torch model)."""
    import torch
    from transformers import AutoModelForCausalLM

    from dflash_jax import checkpoint, hub

    ck = checkpoint.load_target(hub.SMOLLM2)
    hf = AutoModelForCausalLM.from_pretrained(checkpoint.smollm2_hf_dir(), dtype=torch.float32).eval()
    return ck, ck.tokenizer(), hf


def eval_prompts(n: int, dataset: str = "gsm8k") -> list[str]:
    """First ``n`` real prompts of an evaluation set, in the reference benchmark's format."""
    import json

    from dflash_jax.prompts import PACKAGED_EVAL_DATA

    rows = [json.loads(line) for line in open(PACKAGED_EVAL_DATA / f"{dataset}_test.jsonl")]
    key = {"gsm8k": "question", "math500": "problem"}[dataset]
    suffix = "\nPlease reason step by step, and put your final answer within \\boxed{}."
    return [r[key] + suffix for r in rows[:n]]


@pytest.fixture(autouse=True)
def _executables_compiled_afresh_under_monkeypatch(request):
    """Decoders share compiled code by their static settings (``decode.clear_shared_executables``); a
    test that patches the code a Decoder compiles (a fault injected to prove a check has teeth) must compile
    its own, and must not leave its patched executables to the tests after it."""
    if "monkeypatch" not in request.fixturenames:
        yield
        return
    from dflash_jax import decode

    decode.clear_shared_executables()
    yield
    decode.clear_shared_executables()


MAX_MAPPINGS = 20_000  # a test worker's memory mappings past which compiled code nothing holds is dropped


def _mappings() -> int:
    try:
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f)
    except OSError:  # not Linux
        return 0


@pytest.fixture(autouse=True)
def _release_compiled_code():
    """After a test, once the worker holds more than ``MAX_MAPPINGS`` memory mappings, drop the compiled
    executables nothing holds any more (JAX's caches and the decoders' shared ones,
    ``decode.clear_shared_executables``). Each XLA:CPU executable keeps its code in mappings of its
    own, and a worker compiles thousands: one running
    test_tree.py alone passed 50000 (about 500 more a second), the kernel's limit is 65530 a process
    (``vm.max_map_count``), and past it the next executable loaded from the persistent cache crashed the
    worker (a segmentation fault in ``deserialize_executable``: three suite runs on 2026-12-05)."""
    yield
    if _mappings() > MAX_MAPPINGS:
        import gc

        import jax

        from dflash_jax import decode

        decode.clear_shared_executables()
        jax.clear_caches()
        gc.collect()


# Seconds of worker time per test file (setup, call and teardown summed over every test of the file),
# printed after the run: where the suite's time goes, for keeping `make test` inside its budget.
_FILE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::", 1)[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    if not _FILE_SECONDS:
        return
    total = sum(_FILE_SECONDS.values())
    terminalreporter.write_sep("=", f"worker time per test file ({total / 60:.1f} worker-minutes in all)")
    for path, seconds in sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{seconds:8.1f} s  {seconds / total:6.1%}  {path}")
