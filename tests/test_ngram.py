"""N-gram (prompt-lookup) drafting (SPEC "N-gram (prompt-lookup) drafting").

The step's proposals against a plain-Python statement of the rule; greedy decoding with it is
token-identical to plain decoding, with the acceptance lengths the rule predicts; the loop never
accepts draft tokens past the step's ``num_draft``; sampled decoding keeps the target's output
distribution (exact enumeration + chi-square, as in test_sampling.py).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from dflash_jax import decode, hf_format
from dflash_jax.decode import Decoder
from dflash_jax.ngram import NgramStep
from dflash_jax.sampling import GREEDY, Sampling, probs
from dflash_jax.speculation import make_plan
from dflash_jax.steps import Draft, point_mass
from dflash_jax.target import Target, TargetConfig, init_params


def ref_propose(seq, k, nmax, nmin):
    """The rule in plain Python for committed tokens ``seq`` (the anchor is ``seq[-1]``).

    Returns ``(draft, n, end)``: the proposed tokens, the matched n-gram length and the position
    where the matched earlier occurrence ends (``([], 0, -1)`` when nothing matches).
    """
    start = len(seq) - 1
    for n in range(nmax, nmin - 1, -1):
        if n > len(seq):
            continue
        suffix = seq[start - n + 1 :]
        for end in range(start - 1, n - 2, -1):  # most recent first; the suffix itself excluded
            if seq[end - n + 1 : end + 1] == suffix:
                return seq[end + 1 : end + 1 + k], n, end  # cut where the committed sequence ends
    return [], 0, -1


# --- 1. proposals ------------------------------------------------------------------------------

COMBOS = [(4, 1, 16), (3, 2, 5), (1, 1, 2), (5, 5, 8), (2, 1, 4)]  # (ngram_max, ngram_min, block)


def greedy_args(tokens):
    """The keyword arguments of a greedy ``propose`` over the token buffer ``tokens``."""
    return dict(tokens=tokens, key=None, sampling=GREEDY)


def test_proposals_follow_the_rule():
    rng = np.random.default_rng(0)
    seen = {"none": 0, "short": 0, "full": 0, "at_beginning": 0, "backoff": 0}
    batch, span = 6, 40
    for nmax, nmin, bs in COMBOS:
        step = NgramStep(nmax, nmin, bs)
        k = bs - 1
        draft_fn = jax.jit(
            lambda tok, st: step.propose(
                None, None, None, tok[jnp.arange(batch), st], st, jnp.full_like(st, bs), bs, **greedy_args(tok)
            )[:2]
        )
        for trial in range(30):
            vocab = int(rng.choice([2, 3, 5, 12]))
            tokens = rng.integers(0, vocab, (batch, span + bs)).astype(np.int32)  # slots past start: stale junk
            starts = rng.integers(0, span, batch).astype(np.int32)
            starts[0] = trial % 4  # the very beginning of the sequence
            if trial % 3 == 0:  # the last n-gram also occurs at the very start of the sequence
                n = int(rng.integers(nmin, nmax + 1))
                starts[1] = int(rng.integers(n, span))
                tokens[1, starts[1] - n + 1 : starts[1] + 1] = tokens[1, :n]
            draft, num = jax.device_get(draft_fn(tokens, starts))
            assert draft.shape == (batch, k) and draft.dtype == np.int32 and num.dtype == np.int32
            for b in range(batch):
                s = int(starts[b])
                want, n, end = ref_propose(tokens[b, : s + 1].tolist(), k, nmax, nmin)
                assert num[b] == len(want), (nmax, nmin, bs, tokens[b, : s + 1].tolist())
                assert draft[b, : num[b]].tolist() == want, (nmax, nmin, bs, tokens[b, : s + 1].tolist())
                assert not draft[b, num[b] :].any()  # padding is 0
                seen["none"] += not want
                seen["short"] += 0 < len(want) < k
                seen["full"] += len(want) == k
                seen["at_beginning"] += bool(want) and end == n - 1
                seen["backoff"] += bool(want) and n < nmax
    assert min(seen.values()) >= 5, seen  # every kind of case was exercised


def ref_occurrences(seq, nmax, nmin, count):
    """The ``count`` best earlier occurrences in plain Python: every end position ``e < s`` whose
    common suffix with ``seq`` has length ``m >= nmin`` (capped at ``nmax``), ordered by ``m`` then
    ``e``, both descending; each ``(m, e)``."""
    s = len(seq) - 1
    found = []
    for e in range(s):
        m = 0
        while m < nmax and e - m >= 0 and seq[e - m] == seq[s - m]:
            m += 1
        if m >= nmin:
            found.append((m, e))
    return sorted(found, reverse=True)[:count]


def ref_matches(seq, k, nmax, nmin, count):
    """``ref_occurrences``, each as ``(continuation, m)`` (cut where the committed sequence ends)."""
    return [(seq[e + 1 : e + 1 + k], m) for m, e in ref_occurrences(seq, nmax, nmin, count)]


def test_the_best_matches_follow_the_rule_and_the_first_is_prompt_lookups():
    """``ngram_matches``: the ``count`` longest, then latest, earlier occurrences and what followed each
    (``ref_matches``); the first is ``ngram_match``'s; rows with fewer have ``num`` 0 after them."""
    from dflash_jax.ngram import ngram_match, ngram_matches

    rng = np.random.default_rng(3)
    batch, span, k, count = 8, 30, 5, 4
    fewer = 0
    for nmax, nmin in ((4, 1), (3, 2), (2, 2)):
        fn = jax.jit(lambda t, s: ngram_matches(t, s, k, nmax, nmin, count))  # noqa: B023
        for _ in range(10):
            tokens = rng.integers(0, int(rng.choice([2, 3, 6])), (batch, span + k)).astype(np.int32)
            starts = rng.integers(0, span, batch).astype(np.int32)
            cont, num, matched = jax.device_get(fn(tokens, starts))
            first = jax.device_get(ngram_match(tokens, starts, k, nmax, nmin))
            np.testing.assert_array_equal(cont[:, 0], first[0])
            np.testing.assert_array_equal(num[:, 0], first[1])
            np.testing.assert_array_equal(matched[:, 0], first[2])
            for b in range(batch):
                want = ref_matches(tokens[b, : starts[b] + 1].tolist(), k, nmax, nmin, count)
                fewer += len(want) < count
                for j in range(count):
                    if j < len(want):
                        assert cont[b, j, : num[b, j]].tolist() == want[j][0] and matched[b, j] == want[j][1]
                    else:
                        assert num[b, j] == 0 and matched[b, j] == 0
    assert fewer > 0  # both kinds of row
    # more occurrences asked for than the buffer has positions: "1 2" occurred once before, then "1"
    cont, num, _ = ngram_matches(jnp.asarray([[1, 2, 1, 2]]), jnp.asarray([3]), 1, 2, 1, count=6)
    assert cont.shape == (1, 6, 1) and num.tolist() == [[1, 0, 0, 0, 0, 0]] and int(cont[0, 0, 0]) == 1


