"""N-gram (prompt-lookup) drafting: the training-free draft step (SPEC "N-gram (prompt-lookup) drafting").

Each round, for ``n`` from ``ngram_max`` down to ``ngram_min``, find the most recent earlier
occurrence of the last ``n`` committed tokens (the anchor, at position ``start``, included) in
the sequence so far (prompt included, token buffer positions ``0 .. start``); at the first ``n``
that matches, the draft is the up to ``B - 1`` tokens that followed that occurrence, cut where the
committed sequence ends (only positions ``<= start`` are proposed, never stale buffer slots).
No match: no draft, and the round commits one token. "Earlier" means the occurrence ends at a
position ``< start``. Verification is the loop's own; under sampling the draft is a point mass
``q`` (one-hot), so the rejection rule stays exact: a draft token ``x`` is accepted with
probability ``p(x)`` and the first rejection resamples from ``norm(p with x removed)``.

Use it as a draft step (``steps``) without parameters::

    Decoder(target_params, cfg, make_plan(NgramStep(ngram_max=4, ngram_min=1, block_size=16)))
    Decoder(target_params, cfg, make_plan(NgramStep(), block_size=8))  # at block 8

The match runs on device over the loop's token buffer, vectorised over the batch: per round and
row, ``ngram_max`` compares of the buffer ``[S + block]`` with one window token each (linear in
``S``), and one max-reduction that picks the longest match and, among those, the latest.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp

from dflash_jax.steps import Draft, OnDrafter, point_mass

Array = jax.Array


def ngram_propose(
    tokens: Array, start: Array, num_tokens: int, ngram_max: int = 4, ngram_min: int = 1
) -> tuple[Array, Array]:
    """The n-gram draft of every row (SPEC "N-gram (prompt-lookup) drafting").

    Args:
      tokens: int32 ``[B, L]`` token buffer by absolute position; positions ``0 .. start[b]``
        of row ``b`` are its committed tokens (later slots are ignored).
      start: int32 ``[B]`` position of each row's anchor (its last committed token);
        ``start[b] + num_tokens < L``.
      num_tokens: static, the most tokens to propose (``B - 1`` for block size ``B``).
      ngram_max, ngram_min: static n-gram lengths tried, longest first (``1 <= min <= max``).

    Returns:
      ``(draft, num_draft)``: int32 ``[B, num_tokens]`` proposals (0 past ``num_draft``) and int32
      ``[B]`` how many are real: the tokens after the latest earlier occurrence of the longest
      matching suffix, at most up to position ``start`` (0 when nothing matches).
    """
    draft, num, _ = ngram_match(tokens, start, num_tokens, ngram_max, ngram_min)
    return draft, num


def ngram_match(
    tokens: Array, start: Array, num_tokens: int, ngram_max: int = 4, ngram_min: int = 1, *, periodic: bool = False
) -> tuple[Array, Array, Array]:
    """``ngram_propose`` plus int32 ``[B]`` the length ``n`` of the suffix that matched (0: none);
    ``periodic``: as ``ngram_matches``."""
    cont, num, matched = ngram_matches(tokens, start, num_tokens, ngram_max, ngram_min, periodic=periodic)
    return cont[:, 0], num[:, 0], matched[:, 0]


def ngram_matches(
    tokens: Array,
    start: Array,
    num_tokens: int,
    ngram_max: int = 4,
    ngram_min: int = 1,
    count: int = 1,
    *,
    periodic: bool = False,
) -> tuple[Array, Array, Array]:
    """The ``count`` best earlier occurrences of each row's suffix, best first (the longest match, then
    the latest: the first is ``ngram_match``'s), each with what followed it: int32 ``(cont [B, count,
    num_tokens], num [B, count], matched [B, count])``, ``num`` 0 where fewer occurred. Occurrences of
    any length ``ngram_min .. ngram_max`` count, so a row with one 4-token match may also offer its
    3-token ones. Several drafts from one rule: a draft tree holds them as branches (``tree_step``).

    ``periodic`` (a dflash-jax extension, off in SPEC's rule): a continuation that reaches the anchor
    goes on repeating with the match's period instead of stopping there. An occurrence ending ``d``
    positions before the anchor proposes ``tokens[end + 1 + (j mod d)]`` at offset ``j + 1``, all
    ``num_tokens`` of them, which is what the text holds if it keeps repeating its last ``d`` tokens
    (a loop); only committed tokens are read either way."""
    fn = partial(_matches_row, k=num_tokens, nmax=ngram_max, nmin=ngram_min, count=count, periodic=periodic)
    return jax.vmap(fn)(tokens, start)


def _suffix_keys(t: Array, s: Array, nmax: int, nmin: int) -> Array:
    """Per position ``i < s``: ``m * length + i`` where ``m`` (capped at ``nmax``, at least ``nmin``) is
    the length of the common suffix of ``t[.. i]`` and ``t[.. s]``, else -1; larger is better."""
    length = t.shape[0]
    idx = jnp.arange(length, dtype=jnp.int32)
    run = idx < s
    m = jnp.zeros((length,), jnp.int32)
    for j in range(nmax):
        run = run & (idx >= j) & (jnp.roll(t, j) == t[jnp.maximum(s - j, 0)])  # t[i - j] == t[s - j]
        m = m + run
    return jnp.where(m >= nmin, m * length + idx, -1)


def _matches_row(
    t: Array, s: Array, k: int, nmax: int, nmin: int, count: int, periodic: bool = False
) -> tuple[Array, Array, Array]:
    length = t.shape[0]
    keys, best = _suffix_keys(t, s, nmax, nmin), []
    for _ in range(count):  # one max-reduction each (a top-k costs some 20 of them on a CPU)
        best.append(jnp.max(keys))
        keys = jnp.where(keys == best[-1], -1, keys)  # each key names its own position
    keys = jnp.stack(best)  # longest match first, then the latest occurrence
    found = keys >= 0
    end = jnp.where(found, keys % length, 0)  # where each occurrence ends
    if periodic:  # offset j + 1 reads end + 1 + (j mod d), d = s - end >= 1: never past the anchor
        num = jnp.where(found, k, 0).astype(jnp.int32)
        follow = t[end[:, None] + 1 + jnp.arange(k) % jnp.maximum(s - end, 1)[:, None]]  # [count, k]
    else:
        num = jnp.where(found, jnp.minimum(k, s - end), 0).astype(jnp.int32)
        follow = jax.vmap(lambda e: jax.lax.dynamic_slice_in_dim(t, e + 1, k))(end)  # [count, k]
    matched = jnp.where(found, keys // length, 0).astype(jnp.int32)
    return jnp.where(jnp.arange(k) < num[:, None], follow, 0).astype(jnp.int32), num, matched


@dataclasses.dataclass(frozen=True)
class NgramStep:
    """N-gram (prompt-lookup) drafting as a draft step of ``decode_loop`` (``steps``; the rule:
    SPEC "N-gram (prompt-lookup) drafting", computed by ``ngram_propose``).

    It reads no target layer and keeps no cache; its parameters are ``None``. Its ``Draft.num``
    counts the real tokens of the continuation, so acceptance never counts padding.

    Raises:
      ValueError: ``ngram_min < 1``, ``ngram_max < ngram_min``, ``block_size < 2``, or a
        ``confidence`` that is neither a probability nor ``ngram_max`` (first, later) pairs.
    """

    ngram_max: int = 4
    ngram_min: int = 1
    block_size: int = 16  # the default (and largest) block size of a plan using this step
    # How likely a proposed token is right, for the verify-length choice (a plan's verify_lengths):
    # one probability for every token, or per matched suffix length n = 1 .. ngram_max a pair (the
    # first token's, each later token's given the ones before it). None: every real token is
    # trusted fully (confidence 1 up to num, 0 after).
    confidence: float | tuple[tuple[float, float], ...] | None = None

    tap_layers = ()  # class attribute, not a field: the target taps nothing

    def __post_init__(self):
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {self.ngram_min} and {self.ngram_max}")
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2, got {self.block_size}")
        c = self.confidence
        table = c if isinstance(c, tuple) else ((c, c),) * self.ngram_max if c is not None else ()
        if c is not None and (len(table) != self.ngram_max or not all(0 < x <= 1 for pair in table for x in pair)):
            raise ValueError(
                f"confidence must be a probability or {self.ngram_max} (first, later) probability pairs, got {c!r}"
            )

    @property
    def max_block_size(self) -> int:
        """The largest block size a ``Decoder`` may use with this step (its ``block_size``)."""
        return self.block_size

    def init_cache(self, batch: int, cache_len: int):
        """No drafter cache: ``None`` (the token buffer is all the step reads)."""
        return None

    def write_context(self, params, cache, feats, start):
        """Nothing to write (``feats`` is ``None``: no taps); returns ``cache``."""
        return cache

    @property
    def default_block_size(self) -> int:
        """The block size a plan takes when none is asked for (its ``block_size``)."""
        return self.block_size

    def propose(self, params, target_params, cache, anchor, start, block_valid, block_len, *, tokens, key, sampling):
        """The ``Draft`` of every row (``steps``): the continuation after the latest earlier occurrence
        of the longest matching suffix of ``tokens [B, L]``, ``num`` its real tokens, ``confidence``
        from ``confidence`` and the matched length (without one: 1 on real tokens); under sampling
        ``q`` is the draft's point mass over the target's vocabulary (its embedding rows)."""
        draft, num, matched = ngram_match(tokens, start, block_len - 1, self.ngram_max, self.ngram_min)
        q = None if sampling.greedy else point_mass(draft, target_params["embedding"].shape[0])
        return Draft(draft, num, self.token_confidence(matched, num, block_len - 1), q)

    def token_confidence(self, matched: Array, num: Array, k: int) -> Array:
        """float32 ``[B, k]``: the probability that draft offset ``j + 1`` is right given offsets
        ``1 .. j`` were, from ``confidence`` and each row's matched length (0 past ``num``; without a
        ``confidence``, 1 up to ``num``)."""
        c = 1.0 if self.confidence is None else self.confidence
        table = jnp.asarray(c if isinstance(c, tuple) else ((c, c),) * self.ngram_max, jnp.float32)  # [nmax, 2]
        pair = table[jnp.clip(matched - 1, 0, self.ngram_max - 1)]  # [B, 2]
        offsets = jnp.arange(k)
        conf = jnp.where(offsets == 0, pair[:, :1], pair[:, 1:])
        return jnp.where(offsets < num[:, None], conf, 0.0)


@dataclasses.dataclass(frozen=True)
class HybridStep(OnDrafter):
    """Prompt lookup where it has a real match, the DFlash drafter elsewhere: per row and round.

    A row whose last ``min_match`` (or more) committed tokens occurred earlier takes the n-gram
    continuation (confidence ``ngram.confidence`` per token); every other row takes the drafter's
    block as the drafter alone would draft it (``DraftStep.propose``), with its confidence. When every row of the
    batch takes the n-gram draft, the drafter's forward is skipped (``lax.cond``); its context
    cache is written every round either way, so it is always current. Lossless like each part:
    the verify is the loop's own, and under sampling an n-gram row's ``q`` is the point mass of
    its draft (a DFlash row's: the drafter's own ``q``). ``default_block``: the block size a plan
    takes by default (``None``: the drafter's); any up to the drafter's may still be passed.
    ``drafter_block``: the block the drafter drafts at when the round's is larger (``None``: the round's):
    its rows then hold ``drafter_block - 1`` real tokens (confidence 0 past them), while prompt-lookup rows
    copy up to the round's block: a long copy may then verify the whole round's block while the drafter's forward,
    and the widths its rows choose, stay those of its own smaller block (measured on a CPU at 16 and 8:
    docs/BENCHMARKS.md, "Prompt lookup at 16, the drafter at 8").

    Raises:
      ValueError: ``min_match`` outside ``[1, ngram.ngram_max]``, or ``default_block`` or ``drafter_block``
        outside ``[2, the drafter's block size]``.
    """

    dflash: object  # a DraftStep
    ngram: NgramStep
    min_match: int = 2
    default_block: int | None = None
    drafter_block: int | None = None

    def __post_init__(self):
        if not 1 <= self.min_match <= self.ngram.ngram_max:
            raise ValueError(f"min_match must be in [1, ngram_max = {self.ngram.ngram_max}], got {self.min_match}")
        for name in ("default_block", "drafter_block"):
            value = getattr(self, name)
            if value is not None and not 2 <= value <= self.dflash.max_block_size:
                raise ValueError(f"{name} must be in [2, the drafter's {self.dflash.max_block_size}], got {value}")

    @property
    def default_block_size(self) -> int:
        """The block size a plan takes when none is asked for."""
        return self.default_block or self.dflash.max_block_size

    def _lookup(self, tokens: Array, start: Array, block_valid: Array, k: int):
        """``(draft [B, k], use [B], num_draft [B], confidence [B, k], idle)``: the n-gram continuation,
        the rows that take it, their real-token counts (``k`` on drafter rows), its confidence, and
        whether no row needs the drafter (an n-gram match, or a finished / padding row)."""
        ng, ng_num, matched = ngram_match(tokens, start, k, self.ngram.ngram_max, self.ngram.ngram_min)
        use = (matched >= self.min_match) & (ng_num > 0)
        conf = self.ngram.token_confidence(matched, ng_num, k)
        idle = jnp.all(use | (block_valid <= 1))
        return ng, use, jnp.where(use, ng_num, k), conf, idle

    def _drafter(self, idle: Array, run):
        """``run()`` unless ``idle``, else zeros of its output's shapes (the drafter's forward skipped)."""
        zeros = lambda: jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), jax.eval_shape(run))  # noqa: E731
        return jax.lax.cond(idle, zeros, run)

    def propose(self, params, target_params, cache, anchor, start, block_valid, block_len, *, tokens, key, sampling):
        """The ``Draft`` of every row from the better source: an n-gram row's continuation (its
        ``num``, the n-gram confidence table's ``confidence``, under sampling the point mass of its
        draft) or the drafter's own proposal (``DraftStep.propose``: greedy, its argmax or DFlash 2's
        walk; sampled, its draws and their ``q``), whose forward is skipped when no row needs it."""
        k = block_len - 1
        ng, use, num, conf_ng, idle = self._lookup(tokens, start, block_valid, k)
        kd = min(self.drafter_block or block_len, block_len)  # the drafter's own block this round
        args = (params, target_params, cache, anchor, start, jnp.minimum(block_valid, kd), kd)
        d = self._drafter(idle, partial(self.dflash.propose, *args, tokens=tokens, key=key, sampling=sampling))
        if kd < block_len:  # its rows hold kd - 1 real tokens: pad to the round's k (never accepted, confidence 0)
            pad = ((0, 0), (0, block_len - kd))
            padded = jnp.pad(d.tokens, pad)  # under sampling each padded token's q is its point mass
            d = d._replace(
                tokens=padded,
                confidence=jnp.pad(d.confidence, pad),
                q=None if d.q is None else jnp.concatenate([d.q, point_mass(padded[:, kd - 1 :], d.q.shape[-1])], 1),
            )
            num = jnp.where(use, num, kd - 1)
        q = None
        if not sampling.greedy:
            q = jnp.where(use[:, None, None], point_mass(ng, d.q.shape[-1]), d.q)
        return Draft(jnp.where(use[:, None], ng, d.tokens), num, jnp.where(use[:, None], conf_ng, d.confidence), q)
