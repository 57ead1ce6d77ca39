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

Use it as a draft step without parameters::

    Decoder(target_params, cfg, drafter=NgramStep(ngram_max=4, ngram_min=1, block_size=16))
    Decoder(target_params, cfg, drafter=(None, NgramStep()), block_size=8)  # as a pair, at block 8

The match runs on device over the loop's token buffer, vectorised over the batch: per round and
row, ``ngram_max`` compares of the buffer ``[S + block]`` with one window token each (linear in
``S``), and one max-reduction that picks the longest match and, among those, the latest.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp

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
    tokens: Array, start: Array, num_tokens: int, ngram_max: int = 4, ngram_min: int = 1
) -> tuple[Array, Array, Array]:
    """``ngram_propose`` plus int32 ``[B]`` the length ``n`` of the suffix that matched (0: none)."""
    return jax.vmap(lambda t, s: _propose_row(t, s, num_tokens, ngram_max, ngram_min))(tokens, start)


def _propose_row(t: Array, s: Array, k: int, nmax: int, nmin: int) -> tuple[Array, Array, Array]:
    length = t.shape[0]
    idx = jnp.arange(length, dtype=jnp.int32)
    # m[i]: length (capped at nmax) of the common suffix of t[.. i] and t[.. s], for i < s.
    run = idx < s
    m = jnp.zeros((length,), jnp.int32)
    for j in range(nmax):
        run = run & (idx >= j) & (jnp.roll(t, j) == t[jnp.maximum(s - j, 0)])  # t[i - j] == t[s - j]
        m = m + run
    # longest match first, then the latest occurrence: one reduction over m * length + i
    key = jnp.max(jnp.where(m >= nmin, m * length + idx, -1))
    found = key >= 0
    end = jnp.where(found, key % length, 0)  # where the occurrence ends
    num = jnp.where(found, jnp.minimum(k, s - end), 0).astype(jnp.int32)
    follow = jax.lax.dynamic_slice_in_dim(t, end + 1, k)
    matched = jnp.where(found, key // length, 0).astype(jnp.int32)
    return jnp.where(jnp.arange(k) < num, follow, 0).astype(jnp.int32), num, matched


@dataclasses.dataclass(frozen=True)
class NgramStep:
    """N-gram (prompt-lookup) drafting as a draft step of ``decode_loop`` (see ``Decoder``;
    the rule: SPEC "N-gram (prompt-lookup) drafting", computed by ``ngram_propose``).

    It reads no target layer and keeps no cache; its parameters are ``None``. ``draft`` and
    ``logits`` return ``(out, num_draft)``: only the first ``num_draft [B]`` draft tokens are
    real, so acceptance never counts padding.

    Raises:
      ValueError: ``ngram_min < 1``, ``ngram_max < ngram_min``, ``block_size < 2``, or a
        ``confidence`` that is neither a probability nor ``ngram_max`` (first, later) pairs.
    """

    ngram_max: int = 4
    ngram_min: int = 1
    block_size: int = 16  # the default (and largest) block size of a Decoder using this step
    # How likely a proposed token is right, for Decoder(verify_lengths=...): one probability for
    # every token, or per matched suffix length n = 1 .. ngram_max a pair (the first token's, each
    # later token's given the ones before it). With it set, draft/logits also return the
    # per-offset probability of the first k tokens being right, step by step (0 past num_draft);
    # None: they return two values.
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

    def draft(
        self,
        params,
        target_params,
        cache,
        anchor: Array,
        start: Array,
        block_valid: Array,
        block_len: int,
        *,
        tokens: Array,
    ) -> tuple[Array, Array]:
        """``(draft int32 [B, block_len - 1], num_draft int32 [B])`` from the loop's ``tokens [B, L]``
        (and the per-offset confidence ``[B, block_len - 1]`` when ``confidence`` is set)."""
        draft, num, matched = ngram_match(tokens, start, block_len - 1, self.ngram_max, self.ngram_min)
        if self.confidence is None:
            return draft, num
        return draft, num, self.token_confidence(matched, num, block_len - 1)

    def token_confidence(self, matched: Array, num: Array, k: int) -> Array:
        """float32 ``[B, k]``: the probability that draft offset ``j + 1`` is right given offsets
        ``1 .. j`` were, from ``confidence`` and each row's matched length (0 past ``num``)."""
        c = self.confidence
        table = jnp.asarray(c if isinstance(c, tuple) else ((c, c),) * self.ngram_max, jnp.float32)  # [nmax, 2]
        pair = table[jnp.clip(matched - 1, 0, self.ngram_max - 1)]  # [B, 2]
        offsets = jnp.arange(k)
        conf = jnp.where(offsets == 0, pair[:, :1], pair[:, 1:])
        return jnp.where(offsets < num[:, None], conf, 0.0)

    def logits(
        self,
        params,
        target_params,
        cache,
        anchor: Array,
        start: Array,
        block_valid: Array,
        block_len: int,
        *,
        tokens: Array,
    ) -> tuple[Array, Array]:
        """``(logits float32 [B, block_len - 1, V], num_draft [B])``: 0 at the draft token, -inf elsewhere.

        Any ``Sampling`` turns these into the one-hot ``q`` of the draft (temperature, top-k and
        top-p all keep the single finite token). ``V`` is the target's vocabulary (its embedding rows).
        """
        draft, num, *conf = self.draft(
            params, target_params, cache, anchor, start, block_valid, block_len, tokens=tokens
        )
        return (_point_mass(draft, target_params), num, *conf)


def _point_mass(draft: Array, target_params) -> Array:
    """Logits ``[B, K, V]`` that every ``Sampling`` turns into the one-hot ``q`` of ``draft [B, K]``."""
    vocab = target_params["embedding"].shape[0]
    onehot = draft[..., None] == jnp.arange(vocab, dtype=jnp.int32)
    return jnp.where(onehot, 0.0, -jnp.inf).astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class HybridStep:
    """Prompt lookup where it has a real match, the DFlash drafter elsewhere: per row and round.

    A row whose last ``min_match`` (or more) committed tokens occurred earlier takes the n-gram
    continuation (confidence ``ngram.confidence`` per token); every other row takes the drafter's
    block as the drafter alone would draft it (DFlash: the argmax of its logits; DFlash 2: its
    selector's walk, ``DraftStep.draft``) with the drafter's confidence. When every row of the
    batch takes the n-gram draft, the drafter's forward is skipped (``lax.cond``); its context
    cache is written every round either way, so it is always current. Lossless like each part:
    the verify is the loop's own, and under sampling an n-gram row's ``q`` is the point mass of
    its draft (a DFlash row's: the drafter's ``probs`` of its logits, or for DFlash 2 the
    selector walk's ``q``, ``sample``). ``default_block``: the block size a ``Decoder`` takes by
    default (``None``: the drafter's); any up to the drafter's may still be passed.

    Raises:
      ValueError: ``min_match`` outside ``[1, ngram.ngram_max]``, a drafter step made without
        ``confidence=True``, or ``default_block`` outside ``[2, the drafter's block size]``.
    """

    dflash: object  # a DraftStep (made with confidence=True)
    ngram: NgramStep
    min_match: int = 2
    default_block: int | None = None

    def __post_init__(self):
        if not 1 <= self.min_match <= self.ngram.ngram_max:
            raise ValueError(f"min_match must be in [1, ngram_max = {self.ngram.ngram_max}], got {self.min_match}")
        if not getattr(self.dflash, "confidence", False):
            raise ValueError(
                "HybridStep needs its drafter's confidence: make it DraftStep(cfg, target_cfg, confidence=True)"
            )
        if self.default_block is not None and not 2 <= self.default_block <= self.dflash.max_block_size:
            raise ValueError(
                f"default_block must be in [2, the drafter's {self.dflash.max_block_size}], got {self.default_block}"
            )

    @property
    def cfg(self):
        """The drafter's ``DrafterConfig`` (the loop reads ``cfg.dflash2``: a selector samples its own draft)."""
        return self.dflash.cfg

    @property
    def tap_layers(self):
        return self.dflash.tap_layers

    @property
    def max_block_size(self) -> int:
        return self.dflash.max_block_size

    @property
    def default_block_size(self) -> int:
        """The block size a ``Decoder`` takes when none is passed."""
        return self.default_block or self.dflash.max_block_size

    def init_cache(self, batch: int, cache_len: int):
        return self.dflash.init_cache(batch, cache_len)

    def write_context(self, params, cache, feats, start):
        return self.dflash.write_context(params, cache, feats, start)

    def _lookup(self, tokens: Array, start: Array, block_valid: Array, k: int):
        """``(draft [B, k], use [B], num_draft [B], confidence [B, k], idle)``: the n-gram continuation,
        the rows that take it, their real-token counts (``k`` on drafter rows), its confidence, and
        whether no row needs the drafter (an n-gram match, or a finished / padding row)."""
        ng, ng_num, matched = ngram_match(tokens, start, k, self.ngram.ngram_max, self.ngram.ngram_min)
        use = (matched >= self.min_match) & (ng_num > 0)
        if self.ngram.confidence is not None:
            conf = self.ngram.token_confidence(matched, ng_num, k)
        else:
            conf = (jnp.arange(k) < ng_num[:, None]).astype(jnp.float32)
        idle = jnp.all(use | (block_valid <= 1))
        return ng, use, jnp.where(use, ng_num, k), conf, idle

    def _drafter(self, idle: Array, run):
        """``run()`` unless ``idle``, else zeros of its output's shapes (the drafter's forward skipped)."""
        zeros = lambda: jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), jax.eval_shape(run))  # noqa: E731
        return jax.lax.cond(idle, zeros, run)

    def draft(self, params, target_params, cache, anchor, start, block_valid, block_len, *, tokens):
        """``(draft [B, K], num_draft [B], confidence [B, K])``, row by row from the better source."""
        ng, use, num, conf_ng, idle = self._lookup(tokens, start, block_valid, block_len - 1)
        args = (params, target_params, cache, anchor, start, block_valid, block_len)
        draft, _, conf = self._drafter(idle, partial(self.dflash.draft, *args, tokens=tokens))
        return jnp.where(use[:, None], ng, draft), num, jnp.where(use[:, None], conf_ng, conf)

    def logits(self, params, target_params, cache, anchor, start, block_valid, block_len, *, tokens):
        """``(logits [B, K, V], num_draft [B], confidence [B, K])``: the n-gram point mass on its rows
        (DFlash rows' confidence: the largest probability of their logits)."""
        ng, use, num, conf_ng, idle = self._lookup(tokens, start, block_valid, block_len - 1)
        args = (params, target_params, cache, anchor, start, block_valid, block_len)
        logits = self._drafter(idle, partial(self.dflash.logits, *args, tokens=tokens))
        conf = jnp.where(use[:, None], conf_ng, jnp.max(jax.nn.softmax(logits, -1), -1))
        return jnp.where(use[:, None, None], _point_mass(ng, target_params), logits), num, conf

    def sample(self, params, target_params, cache, anchor, start, block_valid, block_len, *, key, temperature, tokens):
        """A DFlash 2 drafter under sampling (``DraftStep.sample``): ``(draft int32 [B, K], q float32
        [B, K, V], num_draft [B], confidence [B, K])``, the n-gram rows' q the point mass of their
        draft, the drafter rows' the selector walk's q; the confidence is the n-gram table's on
        n-gram rows and ``DraftStep.sample``'s (the head's, independent of the draws) elsewhere."""
        ng, use, num, conf_ng, idle = self._lookup(tokens, start, block_valid, block_len - 1)
        args = (params, target_params, cache, anchor, start, block_valid, block_len)
        run = partial(self.dflash.sample, *args, key=key, temperature=temperature, tokens=tokens)
        draft, q, _, conf = self._drafter(idle, run)
        q = jnp.where(use[:, None, None], jnp.exp(_point_mass(ng, target_params)), q)
        return jnp.where(use[:, None], ng, draft), q, num, jnp.where(use[:, None], conf_ng, conf)