def test_periodic_continuations_repeat_the_match_past_the_anchor():
    """``ngram_matches(periodic=True)``: the same occurrences as SPEC's rule (``ref_occurrences``), each
    continued for all ``k`` offsets with the match's period ``d = start - end`` (offset ``j + 1`` reads
    ``end + 1 + j mod d``, a committed token); off, it is SPEC's rule."""
    from dflash_jax.ngram import ngram_matches

    rng = np.random.default_rng(7)
    batch, span, k, count = 8, 30, 9, 3
    looped = 0
    fn = jax.jit(lambda t, s: ngram_matches(t, s, k, 4, 1, count, periodic=True))
    for _ in range(10):
        tokens = rng.integers(0, int(rng.choice([2, 3, 6])), (batch, span + k)).astype(np.int32)
        starts = rng.integers(0, span, batch).astype(np.int32)
        tokens[np.arange(span + k) > starts[:, None]] = 99  # not committed yet: a read past the anchor shows
        cont, num, matched = jax.device_get(fn(tokens, starts))
        for b in range(batch):
            s = int(starts[b])
            seq = tokens[b, : s + 1].tolist()
            found = ref_occurrences(seq, 4, 1, count)
            for j in range(count):
                if j >= len(found):
                    assert num[b, j] == 0 and matched[b, j] == 0
                    continue
                m, e = found[j]
                assert num[b, j] == k and matched[b, j] == m
                assert cont[b, j].tolist() == [seq[e + 1 + i % (s - e)] for i in range(k)]
                looped += s - e < k
    assert looped > 0  # continuations that went past the anchor were checked
    # "1 2 3" repeats with period 3: the loop goes on; SPEC's rule stops at the anchor
    seq = jnp.asarray([[1, 2, 3, 1, 2, 3] + [7] * 6])  # 7: stale slots past the anchor, never read
    cont, num, _ = ngram_matches(seq, jnp.asarray([5]), 5, 3, 1, periodic=True)
    assert cont[0, 0].tolist() == [1, 2, 3, 1, 2] and int(num[0, 0]) == 5
    cont, num, _ = ngram_matches(seq, jnp.asarray([5]), 5, 3, 1)
    assert cont[0, 0, :3].tolist() == [1, 2, 3] and int(num[0, 0]) == 3


def test_hand_made_cases():
    step = NgramStep(ngram_max=3, ngram_min=1, block_size=4)
    draft = jax.jit(lambda tok, s: step.propose(None, None, None, tok[:, s[0]], s, s, 4, **greedy_args(tok))[:2])

    def run(seq):
        tok = np.asarray([seq + [7] * (20 - len(seq))], np.int32)  # 7: stale slots, never proposed
        d, n = draft(tok, np.asarray([len(seq) - 1], np.int32))
        return d[0, : int(n[0])].tolist()

    assert run([1, 2, 3, 1, 2]) == [3, 1, 2]  # no trigram; the bigram [1, 2] at the very start
    assert run([5, 1, 2, 3, 9, 1, 2, 3]) == [9, 1, 2]  # trigram, then what followed it
    assert run([1, 2, 3, 4, 2, 3, 9, 2, 3]) == [9, 2, 3]  # the most recent occurrence wins
    assert run([1, 2, 3, 9, 9, 5, 3, 8, 1, 2, 3]) == [9, 9, 5]  # the longest n beats a more recent shorter one
    assert run([4, 5, 6]) == []  # nothing repeats
    assert run([4]) == []  # the anchor alone
    assert run([4, 4]) == [4]  # only the anchor follows the occurrence
    assert run([1, 2, 1]) == [2, 1]  # cut where the committed sequence ends


def test_invalid_ranges_are_refused():
    for kw in (dict(ngram_min=0), dict(ngram_max=2, ngram_min=3), dict(block_size=1)):
        with pytest.raises(ValueError):
            NgramStep(**kw)


