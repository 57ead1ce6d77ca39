"""One speculation plan: what every round of the decoding loop does, resolved once per run.

A ``Plan`` is frozen: the draft step (``steps``: the DFlash drafter, prompt lookup, both, or any
other step), its parameters, the block size, the verify lengths the loop may choose from each
round and their costs, whether the choice is calibrated per row, and a label for people. The
``Decoder`` takes a plan (or ``None``: plain decoding) and never inspects the step it holds.

Two functions build plans, and every range check of these settings lives in them:

- ``make_plan(step, params, ...)``: from a step in hand (the Python API, tests, studies). It
  checks the block size against the step and the verify lengths and costs against the block.
- ``plan_for(ck, drafter, ...)``: from what a user asks (``--drafter auto``, a folder, ``ngram``,
  ``random``, ``none``, and the drafting flags), on this backend. It owns the CPU/accelerator
  policy of ``auto`` and calls ``make_plan``. ``load`` resolves and loads a drafter once, so a run
  that builds several plans (``bench``'s arms, ``demo``'s rows) reads it once.

Every plan is lossless: the loop verifies every draft token it commits (greedy: output identical
to plain decoding; sampled: the target's distribution, SPEC "Sampling").
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from dflash_jax.checkpoint import TargetCheckpoint
from dflash_jax.drafter import DRAFT_VOCAB, DrafterConfig, DraftStep
from dflash_jax.drafter_io import check_draft_vocab_size, drafter_for, resolve_drafter
from dflash_jax.errors import ConfigError
from dflash_jax.ngram import HybridStep, NgramStep
from dflash_jax.tree_step import TreeStep

# The verify lengths verify_lengths="auto" offers on a CPU, where a multi-token verify is
# compute-bound (a 16-token verify costs 2.1-3.8 plain steps on the 2-core machines this project
# runs on; docs/BENCHMARKS.md "Speculative round cost"). Their costs are measured on the machine.
AUTO_VERIFY_LENGTHS = (1, 2, 4, 8, 16, 32)  # (32: trees of more than 16 nodes)

# How often a prompt-lookup draft token is right, per matched suffix length n = 1..4: (the first
# token, each later one given the ones before), as the verify-length choice reads it. Measured on
# SmolLM2-135M's recorded greedy answers to 160 first turns of the five benchmark sets
# (`experiments/ngram_acceptance.py`; docs/JOURNAL.md, "Prompt lookup and the default settings").
NGRAM_CONFIDENCE = ((0.24, 0.68), (0.51, 0.78), (0.61, 0.79), (0.87, 0.95))

# The block size of ``--drafter auto`` on a CPU: the drafter shipped then beside prompt lookup at block 8
# decoded GSM8K 1.60x plain against prompt lookup alone's 1.27x (8 prompts a set; level over the five
# sets, 1.31x both; `experiments/default_candidates.py`, docs/JOURNAL.md "The CPU default"). Rechecked with the
# drafter shipped now on an Intel Xeon: block 16 (widths up to 16) level with 8, 1.56x against 1.57x plain over 18
# prompts (docs/BENCHMARKS.md, "The CPU block with the drafter shipped now").
CPU_BLOCK_SIZE = 8

# A tree's prompt-lookup branches: the 3 best earlier occurrences of the last tokens, a branch each. From
# recorded greedy answers (10 first turns a set, stage 6, the drafter shipped then, 16 nodes): 1.21-1.28x the
# chain's tau on the five sets, against 1.16-1.26x with the latest occurrence's alone (docs/BENCHMARKS.md
# "Draft trees").
TREE_LOOKUP_BRANCHES = 3

# ``--tree auto``'s node budget for the shipped drafter on a CPU, greedy; 0: chains. A tree pays there only
# through the tokens it adds per position verified (a verify is compute-bound: 17 positions cost 2.4x one, 8
# cost 1.6x). With stage 6 a 7-node tree (widths up to 8, the chains' CPU block) was 1.012 +- 0.005x the
# chains' speed prompt by prompt on an AMD EPYC machine (200 prompts; stage 8 as trained: 1.008 +- 0.006x).
# With the drafter shipped now (stage 8 read with a longer reach, whose chain already carries prompt lookup's
# long copies) on an Intel Xeon machine it was 0.974 +- 0.006x (slower on four sets; MT-Bench 0.941 +- 0.010x
# alone), so ``auto`` verifies chains until a tree is measured faster with it (docs/BENCHMARKS.md "Draft
# trees"); ``--tree 7`` gives that tree. Sampled decoding, another drafter and an accelerator verify chains too.
CPU_TREE_BUDGET = 0

# What --drafter takes besides a folder.
DRAFTER_NAMES = ("auto", "none", "random", "ngram")


@dataclasses.dataclass(frozen=True, eq=False)  # eq=False: params are arrays, compared by identity
class Plan:
    """What a round does (see the module docstring); build it with ``make_plan`` or ``plan_for``.

    Fields:
      step: the draft step (``steps``), static and hashable.
      params: its parameter pytree (``None`` for a step without parameters).
      block_size: the block each round drafts, anchor included (``2 .. step.max_block_size``).
      verify_lengths: the lengths the loop may verify per round, ascending, the block size last;
        ``()``: the whole block every round (the plain SPEC loop).
      verify_costs: a round's cost at each verify length (any unit); ``None``: measured on this
        machine when a shape is first compiled (``Decoder.measure_verify_costs``).
      calibrate: with verify lengths, correct the step's confidence per row from the acceptance
        its earlier rounds saw (``decode.calibrate``).
      label: words for people and logs (e.g. "DFlash 2 over 8192 tokens + prompt lookup").
      draft_gate: a row drafts only while its drafted rounds commit at least as many tokens per unit of
        cost as plain steps would, and takes plain steps otherwise, drafting now and then to look again
        (``decode.gate_drafts``; needs verify lengths starting at 1).
      draft_cost: with ``draft_gate``, a draft's cost in the unit of ``verify_costs`` (given with them);
        ``None``: measured (``Decoder.measure_draft_cost``).
    """

    step: Any
    params: Any
    block_size: int
    verify_lengths: tuple[int, ...] = ()
    verify_costs: tuple[float, ...] | None = None
    calibrate: bool = True
    label: str = ""
    draft_gate: bool = False
    draft_cost: float | None = None

    def describe(self) -> str:
        """One line for logs: the label, the block size, the verify lengths and the draft gate."""
        lengths = ", ".join(map(str, self.verify_lengths)) if self.verify_lengths else "the block"
        gate = ", draft gate on" if self.draft_gate else ""
        return f"{self.label}, block size {self.block_size}, verify lengths {lengths}{gate}"


def parse_verify_lengths(value: str | Sequence[int] | None) -> str | tuple[int, ...] | None:
    """``--verify-lengths`` as ``make_plan`` takes it: ``"auto"``, ``None`` (``"full"``: the block
    only) or a tuple of lengths (``"1,4,16"`` or a sequence of ints).

    Raises:
      ValueError: anything else, or a length below 1.
    """
    if value is None or isinstance(value, str) and value == "full":
        return None
    if isinstance(value, str) and value == "auto":
        return "auto"
    try:
        lengths = tuple(_whole(x) for x in (value.split(",") if isinstance(value, str) else value))
    except (TypeError, ValueError):
        lengths = ()
    if not lengths or min(lengths) < 1:
        raise ValueError(f"--verify-lengths takes auto, full or positive numbers such as 1,4,16; got {value!r}")
    return lengths


def _whole(x) -> int:
    """``x`` as an int if it is a whole number (``"4"``, ``4``, ``4.0``); ValueError otherwise."""
    number = float(x)
    if not number.is_integer():
        raise ValueError(f"{x!r} is not a whole number")
    return int(number)


def check_block_size(block_size, limit: int | None = None, drafter: str | None = None) -> None:
    """The one check of a block size (anchor included): a whole number in ``[2, limit]`` (``limit``:
    the draft step's longest block; None: not known yet). ``drafter``: what ``--drafter`` asked, for
    the message when it means plain decoding (``none``: a block of 1 only).

    Raises:
      ValueError: naming the block size, the range and the fix.
    """
    if block_size is None:
        return
    if drafter == "none":
        if block_size != 1:
            raise ValueError(f"--block-size {block_size} with --drafter none: plain decoding has no block to draft")
        return
    whole = isinstance(block_size, int | np.integer) or isinstance(block_size, float) and block_size.is_integer()
    if limit is not None and not (whole and 2 <= block_size <= limit):
        raise ValueError(
            f"block size {block_size} not in [2, {limit}] for this drafter; pass --block-size between 2 and {limit}"
        )
    if not (whole and block_size >= 2):
        raise ValueError(
            f"block size {block_size}: a block holds the anchor and at least one draft token; pass --block-size 2 "
            "or more (--drafter none is plain decoding)"
        )


def make_plan(
    step,
    params=None,
    *,
    block_size: int | None = None,
    verify_lengths: str | Sequence[int] | None = None,
    verify_costs: Sequence[float] | str | None = None,
    calibrate: bool = True,
    backend: str | None = None,
    label: str | None = None,
    draft_gate: bool = False,
    draft_cost: float | None = None,
) -> Plan:
    """The plan that drafts with ``step`` (``steps``; ``params`` its parameters).

    Args:
      block_size: the block (anchor included); default the step's ``default_block_size``, raised
        to the longest explicit verify length the step can take.
      verify_lengths: ``None``/``"full"``: the block every round; ``"auto"``: on a CPU
        ``AUTO_VERIFY_LENGTHS`` up to the block (a long verify is compute-bound there), elsewhere
        the block only; or lengths (``parse_verify_lengths``), the block always among them. Per
        round the loop picks the one that commits most tokens per unit of cost
        (``decode.choose_verify_length``). Output is unchanged either way. For a step that drafts
        trees (``tree_size``) these are verify widths, the anchor and the best ``width - 1`` nodes,
        up to the whole tree (``decode.choose_tree_width``).
      verify_costs: a cost per verify length; ``None`` or ``"measure"``: measured on this machine.
      calibrate: see ``Plan``.
      backend: ``jax.default_backend()`` unless given (``"cpu"``, ``"gpu"``, ``"tpu"``).
      label: see ``Plan``; default the step's class name.
      draft_gate, draft_cost: see ``Plan``; ``draft_cost`` goes with ``verify_costs`` (both given, or
        both measured).

    Raises:
      ValueError: a block size outside ``[2, step.max_block_size]``, verify lengths outside
        ``[1, block size]`` or malformed, or costs that are not one positive number per length; a
        draft gate without verify lengths starting at 1, or a draft cost without verify costs (or
        the other way round).
    """
    backend = backend or jax.default_backend()
    limit = step.max_block_size
    verify_lengths = parse_verify_lengths(verify_lengths)
    tree = getattr(step, "tree_size", 0)  # a tree step: the lengths are verify widths, anchor + nodes
    if block_size is None:
        block_size = step.default_block_size
        if isinstance(verify_lengths, tuple) and not tree:  # long enough for the lengths asked
            block_size = max([block_size, *(n for n in verify_lengths if n <= limit)])
    check_block_size(block_size, limit)
    full = tree + 1 if tree else block_size
    if verify_lengths == "auto":
        verify_lengths = tuple(n for n in AUTO_VERIFY_LENGTHS if n <= full) if backend == "cpu" else None
    lengths = sorted({*(verify_lengths or ()), full})
    if lengths[-1] > full:
        if tree:
            raise ValueError(
                f"verify lengths {list(verify_lengths)} must lie in [1, {full}] for a tree of {tree} nodes (the "
                "anchor and its nodes); pass shorter ones or a larger --tree"
            )
        fix = (
            f"pass shorter ones or a larger --block-size (this drafter's longest block is {limit})"
            if lengths[-1] <= limit
            else f"pass lengths from 1 to {limit}, the longest block this drafter drafts"
        )
        raise ValueError(f"verify lengths {list(verify_lengths)} must lie in [1, block size {block_size}]; {fix}")
    costs = None
    if not (verify_costs is None or isinstance(verify_costs, str) and verify_costs == "measure"):
        costs = tuple(float(c) for c in np.asarray(verify_costs, np.float64).ravel())
        if len(costs) != len(lengths) or not all(0 < c < float("inf") for c in costs):
            raise ValueError(f"verify costs {list(costs)} must give one positive cost per verify length {lengths}")
    several = len(lengths) > 1
    if draft_gate:
        if not several or lengths[0] != 1:
            raise ValueError(
                f"a draft gate takes plain steps, a verify of length 1: pass verify lengths that start at 1 (such as "
                f"auto on a CPU, or 1,4,{full}); got {lengths}"
            )
        if (costs is None) != (draft_cost is None) or draft_cost is not None and not 0 < draft_cost < float("inf"):
            raise ValueError(
                f"draft cost {draft_cost} with verify costs {costs}: give a positive draft cost with the verify costs, "
                "or neither (both measured)"
            )
    return Plan(
        step,
        params,
        int(block_size),
        tuple(lengths) if several else (),
        costs if several else None,
        bool(calibrate),
        label or type(step).__name__,
        bool(draft_gate),
        float(draft_cost) if draft_gate and draft_cost is not None else None,
    )


@dataclasses.dataclass(frozen=True, eq=False)
class Drafter:
    """A DFlash drafter loaded for a target, once per run (``load``).

    Fields: ``params`` (on the default device, with its draft vocabulary when it has one),
    ``cfg``, ``source`` (its folder, or ``"random"``), ``shipped`` (it is the drafter ``auto``
    found for this target, whose CPU policy ``plan_for`` applies).
    """

    params: Any
    cfg: DrafterConfig
    source: str
    shipped: bool = False

    @property
    def label(self) -> str:
        """``DFlash`` / ``DFlash 2``, and ``over N tokens`` with a draft vocabulary."""
        vocab = self.params.get(DRAFT_VOCAB) if isinstance(self.params, dict) else None
        over = f" over {vocab['ids'].shape[0]} tokens" if vocab is not None else ""
        return ("DFlash 2" if self.cfg.dflash2 else "DFlash") + over


def check_drafter_name(spec: str) -> None:
    """Raise ``ConfigError`` unless ``spec`` is one of ``DRAFTER_NAMES`` or an existing folder."""
    if spec not in DRAFTER_NAMES and not Path(spec).is_dir():
        names = ", ".join(DRAFTER_NAMES)
        raise ConfigError(f"--drafter {spec} does not exist (give a drafter folder or one of {names})")


def check_request(
    drafter,
    ngram_max: int = 4,
    ngram_min: int = 1,
    verify_lengths=None,
    draft_vocab: int | None = None,
    block_size: int | None = None,
) -> None:
    """The checks of what a user asks that need no model (``plan_for`` makes them too; a CLI makes
    them before loading one): the drafter's name (``check_drafter_name``; a loaded ``Drafter``
    passes), the n-gram lengths (``NgramStep``), the verify lengths' form
    (``parse_verify_lengths``), the draft vocabulary's size (``drafter_io.check_draft_vocab_size``)
    and the block size's lower bound (``check_block_size``; its upper bound needs the drafter).

    Raises:
      ConfigError: an unknown drafter name or a missing folder; a negative draft vocabulary.
      ValueError: bad n-gram or verify lengths, or block size.
    """
    if isinstance(drafter, str):
        check_drafter_name(drafter)
    check_block_size(block_size, drafter=drafter if isinstance(drafter, str) else None)
    NgramStep(ngram_max, ngram_min)
    parse_verify_lengths(verify_lengths)
    check_draft_vocab_size(draft_vocab)


def load(spec: str, ck: TargetCheckpoint, tok, *, seed: int = 0, draft_vocab: int | None = None) -> Drafter | str:
    """Resolve ``--drafter spec`` for target ``ck`` and load the DFlash drafter it names, once.

    ``auto`` -> the drafter shipped for this target (``hub.SHIPPED_DRAFTERS``), else ``"none"``;
    ``random`` -> a fresh 1-layer drafter (block 16, seeded by ``seed``); a folder -> that drafter
    (ours or the released format); ``none`` and ``ngram`` are returned as they are (no DFlash
    drafter). ``draft_vocab``: as ``drafter_io.drafter_for``.

    Raises:
      ConfigError: an unknown name or a missing folder; the drafter does not fit the target; a
        bad ``draft_vocab``.
      CheckpointError: a damaged drafter folder.
    """
    check_drafter_name(spec)
    resolved = resolve_drafter(spec, ck)
    if resolved in ("none", "ngram"):
        return resolved
    params, cfg = drafter_for(resolved, ck, tok, seed, draft_vocab)
    return Drafter(params, cfg, resolved, shipped=spec == "auto")


def parse_tree(value: int | str | None) -> int | str:
    """``--tree`` as a node budget: ``None``/``"off"``/0 -> 0 (chains), ``"auto"`` as it is (``plan_for``
    decides: ``CPU_TREE_BUDGET`` where one is measured faster, else chains), else a whole number >= 2.

    Raises:
      ValueError: anything else.
    """
    if value is None or value in ("off", 0, "0"):
        return 0
    if value == "auto":
        return "auto"
    try:
        budget = _whole(value)
    except (TypeError, ValueError):
        budget = 0
    if budget < 2:
        raise ValueError(f"--tree takes off, auto or a node budget of 2 or more (such as 16); got {value!r}")
    return budget


def parse_draft_gate(value: bool | str | None) -> bool | str:
    """``--draft-gate`` as ``plan_for`` takes it: ``"on"``/True, ``"off"``/False/None, or ``"auto"``.

    Raises:
      ValueError: anything else.
    """
    if value in (True, "on"):
        return True
    if value in (None, False, "off"):
        return False
    if value == "auto":
        return "auto"
    raise ValueError(f"--draft-gate takes on, off or auto; got {value!r}")


def ngram_confidence(ngram_max: int) -> tuple[tuple[float, float], ...]:
    """``NGRAM_CONFIDENCE`` for suffix lengths 1..ngram_max (lengths past 4 take length 4's)."""
    return tuple(NGRAM_CONFIDENCE[min(n, len(NGRAM_CONFIDENCE)) - 1] for n in range(1, ngram_max + 1))


def plan_for(
    ck: TargetCheckpoint,
    drafter: str | Drafter = "auto",
    tok=None,
    *,
    prompt_lookup: bool = True,
    ngram_max: int = 4,
    ngram_min: int = 1,
    block_size: int | None = None,
    verify_lengths: str | Sequence[int] | None = "auto",
    verify_costs: Sequence[float] | None = None,
    calibrate: bool = True,
    draft_vocab: int | None = None,
    seed: int = 0,
    backend: str | None = None,
    tree: int | str | None = "auto",
    skip_drafter: bool | None = None,
    sampled: bool = False,
    draft_gate: bool | str = "auto",
) -> Plan | None:
    """The plan for what a user asks (``generate``'s flags); ``None``: plain decoding.

    ``drafter``: a ``--drafter`` value (``load``; needs ``tok`` for ``random``) or a ``Drafter``
    already loaded. ``ngram`` -> prompt lookup alone (``NgramStep``); ``none`` -> plain. A DFlash
    drafter with ``prompt_lookup`` -> ``HybridStep`` (prompt lookup where the last
    ``min(2, ngram_max)`` tokens occurred before, the drafter elsewhere); without, the drafter
    alone (so also a drafter that reads the prompt-lookup continuation itself, ``block_input
    ="ngram"``, unless ``auto`` on a CPU). ``auto`` with ``prompt_lookup`` is the fastest setup
    measured for the backend: on an accelerator the shipped drafter as above; on a CPU the shipped
    drafter beside prompt lookup at block ``CPU_BLOCK_SIZE`` (there a 16-token verify costs 2-3.8
    plain steps and prompt lookup's long matches need no drafter forward: docs/JOURNAL.md "The
    CPU default"); with no drafter shipped, prompt lookup alone. The other arguments: as
    ``make_plan`` (``verify_lengths`` default ``"auto"``, as ``generate``'s).

    ``tree``: ``None``/``"off"``: chains; ``"auto"`` (the default, as ``generate``'s): a tree where one is
    measured faster, else chains. The rule: the shipped drafter on a CPU with prompt lookup, decoding greedily
    (``sampled`` False) at the default block size and verify lengths, verifies a tree of ``CPU_TREE_BUDGET``
    nodes, today 0 (chains: with the drafter shipped now the 7-node tree measured slower than its chains);
    everything else chains (sampled decoding, another drafter, an accelerator; never a Gated DeltaNet
    target); a number ``N``: a DFlash drafter's best-first tree of ``N`` nodes a round
    (``tree_step.TreeStep``; docs/TREES.md), with prompt lookup's continuations after
    the ``TREE_LOOKUP_BRANCHES`` best earlier occurrences as branches when ``prompt_lookup``. On a CPU
    a row with a match then takes the branches alone (the drafter's forward skipped when every row
    has one, ``skip_drafter``) and the shipped drafter drafts
    at ``CPU_BLOCK_SIZE``, as its chains do. Its verify lengths are widths: the anchor and the best
    ``width - 1`` nodes (``decode.choose_tree_width``). ``skip_drafter``: whether a tree row with a
    prompt-lookup match takes the branches alone (``TreeStep.skip_drafter``); ``None``: on a CPU only,
    ``False``: every row's tree holds both drafts, as on an accelerator.

    ``draft_gate``: ``"on"``/``"off"``, or ``"auto"`` (the default, as ``generate``'s): on where a gate is
    measured faster (``Plan.draft_gate``), today nowhere. It was built for sampled decoding on a CPU, where
    the defaults with stage 8 ran at 0.61-1.04x plain decoding at temperature 1 on 8 GSM8K prompts of an AMD
    EPYC machine; on an Intel Xeon machine with the drafter shipped now the same 8 prompts ran at 0.93-1.05x
    plain without the gate and 0.87-1.03x with it (it took plain steps where drafting broke even, and a plain
    round of the speculative loop costs more than a plain decoder's step; docs/JOURNAL.md, 2026-12-06).

    Raises:
      ValueError: bad n-gram lengths, block size, verify lengths or costs; a block size with no
        drafter; a tree without a DFlash drafter, or a tree budget below 2; a draft gate without
        verify lengths starting at 1, or a bad ``draft_gate``.
      ConfigError, CheckpointError: as ``load``.
    """
    if isinstance(drafter, os.PathLike):
        drafter = os.fspath(drafter)
    check_request(drafter, ngram_max, ngram_min, verify_lengths, draft_vocab, block_size)
    ngram = NgramStep(ngram_max, ngram_min, confidence=ngram_confidence(ngram_max))
    loaded = load(drafter, ck, tok, seed=seed, draft_vocab=draft_vocab) if isinstance(drafter, str) else drafter
    if loaded == "none" and drafter == "auto" and prompt_lookup:  # nothing shipped: prompt lookup alone
        loaded = "ngram"
    budget = parse_tree(tree)
    if loaded == "none":
        if block_size not in (None, 1):
            why = "no drafter is shipped for this target" + ("" if prompt_lookup else " and prompt lookup is off")
            raise ValueError(f"--block-size {block_size}: --drafter {drafter} decodes plainly here ({why})")
        if budget not in (0, "auto"):
            raise ValueError(f"--tree {tree}: --drafter {drafter} decodes plainly here; pass a drafter or --tree off")
        return None
    settings = dict(
        block_size=block_size,
        verify_lengths=verify_lengths,
        verify_costs=verify_costs,
        calibrate=calibrate,
        backend=backend,
    )
    on_cpu = (backend or jax.default_backend()) == "cpu"  # where a drafter forward is much of a round
    gate = parse_draft_gate(draft_gate)
    settings["draft_gate"] = False if gate == "auto" else gate  # auto: nowhere measured faster yet
    auto_on_cpu = not isinstance(loaded, str) and loaded.shipped and on_cpu
    if budget == "auto":  # a tree where one is measured faster than chains (CPU_TREE_BUDGET; 0 today)
        # and only at the defaults' own block and widths: a --block-size or --verify-lengths asked for gets chains
        defaults = block_size is None and verify_lengths == "auto"
        measured = auto_on_cpu and prompt_lookup and defaults and not sampled
        budget = CPU_TREE_BUDGET if measured and not ck.cfg.has_linear_layers else 0  # DeltaNet: no per-node state
    if budget and isinstance(loaded, str):
        raise ValueError(
            f"--tree {tree}: a draft tree is built from a DFlash drafter's distributions; pass --drafter auto or a "
            "drafter folder, or --tree off"
        )
    if loaded == "ngram":
        return make_plan(ngram, label="prompt lookup alone", **settings)
    alone = DraftStep(loaded.cfg, ck.cfg)
    if budget:
        branch = dataclasses.replace(ngram, block_size=loaded.cfg.block_size) if prompt_lookup else None
        skip = on_cpu if skip_drafter is None else skip_drafter
        step = TreeStep(
            alone,
            budget,
            branch,
            min(2, ngram_max),
            skip_drafter=skip and branch is not None,
            lookup_branches=TREE_LOOKUP_BRANCHES,
        )
        words = f"{loaded.label} tree of {budget} nodes" + (" with prompt-lookup branches" if prompt_lookup else "")
        if auto_on_cpu and settings["block_size"] is None and prompt_lookup:  # as the chains' CPU default
            settings["block_size"] = min(CPU_BLOCK_SIZE, loaded.cfg.block_size)
        return make_plan(step, loaded.params, label=words, **settings)
    reads = loaded.cfg.block_input == "ngram"  # its block input is the prompt-lookup continuation
    label = f"{loaded.label} {'reading prompt lookup' if reads else 'alone'}"
    if not prompt_lookup or (reads and not auto_on_cpu):
        return make_plan(alone, loaded.params, label=label, **settings)
    ngram = dataclasses.replace(ngram, block_size=loaded.cfg.block_size)
    default = min(CPU_BLOCK_SIZE, loaded.cfg.block_size) if auto_on_cpu else None
    hybrid = HybridStep(alone, ngram, min(2, ngram_max), default)
    return make_plan(hybrid, loaded.params, label=f"{loaded.label} + prompt lookup", **settings)
