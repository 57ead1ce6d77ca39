"""How steady the decoder's timed verify costs are: ``Decoder.measure_verify_costs`` for the default plans
with and without trees (``--tree 7``, the CPU default until 2026-12-06, / ``off``), timed afresh several times in
one process (each into its own throw-away costs file, so nothing kept is read or changed).

    .venv/bin/python experiments/verify_costs.py --times 2
"""

from __future__ import annotations

import argparse
import os
import tempfile


def main() -> None:
    from dflash_jax import checkpoint, speculation
    from dflash_jax.decode import Decoder

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--times", type=int, default=2, help="timings of each plan")
    ap.add_argument("--repeats", type=int, default=5, help="measure_verify_costs' repeats")
    ap.add_argument("--cache-len", type=int, default=512)
    args = ap.parse_args()
    ck = checkpoint.load_target("smollm2-135m-instruct")
    tok = ck.tokenizer()
    drafter = speculation.load("auto", ck, tok)
    with tempfile.TemporaryDirectory() as tmp:
        for t in range(args.times):
            for name, tree in (("tree", 7), ("chains", "off")):
                os.environ["DFLASH_JAX_VERIFY_COSTS"] = os.path.join(tmp, f"{t}_{name}.json")
                dec = Decoder(ck.params, ck.cfg, speculation.plan_for(ck, drafter, tok, tree=tree))
                costs = dec.measure_verify_costs(1, args.cache_len, repeats=args.repeats)
                widths = ", ".join(f"{w}: {c}" for w, c in zip(dec.verify_lengths, costs))
                print(f"timing {t + 1}, {name}: {widths}", flush=True)


if __name__ == "__main__":
    main()