# --- 2. greedy: lossless, with the predicted acceptance lengths ---------------------------------


class _Tiny(NamedTuple):
    params: dict
    cfg: TargetConfig


VG = 24  # the greedy tests' vocabulary: small, so that the target's own output repeats itself


@pytest.fixture(scope="session")
def target():
    """A tiny qwen3 (``helpers.TINY`` with a vocabulary of 24) with weights drawn as ``helpers.make_hf_model``
    draws them (std 0.2, norm scales 1 + 0.1 N(0, 1)) so that argmax ties are improbable: (target, plain decoder)."""
    from helpers import TINY

    cfg = hf_format.read_config(dict(TINY, model_type="qwen3", vocab_size=VG))
    paths, tree = jax.tree_util.tree_flatten_with_path(init_params(cfg))
    keys = jax.random.split(jax.random.key(0), len(paths))
    leaves = [
        1.0 + 0.1 * jax.random.normal(k, v.shape)
        if "norm" in jax.tree_util.keystr(path)
        else 0.2 * jax.random.normal(k, v.shape)
        for k, (path, v) in zip(keys, paths)
    ]
    params = jax.tree.unflatten(tree, leaves)
    return _Tiny(params, cfg), Decoder(params, cfg)


def expected_rounds(seq, prompt_len, bs, max_new, nmax, nmin, stop_ids=(), pad=None, periodic=False):
    """Tokens committed per round by the rule when ``seq`` (prompt + the target's greedy tokens,
    at least ``prompt_len + max_new`` long) is what the target produces; with ``pad``, the draft
    is filled up to the block with that token (a drafter that copies an n-gram block input);
    ``periodic``: a continuation that reaches the anchor goes on with the match's period."""
    limit = prompt_len + max_new
    start, rounds = prompt_len, []
    if seq[start] in stop_ids:
        return rounds
    while start + 1 < limit:
        v = min(bs, limit - start)
        draft, _, end = ref_propose(seq[: start + 1], bs - 1, nmax, nmin)
        if periodic and draft:
            draft = [seq[end + 1 + i % (start - end)] for i in range(bs - 1)]
        if pad is not None:
            draft = draft + [pad] * (bs - 1 - len(draft))
        a = 0
        while a < min(len(draft), v - 1) and draft[a] == seq[start + 1 + a]:
            a += 1
        produced = min(a + 1, limit - start - 1)
        hits = [i for i, t in enumerate(seq[start + 1 : start + 1 + produced]) if t in stop_ids]
        if hits:
            produced = hits[0] + 1
        rounds.append(produced)
        start += produced
        if hits:
            break
    return rounds


def _prompts(seed):
    rs = np.random.RandomState(seed)
    return [
        np.tile(rs.randint(4, VG, 5), 3).tolist(),  # repetitive: drafts from the prompt
        rs.randint(4, VG, 13).tolist(),
        [int(rs.randint(4, VG))],  # a single token
        (rs.randint(4, VG, 3).tolist() * 4)[:10] + rs.randint(4, VG, 4).tolist(),
    ]


@pytest.mark.parametrize("nmax,nmin,bs", [(4, 1, 8), (3, 2, 4)])
def test_greedy_is_lossless_with_predicted_rounds(target, nmax, nmin, bs):
    ck, plain = target
    prompts, n_new = _prompts(bs), 40
    free = [p + r.token_ids for p, r in zip(prompts, plain.generate(prompts, n_new + bs))]  # past the limit
    dec = Decoder(ck.params, ck.cfg, make_plan(NgramStep(nmax, nmin, 8), block_size=bs))
    first = free[0][len(prompts[0]) :]
    at = next(i for i in range(10, n_new) if first.index(first[i]) == i)  # first emitted mid-sequence
    stop = first[at]
    longest, partial, cut = 0, 0, 0
    for stops in ((), (stop,)):
        got = dec.generate(prompts, n_new, stop_token_ids=stops)
        for p, f, g in zip(prompts, free, got):
            want = f[len(p) : len(p) + n_new]
            if stop in stops and stop in want:
                want = want[: want.index(stop) + 1]
            assert g.token_ids == want  # plain decoding's tokens (test_decode: with stops too)
            assert g.acceptance_lengths == expected_rounds(f, len(p), bs, n_new, nmax, nmin, stops)
            longest = max([longest, *g.acceptance_lengths])
            partial += sum(1 < a < bs for a in g.acceptance_lengths)
            if not stops:  # did the length limit cut the last round short?
                beyond = expected_rounds(f, len(p), bs, n_new + bs, nmax, nmin)
                cut += g.acceptance_lengths[-1] < beyond[len(g.acceptance_lengths) - 1]
        if stops:
            assert got[0].token_ids[-1] == stop and len(got[0].token_ids) == at + 1  # stopped mid-sequence
    assert longest >= min(bs, 5) and partial > 0, (longest, partial)  # drafts accepted, up to mid-block rejections
    assert cut > 0  # the length limit landed inside a block that would have committed more


def test_the_convenience_forms(target):
    ck, plain = target
    prompts = _prompts(3)
    want = [r.token_ids for r in plain.generate(prompts, 48)]  # the shape test_greedy_... compiled
    dec = Decoder(ck.params, ck.cfg, make_plan(NgramStep(block_size=6)))  # a bare step: no parameters
    assert dec.block_size == 6 and [r.token_ids for r in dec.generate(prompts, 48)] == want
    with pytest.raises(ValueError, match="block size 9"):
        Decoder(ck.params, ck.cfg, make_plan(NgramStep(block_size=8), block_size=9))


