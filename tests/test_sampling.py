"""Sampling: the tempered distribution against the reference, and speculative sampling's output
distribution against the target's own (exact enumeration + chi-square).

The distribution tests decode the first three tokens of one prompt N times (one seed per row)
and compare the empirical joint distribution with the exact one, computed by running the
target on every two-token prefix. Cells with expected count < 5 are pooled; the chi-square
test rejects at p < 1e-3, so each passing check has a 0.1% false-alarm rate (seeds are fixed,
so the suite is deterministic). The same test rejects a drafter that ignores the temperature
(drafts its argmax while the acceptance rule assumes tempered samples), one of SPEC's fault kinds.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from dflash_jax import drafter, hf_format
from dflash_jax.decode import Decoder
from dflash_jax.drafter import DrafterConfig, DraftStep, init_drafter_params
from dflash_jax.sampling import Sampling, probs
from dflash_jax.speculation import make_plan
from dflash_jax.target import Target, init_params

V = 8  # vocabulary: 8^3 = 512 joint cells for three tokens
PROMPT = [1, 5, 2, 7, 3]
N, CHUNK = 16384, 2048
P_REJECT = 1e-3


@pytest.fixture(scope="session")
def tiny():
    hf = dict(
        model_type="qwen3",
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    )
    cfg = hf_format.read_config(hf)
    params = jax.tree.map(lambda x: x * 3.0 if x.ndim == 2 else x, init_params(cfg, seed=1))  # peakier logits
    dcfg = DrafterConfig.for_target(cfg, num_layers=1, block_size=4, mask_token_id=V - 1)
    dparams = jax.tree.map(lambda x: x * 3.0 if x.ndim == 2 else x, init_drafter_params(dcfg, seed=2))
    return cfg, params, dcfg, dparams


def exact_joint(cfg, params, s: Sampling) -> np.ndarray:
    """``[V, V, V]`` probability of the first three new tokens, by enumeration of all prefixes."""
    pairs = np.array([(a, b) for a in range(V) for b in range(V)], np.int32)
    seqs = np.concatenate([np.tile(PROMPT, (len(pairs), 1)), pairs], axis=1)
    pos = np.broadcast_to(np.arange(seqs.shape[1]), seqs.shape)
    model = Target(cfg)
    hidden, _, _ = model.apply({"params": params}, jnp.asarray(seqs), jnp.asarray(pos))
    p = np.asarray(probs(model.apply({"params": params}, hidden, method="logits"), s), np.float64)
    n = len(PROMPT)
    p1 = p[0, n - 1]  # [V]
    p2 = p[::V, n].reshape(V, V)  # rows with pair (a, 0): p(x2 | a)
    p3 = p[:, n + 1].reshape(V, V, V)  # p(x3 | a, b)
    return p1[:, None, None] * p2[:, :, None] * p3


def sampled_joint(dec: Decoder) -> np.ndarray:
    counts = np.zeros((V, V, V))
    for c in range(0, N, CHUNK):
        for r in dec.generate([PROMPT] * CHUNK, 3, (), seed=list(range(c, c + CHUNK))):
            counts[tuple(r.token_ids)] += 1
    return counts


def chi_square_p(counts: np.ndarray, expected_p: np.ndarray) -> float:
    """p-value of a chi-square goodness-of-fit test, cells with expected count < 5 pooled."""
    counts, exp = counts.ravel(), expected_p.ravel() * counts.sum()
    big = exp >= 5
    obs = np.append(counts[big], counts[~big].sum())
    ex = np.append(exp[big], exp[~big].sum())
    if ex[-1] == 0:
        obs, ex = obs[:-1], ex[:-1]
    return float(stats.chisquare(obs, ex * obs.sum() / ex.sum()).pvalue)


SETTINGS = [Sampling(0.8), Sampling(1.0, top_p=0.9, top_k=5)]


@pytest.mark.parametrize("s", SETTINGS, ids=["t0.8", "t1-p0.9-k5"])
def test_speculative_sampling_keeps_the_target_distribution(tiny, s):
    cfg, params, dcfg, dparams = tiny
    exact = exact_joint(cfg, params, s)
    spec = Decoder(params, cfg, make_plan(DraftStep(dcfg, cfg), dparams, block_size=4), sampling=s)
    counts = sampled_joint(spec)
    assert chi_square_p(counts, exact) > P_REJECT
    # the check has teeth at this N: the same counts against another temperature's distribution fail
    assert chi_square_p(counts, exact_joint(cfg, params, Sampling(s.temperature * 1.5, s.top_p, s.top_k))) < P_REJECT


def test_plain_sampling_keeps_the_target_distribution(tiny):
    cfg, params, _, _ = tiny
    s = Sampling(0.8)
    assert chi_square_p(sampled_joint(Decoder(params, cfg, sampling=s)), exact_joint(cfg, params, s)) > P_REJECT


def test_the_test_rejects_a_drafter_that_ignores_the_temperature(tiny, monkeypatch):
    """Public fault kind: the drafter proposes its argmax whatever the temperature, while the
    acceptance rule treats the draft as a sample from the tempered q."""
    cfg, params, dcfg, dparams = tiny
    s = Sampling(0.8)
    monkeypatch.setattr(
        drafter, "sampled", lambda key, logits, s: (jnp.argmax(logits, -1).astype(jnp.int32), probs(logits, s))
    )
    counts = sampled_joint(Decoder(params, cfg, make_plan(DraftStep(dcfg, cfg), dparams, block_size=4), sampling=s))
    assert chi_square_p(counts, exact_joint(cfg, params, s)) < P_REJECT


def test_sampling_is_reproducible_per_request(tiny):
    cfg, params, dcfg, dparams = tiny
    dec = Decoder(params, cfg, make_plan(DraftStep(dcfg, cfg), dparams, block_size=4), sampling=Sampling(1.0))
    alone = dec.generate([PROMPT], 12, (), seed=7)[0].token_ids
    batch = dec.generate([[2, 3], PROMPT, PROMPT], 12, (), seed=[1, 7, 8])
    assert batch[1].token_ids == alone  # same prompt and seed, another batch
    assert dec.generate([PROMPT], 12, (), seed=7)[0].token_ids == alone
    assert len({tuple(r.token_ids) for r in dec.generate([PROMPT] * 8, 12, (), seed=list(range(8)))}) > 1


def test_temperature_zero_is_greedy_whatever_top_p_and_top_k(tiny):
    cfg, params, dcfg, dparams = tiny
    greedy = Decoder(params, cfg).generate([PROMPT], 16, ())[0].token_ids
    for s in (Sampling(0.0), Sampling(0.0, top_p=0.3, top_k=2)):
        out = Decoder(params, cfg, make_plan(DraftStep(dcfg, cfg), dparams, block_size=4), sampling=s).generate(
            [PROMPT], 16, ()
        )
        assert out[0].token_ids == greedy


@pytest.mark.parametrize(
    "t,top_p,top_k",
    [
        (1.0, 1.0, 0),
        (0.7, 1.0, 0),
        (1.3, 0.9, 0),
        (1.0, 0.5, 10),
        (0.9, 1.0, 1),
        (1.0, 1.0, 50),
        (1.0, 1.0, 500),
        (1.0, 1e-6, 0),
        (2.0, 0.8, 7),
        (0.5, 0.999, 3),
    ],
)
def test_probs_match_the_reference(t, top_p, top_k):
    torch = pytest.importorskip("torch")
    from dflash.model import _sampling_probs

    logits = np.random.default_rng(0).normal(0, 3, (4, 50)).astype(np.float32)
    ours = np.asarray(probs(jnp.asarray(logits), Sampling(t, top_p, top_k)))
    ref = _sampling_probs(torch.from_numpy(logits), t, top_p, top_k).numpy()
    np.testing.assert_allclose(ours, ref, atol=1e-6)
    assert np.allclose(ours.sum(-1), 1, atol=1e-5)
    if top_k == 1 or top_p == 1e-6:  # a single token survives: the argmax
        np.testing.assert_array_equal(ours.argmax(-1), logits.argmax(-1))
        assert np.all((ours > 0).sum(-1) == 1)


@pytest.mark.parametrize(
    "kw", [dict(temperature=-0.1), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-1), dict(top_k=2.5)]
)
def test_invalid_settings_are_refused_like_the_reference(kw):
    with pytest.raises(ValueError):
        Sampling(**kw)


@pytest.mark.parametrize("s", [Sampling(0.0), Sampling(1.0, top_k=4)], ids=["greedy", "sampled"])
def test_stream_yields_the_rounds_of_generate(tiny, s):
    cfg, params, dcfg, dparams = tiny
    dec = Decoder(params, cfg, make_plan(DraftStep(dcfg, cfg), dparams, block_size=4), sampling=s)
    stop, longest = [3], 0
    for seed in range(6):
        full = dec.generate([PROMPT], 24, stop, seed=seed)[0]
        parts = list(dec.stream(PROMPT, 24, stop, seed=seed))
        assert sum(parts, []) == full.token_ids
        assert [len(p) for p in parts[1:]] == full.acceptance_lengths  # first part: the prefill token
        longest = max([longest, *full.acceptance_lengths])
    assert longest > 1 or s.greedy  # sampled rounds that commit several tokens are streamed whole


def test_stream_raises_bad_input_in_the_caller():
    cfg = hf_format.read_config(
        dict(
            model_type="qwen3",
            vocab_size=V,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            max_position_embeddings=128,
            rms_norm_eps=1e-6,
        )
    )
    with pytest.raises(ValueError, match="max_new_tokens"):
        list(Decoder(init_params(cfg), cfg).stream(PROMPT, 0))


def test_one_stream_at_a_time_per_decoder(tiny):
    cfg, params, _, _ = tiny
    dec = Decoder(params, cfg)
    first = dec.stream(PROMPT, 8)
    next(first)  # running
    with pytest.raises(RuntimeError, match="already streaming"):
        next(dec.stream(PROMPT, 8))
    rest = list(first)
    assert len(rest) == 7 and list(dec.stream(PROMPT, 8))  # the decoder streams again once the first is done


@pytest.mark.parametrize("s", SETTINGS, ids=["t0.8", "t1-p0.9-k5"])
def test_dflash2_sampling_keeps_the_target_distribution(tiny, s):
    """A DFlash 2 drafter samples its draft from the selector's walk over 3 of the 8 tokens per
    offset; the loop's rejection rule reads that sparse q (0 outside the candidates): the output
    is still distributed as the target's, and drafts are accepted."""
    import dataclasses

    cfg, params, dcfg, _ = tiny
    d2 = dataclasses.replace(dcfg, conv_kernel_size=2, conv_group_size=16, selector_rank=4, selector_top_k=3)
    rs = np.random.RandomState(3)
    d2params = jax.tree.map(lambda x: np.asarray(x) * 3.0 + 0.2 * rs.randn(*x.shape), init_drafter_params(d2, seed=2))
    spec = Decoder(params, cfg, make_plan(DraftStep(d2, cfg), d2params, block_size=4), sampling=s)
    counts = np.zeros((V, V, V))
    multi = 0
    for c in range(0, N, CHUNK):
        for r in spec.generate([PROMPT] * CHUNK, 3, (), seed=list(range(c, c + CHUNK))):
            counts[tuple(r.token_ids)] += 1
            multi += max(r.acceptance_lengths) > 1
    assert multi > N // 20  # drafts were accepted
    assert chi_square_p(counts, exact_joint(cfg, params, s)) > P_REJECT
    assert chi_square_p(counts, exact_joint(cfg, params, Sampling(s.temperature * 1.5, s.top_p, s.top_k))) < P_REJECT


