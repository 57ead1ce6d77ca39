"""What a round costs inside the compiled loop, by verify length (prompt lookup drafting).

``experiments/profile_round.py`` times the pieces of a round alone; this script times whole decodes:
SmolLM2-135M, batch 1, greedy, the first ``--prompts`` GSM8K questions (chat template), 256 new
tokens each, and for every configuration the mean milliseconds per round and per token over them
(compile and prefill apart, as ``bench`` counts). Configurations: plain decoding; prompt lookup
(``NgramStep``) with a forced verify length L (verify lengths ``[L, 16]`` with costs ``[1,
1000]``, so every round picks L: what a round of that length costs in the loop, with the switch
over lengths and the draft step in it); prompt lookup at block L alone (one length, no switch);
and the default (``verify_lengths="auto"``, costs measured, calibrated) with the costs it measured.

    .venv/bin/python experiments/loop_costs.py --prompts 2
"""

import argparse


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=2, help="first N GSM8K test questions")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    args = ap.parse_args()

    from transformers import AutoTokenizer

    from dflash_jax import checkpoint, prompts
    from dflash_jax.decode import Decoder
    from dflash_jax.ngram import NgramStep
    from dflash_jax.speculation import NGRAM_CONFIDENCE, make_plan
    from dflash_jax.tokens import chat_ids
    from dflash_jax.utils import enable_compilation_cache

    enable_compilation_cache()
    ck = checkpoint.load_target("smollm2-135m-instruct")
    tok = AutoTokenizer.from_pretrained(str(checkpoint.resolve_target("smollm2-135m-instruct")))
    items = prompts.load_eval_prompts("gsm8k", max_turns=1)[: args.prompts]
    ids = [chat_ids(tok, [{"role": "user", "content": p.turns[0]}]) for p in items]

    def run(label, dec, plain_ms=None):
        dec.generate([ids[0]], 8)  # compile (and measure the costs) before the clock
        seconds = rounds = tokens = 0
        for p in ids:
            r = dec.generate([p], args.max_new_tokens)[0]
            seconds += r.decode_s
            rounds, tokens = rounds + len(r.acceptance_lengths), tokens + len(r.token_ids)
        ms = 1e3 * seconds / rounds
        vs = f"{ms / plain_ms:5.2f}" if plain_ms else " 1.00"
        print(f"| {label} | {ms:.1f} | {vs} | {tokens / rounds:.2f} | {1e3 * seconds / tokens:.1f} |", flush=True)
        return ms

    print("| configuration | ms per round | round / plain step | tau | ms per token |")
    print("|---|---|---|---|---|")
    plain = run("plain", Decoder(ck.params, ck.cfg))
    step = NgramStep(confidence=NGRAM_CONFIDENCE)
    for n in (1, 2, 4, 8):
        plan = make_plan(step, verify_lengths=[n, 16], verify_costs=[1, 1000], calibrate=False)
        dec = Decoder(ck.params, ck.cfg, plan)
        run(f"prompt lookup, verify {n} forced (of {n}, 16)", dec, plain)
    for n in (2, 4, 8, 16):
        run(f"prompt lookup, block {n}", Decoder(ck.params, ck.cfg, make_plan(NgramStep(block_size=n))), plain)
    auto = Decoder(ck.params, ck.cfg, make_plan(step, verify_lengths="auto"))
    run("default (prompt lookup, verify lengths auto)", auto, plain)
    costs = [round(float(c), 2) for c in auto.costs_for(auto.shape_for([len(ids[0])], args.max_new_tokens))]
    print(f"verify lengths {list(auto.verify_lengths)}: costs the default measured {costs}")


if __name__ == "__main__":
    main()