class CappedOracle:
    """The target's own greedy continuation (``helpers.OracleDraft`` without errors), of which only
    ``start % 3`` tokens are reported real: the loop must accept exactly those."""

    tap_layers = ()

    def __init__(self, vocab_size, max_block_size):
        from helpers import OracleDraft

        self.oracle, self.max_block_size = OracleDraft(vocab_size, max_block_size), max_block_size
        self.default_block_size = max_block_size
        self.init_cache, self.write_context = self.oracle.init_cache, self.oracle.write_context

    def propose(self, params, target_params, cache, anchor, start, block_valid, block_len, *, tokens, key, sampling):
        d = self.oracle.draft(params, target_params, cache, anchor, start, block_valid, block_len)
        q = None if sampling.greedy else point_mass(d, self.oracle.vocab_size)
        return Draft(d, (start % 3).astype(jnp.int32), jnp.ones(d.shape, jnp.float32), q)


def test_loop_accepts_only_the_reported_draft_tokens(target):
    from helpers import oracle_params

    ck, plain = target
    prompts, bs, n_new = _prompts(5), 8, 48
    greedy = [r.token_ids for r in plain.generate(prompts, n_new)]
    params = oracle_params(prompts, greedy, [set()] * len(prompts))
    dec = Decoder(ck.params, ck.cfg, make_plan(CappedOracle(ck.cfg.vocab_size, bs), params))
    for p, g, r in zip(prompts, greedy, dec.generate(prompts, n_new)):
        assert r.token_ids == g
        start, limit, want = len(p), len(p) + n_new, []
        while start + 1 < limit:
            want.append(min(start % 3 + 1, limit - start - 1))
            start += want[-1]
        assert r.acceptance_lengths == want
    # under sampling too: at most start % 3 draft tokens per round, and the cap is reached
    s = Decoder(ck.params, ck.cfg, make_plan(CappedOracle(ck.cfg.vocab_size, bs), params), sampling=Sampling(0.3))
    reached = 0
    for p, r in zip(prompts, s.generate(prompts, n_new, seed=[1, 2, 3, 4])):
        start = len(p)
        for a in r.acceptance_lengths:
            assert a <= start % 3 + 1
            reached += a == start % 3 + 1 > 1
            start += a
    assert reached > 0


# --- 3. sampling keeps the target's distribution -------------------------------------------------

V = 8
PROMPT = [1, 5, 2, 7, 3, 1, 5, 2, 6]  # repeats: the first sampled token often has an earlier occurrence
N, CHUNK = 4096, 2048  # ~3 s of decoding per run on 2 cores after a ~15 s compile
P_REJECT = 1e-3


@pytest.fixture(scope="session")
def tiny():
    hf = dict(
        model_type="qwen3",
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    )
    cfg = hf_format.read_config(hf)
    params = jax.tree.map(lambda x: x * 3.0 if x.ndim == 2 else x, init_params(cfg, seed=1))  # peakier logits
    return cfg, params


def exact_joint(cfg, params, s: Sampling) -> np.ndarray:
    """``[V, V, V]`` probability of the first three new tokens, by enumeration of all prefixes."""
    pairs = np.array([(a, b) for a in range(V) for b in range(V)], np.int32)
    seqs = np.concatenate([np.tile(PROMPT, (len(pairs), 1)), pairs], axis=1)
    pos = np.broadcast_to(np.arange(seqs.shape[1]), seqs.shape)
    model = Target(cfg)
    hidden, _, _ = model.apply({"params": params}, jnp.asarray(seqs), jnp.asarray(pos))
    p = np.asarray(probs(model.apply({"params": params}, hidden, method="logits"), s), np.float64)
    n = len(PROMPT)
    return p[0, n - 1][:, None, None] * p[::V, n].reshape(V, V)[:, :, None] * p[:, n + 1].reshape(V, V, V)


def sampled_joint(dec: Decoder, n: int = N) -> tuple[np.ndarray, int]:
    """Counts of the first three new tokens over ``n`` seeds, and how many rounds committed 2 tokens."""
    counts, multi = np.zeros((V, V, V)), 0
    for c in range(0, n, CHUNK):
        for r in dec.generate([PROMPT] * CHUNK, 3, (), seed=list(range(c, c + CHUNK))):
            counts[tuple(r.token_ids)] += 1
            multi += r.acceptance_lengths == [2]
    return counts, multi


def chi_square_p(counts: np.ndarray, expected_p: np.ndarray) -> float:
    """p-value of a chi-square goodness-of-fit test, cells with expected count < 5 pooled."""
    counts, exp = counts.ravel(), expected_p.ravel() * counts.sum()
    big = exp >= 5
    obs, ex = np.append(counts[big], counts[~big].sum()), np.append(exp[big], exp[~big].sum())
    if ex[-1] == 0:
        obs, ex = obs[:-1], ex[:-1]
    return float(stats.chisquare(obs, ex * obs.sum() / ex.sum()).pvalue)