@pytest.mark.parametrize("s", SETTINGS, ids=["t0.8", "t1-p0.9-k5"])
def test_tree_sampling_keeps_the_target_distribution(tiny, s):
    """Draft trees under sampling (SPEC "Tree verification" 3): the walk takes one draw of the target's
    tempered p at each node and follows the child holding it; the output is the target's distribution
    (chi-square, power shown by the other temperature), trees were accepted past one token, and a
    request's output does not depend on the batch it is in."""
    from dflash_jax.ngram import NgramStep
    from dflash_jax.tree_step import TreeStep

    cfg, params, dcfg, dparams = tiny
    skip = s.top_k > 0  # one setting each way: rows with a match take the branch alone (skip_drafter), or both
    step = TreeStep(DraftStep(dcfg, cfg), 6, NgramStep(ngram_max=2), min_match=1, ngram_nodes=2, skip_drafter=skip)
    spec = Decoder(params, cfg, make_plan(step, dparams), sampling=s)
    counts = np.zeros((V, V, V))
    multi = 0
    for c in range(0, N, CHUNK):
        for r in spec.generate([PROMPT] * CHUNK, 3, (), seed=list(range(c, c + CHUNK))):
            counts[tuple(r.token_ids)] += 1
            multi += max(r.acceptance_lengths) > 1
    assert multi > N // 20  # trees were accepted past their first token
    assert chi_square_p(counts, exact_joint(cfg, params, s)) > P_REJECT
    assert chi_square_p(counts, exact_joint(cfg, params, Sampling(s.temperature * 1.5, s.top_p, s.top_k))) < P_REJECT
    alone = spec.generate([PROMPT], 12, (), seed=5)[0].token_ids
    batch = spec.generate([[2, 3], PROMPT, [6] * 9], 12, (), seed=[1, 5, 9])
    assert batch[1].token_ids == alone