@pytest.mark.parametrize(
    "s",
    [
        Sampling(0.8),
        Sampling(1.0, top_p=0.9, top_k=5),
        Sampling(0.01),
        Sampling(2.0, top_p=0.3),
        Sampling(1.0, top_k=1),
    ],
)
def test_the_sampled_draft_is_the_greedy_one_with_a_point_mass_q(s):
    """Under any sampling the draft is the deterministic continuation and ``q`` is exactly one-hot
    at every draft offset, padding included (the rejection rule then accepts x with probability
    p(x) and resamples from norm(p with x removed))."""
    step = NgramStep(ngram_max=2, ngram_min=1, block_size=6)
    tokens = jnp.asarray([[1, 2, 3, 1, 2, 0, 0, 0, 0, 0, 0, 0], [4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5]], jnp.int32)
    start = jnp.asarray([4, 1], jnp.int32)
    params = {"embedding": jnp.zeros((V, 4))}  # only its shape is read: the vocabulary
    args = (None, params, None, tokens[:, 0], start, start, 6)
    keys = jax.vmap(jax.random.key)(jnp.arange(2))
    sampled = step.propose(*args, tokens=tokens, key=keys, sampling=s)
    greedy = step.propose(*args, **greedy_args(tokens))
    assert sampled.q.dtype == jnp.float32 and sampled.q.shape == (2, 5, V) and greedy.q is None
    assert sampled.num.tolist() == greedy.num.tolist() == [3, 1]
    np.testing.assert_array_equal(sampled.tokens, greedy.tokens)
    np.testing.assert_array_equal(sampled.q, np.eye(V)[np.asarray(greedy.tokens)])


@pytest.mark.parametrize("s", [Sampling(0.8), Sampling(1.0, top_p=0.9, top_k=5)], ids=["t0.8", "t1-p0.9-k5"])
def test_sampling_keeps_the_target_distribution(tiny, s):
    cfg, params = tiny
    dec = Decoder(params, cfg, make_plan(NgramStep(block_size=4)), sampling=s)
    counts, multi = sampled_joint(dec)
    assert multi > N // 20  # drafts were accepted in many rounds
    assert chi_square_p(counts, exact_joint(cfg, params, s)) > P_REJECT
    # the check has teeth at this N: the same counts against another temperature's distribution fail
    assert chi_square_p(counts, exact_joint(cfg, params, Sampling(s.temperature * 1.5, s.top_p, s.top_k))) < P_REJECT


def test_the_test_rejects_a_residual_that_keeps_the_draft_token(tiny, monkeypatch):
    """Fault: at the first rejection, resample from the target's p (the rejected token included)
    instead of norm(p with x removed): the output is no longer the target's distribution."""
    cfg, params = tiny
    s = Sampling(0.8)
    monkeypatch.setattr(decode, "accept", _accept_without_residual)
    counts, _ = sampled_joint(Decoder(params, cfg, make_plan(NgramStep(block_size=4)), sampling=s), CHUNK)
    assert chi_square_p(counts, exact_joint(cfg, params, s)) < P_REJECT  # p ~ 1e-17 at this n


def _accept_without_residual(key, draft, q, p, num_valid):
    """``sampling.accept`` whose rejection resamples from ``p`` instead of ``norm(max(p - q, 0))``."""
    k = draft.shape[1]

    def row(key, draft, q, p, n):
        k_u, k_b = jax.random.split(key)
        u = jax.random.uniform(k_u, (k,), jnp.float32)
        px = jnp.take_along_axis(p[:k], draft[:, None], axis=-1)[:, 0]
        qx = jnp.take_along_axis(q, draft[:, None], axis=-1)[:, 0]
        a = jnp.sum(jnp.cumprod(((u * qx < px) & (jnp.arange(k) < n)).astype(jnp.int32)))
        return a, jax.random.categorical(k_b, jnp.log(p[a])).astype(jnp.int32)

    return jax.vmap(row)(key, draft, q, p, num_valid)


# --- 5. a DFlash drafter whose blocks carry the n-gram continuation ------------------------------


def test_ngram_block_input_is_the_rule():
    """``drafter.block_tokens`` with ``block_input="ngram"``: the anchor, the rule's proposals, then
    mask tokens (with ``ngram_periodic``, the same match continued with its period); with "mask":
    the anchor and mask tokens only."""
    import dataclasses

    from dflash_jax.drafter import DrafterConfig, block_tokens
    from dflash_jax.errors import ConfigError

    rng = np.random.default_rng(3)
    batch, span, bs, mask = 5, 30, 6, 1
    cfg = hf_format.read_config(
        dict(
            model_type="qwen3",
            vocab_size=8,
            hidden_size=8,
            intermediate_size=8,
            num_hidden_layers=4,
            num_attention_heads=2,
            head_dim=4,
        )
    )
    counts = set()
    for nmax, nmin in ((4, 1), (3, 2)):
        dcfg = DrafterConfig.for_target(cfg, 1, bs, mask, block_input="ngram", ngram_max=nmax, ngram_min=nmin)
        plain = DrafterConfig.for_target(cfg, 1, bs, mask)
        for _ in range(10):
            tokens = rng.integers(2, 8, (batch, span + bs)).astype(np.int32)
            starts = rng.integers(0, span, batch).astype(np.int32)
            tokens[np.arange(span + bs) > starts[:, None]] = 99  # a training sequence's future: never read
            anchor = tokens[np.arange(batch), starts]
            got = np.asarray(jax.jit(block_tokens, static_argnums=(0, 3))(dcfg, anchor, starts, bs, tokens))
            np.testing.assert_array_equal(
                np.asarray(block_tokens(plain, anchor, starts, bs, None)),
                np.concatenate([anchor[:, None], np.full((batch, bs - 1), mask)], 1),
            )
            periodic = dataclasses.replace(dcfg, ngram_periodic=True)
            looped = np.asarray(block_tokens(periodic, anchor, starts, bs, tokens))
            for b in range(batch):
                seq = tokens[b, : starts[b] + 1].tolist()
                want, _, end = ref_propose(seq, bs - 1, nmax, nmin)
                counts.add(len(want))
                assert got[b].tolist() == [anchor[b], *want] + [mask] * (bs - 1 - len(want))
                # periodic: the same occurrence, continued with its period past the anchor
                go_on = [seq[end + 1 + i % (len(seq) - 1 - end)] for i in range(bs - 1)] if want else []
                assert looped[b].tolist() == [anchor[b], *go_on] + [mask] * (bs - 1 - len(go_on))
    assert {0, bs - 1} <= counts and len(counts) > 2, counts  # none, full and cut continuations seen
    with pytest.raises(ConfigError, match="ngram_periodic continues the n-gram block input"):
        DrafterConfig.for_target(cfg, 1, bs, mask, ngram_periodic=True)


def test_the_copy_bias_rewards_the_proposed_tokens():
    """``drafter.copy_prior`` adds ``copy_bias[matched - 1, k - 1]`` to the logit of the token
    offset ``k`` holds, for offsets ``k <= num`` only, and leaves a drafter without one alone."""
    from dflash_jax.drafter import DrafterConfig, copy_prior

    cfg = hf_format.read_config(dict(__import__("helpers").TINY, model_type="qwen3", vocab_size=VG))
    dcfg = DrafterConfig.for_target(cfg, 1, 6, 3, block_input="ngram", ngram_max=3, copy_bias=1.0)
    table = np.arange(15, dtype=np.float32).reshape(3, 5) + 1  # [matched length, offset]
    rs = np.random.RandomState(0)
    logits = rs.randn(4, 5, VG).astype(np.float32)
    block = rs.randint(0, VG, (4, 6)).astype(np.int32)
    num, matched = np.array([0, 2, 5, 3]), np.array([0, 1, 3, 2])
    got = np.asarray(copy_prior(jnp.asarray(logits), {"copy_bias": table}, dcfg, block, num, matched))
    want = logits.copy()
    for b in range(4):
        for k in range(num[b]):
            want[b, k, block[b, k + 1]] += table[matched[b] - 1, k]
    np.testing.assert_array_equal(got, want)
    assert (got != logits).sum() == num.sum()
    plain = DrafterConfig.for_target(cfg, 1, 6, 3, block_input="ngram")
    np.testing.assert_array_equal(np.asarray(copy_prior(jnp.asarray(logits), {}, plain, block, num, matched)), logits)


def _copy_drafter(tgt, dcfg):
    """A target whose output head is its embedding transposed and a DFlash drafter whose blocks
    add nothing (zero attention and MLP outputs, unit norms): the drafter predicts, at every
    offset, the token its block input holds there (a random embedding's own row scores highest:
    |e|^2 ~ 2.6 against cross terms of std ~0.3 at dimension 64)."""
    from dflash_jax.drafter import init_drafter_params

    params = dict(tgt.params, lm_head=tgt.params["embedding"].T)

    def copy(path, x):
        names = jax.tree_util.keystr(path)
        if "o_proj" in names or "down_proj" in names:
            return jnp.zeros_like(x)
        return jnp.ones_like(x) if "norm" in names else x

    return params, jax.tree_util.tree_map_with_path(copy, init_drafter_params(dcfg, seed=2))


@pytest.mark.parametrize("verify_lengths, periodic", [(None, False), (None, True), ((1, 3, 8), False)])
def test_an_ngram_input_drafter_is_lossless(target, verify_lengths, periodic):
    """A DFlash drafter fed the n-gram continuation as its block input and built to copy it: greedy
    output equals plain decoding, batch 4; with the whole block verified its rounds are exactly
    prompt lookup's (``expected_rounds``, mask tokens where the continuation ends; with
    ``ngram_periodic``, the continuation going on with the match's period), with a verify
    length chosen per round (fixed costs, calibrated confidence) some of its drafts are accepted."""
    from dflash_jax.drafter import DrafterConfig, DraftStep

    tgt, _ = target
    bs, n_new, mask = 8, 30, 3
    dcfg = DrafterConfig.for_target(
        tgt.cfg, num_layers=1, block_size=bs, mask_token_id=mask, block_input="ngram", ngram_periodic=periodic
    )
    params, dparams = _copy_drafter(tgt, dcfg)
    plain = Decoder(params, tgt.cfg)
    kw = dict(verify_lengths=verify_lengths, verify_costs=(1.0, 1.2, 2.0)) if verify_lengths else {}
    dec = Decoder(params, tgt.cfg, make_plan(DraftStep(dcfg, tgt.cfg), dparams, **kw))
    prompts = _prompts(5)
    want = plain.generate(prompts, n_new)
    got = dec.generate(prompts, n_new)
    for w, g in zip(want, got):
        assert g.token_ids == w.token_ids
        # each round's verify width is recorded: one of the lengths compiled, never fewer than it committed
        assert len(g.verify_widths) == len(g.acceptance_lengths) and set(g.verify_widths) <= set(verify_lengths or [bs])
        assert all(a <= v for a, v in zip(g.acceptance_lengths, g.verify_widths))
        assert w.verify_widths == [1] * len(w.acceptance_lengths)  # plain decoding: one position a step
    if verify_lengths is None:
        free = [p + r.token_ids for p, r in zip(prompts, plain.generate(prompts, n_new + bs))]
        rule = [
            expected_rounds(seq, len(p), bs, n_new, 4, 1, pad=mask, periodic=periodic) for p, seq in zip(prompts, free)
        ]
        assert [g.acceptance_lengths for g in got] == rule
        if periodic:  # the loops' continuations went past the anchor: SPEC's rule predicts other rounds
            assert rule != [expected_rounds(seq, len(p), bs, n_new, 4, 1, pad=mask) for p, seq in zip(prompts, free)]
    assert sum(a > 1 for g in got for a in g.acceptance_lengths) >= 10  # drafts were accepted


def test_longer_reach_grows_the_copy_bias_table():
    """experiments/longer_reach.py: the table keeps its rows and gains one per longer match length, at
    the value given or as copies of its last row; the config reads longer matches (and, asked,
    periodic continuations and a draft-tree temperature); a shorter reach or a drafter without a table is refused."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    from longer_reach import new_rows_value, with_longer_reach

    from dflash_jax.drafter import DrafterConfig, init_drafter_params
    from dflash_jax.errors import ConfigError

    cfg = hf_format.read_config(dict(__import__("helpers").TINY, model_type="qwen3", vocab_size=VG))
    dcfg = DrafterConfig.for_target(cfg, 1, 6, 3, block_input="ngram", ngram_max=3, ngram_min=2, copy_bias=5.0)
    table = np.arange(15, dtype=np.float32).reshape(3, 5)
    params = dict(init_drafter_params(dcfg, seed=0), copy_bias=table)
    got, cfg30 = with_longer_reach(params, dcfg, 5, 30.0, periodic=True)
    np.testing.assert_array_equal(got["copy_bias"], np.concatenate([table, np.full((2, 5), 30.0, np.float32)]))
    assert (cfg30.ngram_max, cfg30.ngram_min, cfg30.ngram_periodic) == (5, 2, True)
    assert cfg30.tree_temperature == 1.0
    got, cfg_rep = with_longer_reach(params, dcfg, 5, None, periodic=False, tree_temperature=1.5)
    np.testing.assert_array_equal(got["copy_bias"], np.concatenate([table, table[-1:], table[-1:]]))
    assert not cfg_rep.ngram_periodic and cfg_rep.tree_temperature == 1.5
    assert all(got[k] is params[k] for k in params if k != "copy_bias")  # the weights as they were
    with pytest.raises(ConfigError, match="ngram_max 2 drops some"):
        with_longer_reach(params, dcfg, 2, 30.0, periodic=False)
    plain = DrafterConfig.for_target(cfg, 1, 6, 3)
    with pytest.raises(ConfigError, match="no copy-bias table"):
        with_longer_reach(init_drafter_params(plain, seed=0), plain, 5, 30.0, periodic=False)
    assert (new_rows_value("repeat"), new_rows_value("12.5")) == (None, 12.5)
    with pytest.raises(__import__("argparse").ArgumentTypeError, match="a number .* or 'repeat'"):
        new_rows_value("lots")


def test_a_mask_drafter_read_as_a_copy_drafter_drafts_prompt_lookup_then_itself(target):
    """experiments/copy_drafter.py: a mask-token drafter read with the n-gram block input (n >= 2) and a
    copy bias larger than its logits drafts, at every anchor with a match, prompt lookup's
    continuation (then its own tokens), and elsewhere exactly the mask-token drafter's block."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    from anchor_acceptance import _compiled
    from copy_drafter import as_copy_drafter

    from dflash_jax.drafter import DrafterConfig, init_drafter_params
    from dflash_jax.errors import ConfigError

    tgt, _ = target
    bs, n = 8, 96
    dcfg = DrafterConfig.for_target(tgt.cfg, num_layers=1, block_size=bs, mask_token_id=3)
    dparams = init_drafter_params(dcfg, seed=4)
    cparams, ccfg = as_copy_drafter(dparams, dcfg, copy_bias=1e3, ngram_min=2)
    assert (ccfg.block_input, ccfg.ngram_min, cparams["copy_bias"].shape) == ("ngram", 2, (4, bs - 1))
    with pytest.raises(ConfigError, match="mask-token"):
        as_copy_drafter(cparams, ccfg, copy_bias=1.0)
    tokens = np.random.default_rng(5).integers(4, 10, n).astype(np.int32)  # 6 token kinds: suffixes recur
    toks = jnp.asarray(np.pad(tokens, (0, bs))[None])
    anchors = np.arange(4, n - bs, dtype=np.int32)
    guesses = {}
    for name, (p, c) in {"mask": (dparams, dcfg), "copy": (cparams, ccfg)}.items():
        context, guess = _compiled(tgt.cfg, c)
        ctx = context(tgt.params, p, toks)
        valid = jnp.ones((1, len(anchors)), bool)
        guesses[name] = np.asarray(guess(p, tgt.params, ctx, toks, jnp.asarray(anchors[None]), valid))
    kinds = set()
    for j, a in enumerate(anchors):
        want, _, _ = ref_propose(tokens[: a + 1].tolist(), bs - 1, 4, 2)
        if want:
            assert guesses["copy"][j, : len(want)].tolist() == want
            kinds.add("cut" if len(want) < bs - 1 else "full")
        else:
            np.testing.assert_array_equal(guesses["copy"][j], guesses["mask"][j])
            kinds.add("none")
    assert kinds == {"none", "cut", "full"}, kinds


def test_copy_rows_sets_and_shifts_copy_bias_rows():
    """experiments/copy_rows.py: ``L=V`` sets a matched length's row (V may be negative), ``A-B+=D`` shifts a
    range of rows by a signed D, in the order given; other rows and the weights stay; ``--ngram-min`` changes
    only the config; rows past the table, a reversed range and a drafter without a table are refused."""
    import argparse
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    from copy_rows import row_spec, with_rows
    from helpers import TINY

    from dflash_jax.drafter import DrafterConfig, init_drafter_params
    from dflash_jax.errors import ConfigError

    cfg = hf_format.read_config(dict(TINY, model_type="qwen3", vocab_size=VG))
    dcfg = DrafterConfig.for_target(cfg, 1, 6, 3, block_input="ngram", ngram_max=4, ngram_min=2, copy_bias=5.0)
    table = np.arange(20, dtype=np.float32).reshape(4, 5)
    params = dict(init_drafter_params(dcfg, seed=0), copy_bias=table)
    assert row_spec("2=-5") == (2, 2, "=", -5.0) and row_spec("3-4+=-1.5") == (3, 4, "+=", -1.5)
    got, cfg1 = with_rows(
        params, dcfg, 1, [row_spec("1=30"), row_spec("3-4+=2.5"), row_spec("4+=-1"), row_spec("2=-5")]
    )
    want = table.copy()
    want[0], want[1], want[2], want[3] = 30.0, -5.0, table[2] + 2.5, table[3] + 1.5
    np.testing.assert_array_equal(got["copy_bias"], want)
    np.testing.assert_array_equal(params["copy_bias"], np.arange(20, dtype=np.float32).reshape(4, 5))  # not in place
    assert (cfg1.ngram_min, cfg1.ngram_max) == (1, 4)
    assert all(got[k] is params[k] for k in params if k != "copy_bias")
    _, same = with_rows(params, dcfg, None, [])
    assert same == dcfg
    with pytest.raises(ConfigError, match="rows for 1..4-token matches"):
        with_rows(params, dcfg, None, [row_spec("4-5=1")])
    plain = DrafterConfig.for_target(cfg, 1, 6, 3)
    with pytest.raises(ConfigError, match="no copy-bias table"):
        with_rows(init_drafter_params(plain, seed=0), plain, None, [row_spec("1=1")])
    with pytest.raises(argparse.ArgumentTypeError, match="A <= B"):
        row_spec("4-3=1")
    with pytest.raises(argparse.ArgumentTypeError, match="give L=V"):
        row_spec("2:30")


def test_lookup_vs_drafter_walks_prompt_lookup_as_study_tau():
    """experiments/lookup_vs_drafter.py: its per-anchor prompt lookup, walked into rounds, gives study_tau.py's
    prompt-lookup rounds; the run is the matched n where the match is shorter than 4 tokens, and in a loop the
    whole way back to where the loop began (capped at 64); the answer's short-match record is causal and its
    arithmetic as stated; the exact best choice of one chain a round is at least the greedy per-anchor one."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    from anchor_acceptance import simulated_rounds
    from lookup_vs_drafter import best_choice_tau, lookup_at_anchors, short_record
    from ngram_acceptance import propose
    from study_tau import ngram_rounds

    rng = np.random.default_rng(3)
    loop = list(rng.integers(0, 50, 7))
    for full in (list(rng.integers(0, 6, 90)), list(rng.integers(0, 50, 20)) + loop * 9, list(range(40))):
        for block in (4, 16):
            acc, runs = lookup_at_anchors(full, 5, block)
            n = len(full)
            assert (acc <= n - 1 - (5 + np.arange(n - 6))).all()  # no round past the answer's end
            assert simulated_rounds(acc) == ngram_rounds(full, 5, block)
            matched = np.asarray([propose(full[: p + 1], block - 1)[1] for p in range(5, n - 1)])
            assert (runs >= matched).all() and (runs[matched < 4] == matched[matched < 4]).all()
            assert (acc[runs == 0] == 1).all()  # no match, no draft
    full = list(rng.integers(50, 70, 26)) + loop * 12  # the loop's tokens never occur before it
    _, runs = lookup_at_anchors(full, 5, 8)
    for p in range(5 + 26 + 7, len(full) - 1):  # a whole period committed: the run reaches back to the loop's start
        assert runs[p - 5] == min(64, p - 26 - 6), p
    np.testing.assert_allclose(short_record(np.array([2, 1, 5, 1]), np.array([1, 1, 0, 2])), [0.5, 0.75, 0.5, 0.5])
    lk, rn = rng.integers(1, 5, 50), rng.integers(0, 6, 50)
    base = short_record(lk, rn)
    for p in (0, 10, 49):  # what comes after anchor p never changes its record
        lk2, rn2 = lk.copy(), rn.copy()
        lk2[p:], rn2[p:] = rng.integers(1, 5, 50 - p), rng.integers(0, 6, 50 - p)
        np.testing.assert_array_equal(short_record(lk2, rn2)[: p + 1], base[: p + 1])
    cap = 60 - np.arange(60)  # as the tool caps them: no round past the answer's end
    d, lk = np.minimum(rng.integers(1, 6, 60), cap), np.minimum(rng.integers(1, 6, 60), cap)
    best = best_choice_tau([d], [lk])
    greedy = simulated_rounds(np.maximum(d, lk))
    assert best >= sum(greedy) / len(greedy) - 1e-12
    assert best_choice_tau([d], [d]) == sum(simulated_rounds(d)) / len(simulated_rounds(d))
