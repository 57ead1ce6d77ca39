"""Competition-style mathematics prompts, written from templates here: training prompts in MATH-500's
manner (LaTeX, the seven subjects of the MATH set), which the training prompt files lack (GSM8K's word
problems are their only mathematics).

Issue 38: the shipped drafter's own tokens are weakest on MATH-500 and MT-Bench, the two sets where it
is under 1.3x prompt lookup's tau (docs/BENCHMARKS.md, "Where prompt lookup beats the shipped drafter"),
and the training mix holds no competition mathematics. The target answers these prompts itself
(``prepare-data``), so what the drafter learns is SmolLM2's own way of writing such answers: LaTeX,
fractions, ``\\boxed{}``. No benchmark problem is used or paraphrased: every problem is a template below
with random numbers (seeded), and ``--check`` refuses a file that shares a 12-word run with MATH-500.

    .venv/bin/python experiments/math_prompts.py --count 2048 --out data/prompts/math_templates.jsonl --check
    .venv/bin/dflash-jax prepare-data --prompts data/prompts/math_templates.jsonl --format gsm8k \\
        --max-new-tokens 256 --batch-size 16 --shard-size 128 --out data/smollm2-math

Each row is ``{"question": ..., "subject": ...}``; ``--format gsm8k`` adds the benchmark's instruction
("Please reason step by step, and put your final answer within \\boxed{}.").
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
from pathlib import Path


def _frac(r: random.Random) -> tuple[int, int]:
    b = r.randint(2, 12)
    return r.randint(1, 3 * b), b


def _in_base(r: random.Random, base: int) -> str:
    """A 3-4 digit numeral in ``base`` (digits below it, no leading zero)."""
    digits = [r.randint(1, base - 1)] + [r.randint(0, base - 1) for _ in range(r.randint(2, 3))]
    return "".join(map(str, digits))


def _poly(coeffs: list[int], var: str = "x") -> str:
    """``coeffs`` (highest power first) as LaTeX: ``3x^2 - x + 5``."""
    n, out = len(coeffs) - 1, []
    for i, c in enumerate(coeffs):
        p = n - i
        if c == 0:
            continue
        mag = abs(c)
        body = ("" if mag == 1 and p else str(mag)) + (var if p >= 1 else "") + (f"^{p}" if p >= 2 else "")
        sign = "-" if c < 0 else "+"
        out.append((("-" if c < 0 else "") + body) if not out else f" {sign} {body}")
    return "".join(out) or "0"


def prealgebra(r: random.Random) -> str:
    a, b = _frac(r)
    c, d = _frac(r)
    n = r.randint(20, 900)
    return r.choice(
        [
            rf"What is $\frac{{{a}}}{{{b}}} + \frac{{{c}}}{{{d}}}$? Express your answer as a common fraction.",
            rf"Simplify $\frac{{{a * d}}}{{{b * d * r.randint(2, 5)}}}$.",
            rf"What is ${r.choice([5, 12, 15, 20, 25, 40, 75])}\%$ of ${n}$?",
            rf"Round ${r.randint(10, 999)}.{r.randint(100, 999)}$ to the nearest tenth.",
            f"The mean of ${r.randint(3, 9)}$ numbers is ${r.randint(10, 90)}$. If one number, ${r.randint(1, 50)}$, "
            "is removed, what is the mean of the remaining numbers?",
            rf"What is the least common multiple of ${r.randint(4, 40)}$ and ${r.randint(4, 40)}$?",
            rf"Compute ${r.randint(2, 30)} \cdot {r.randint(2, 30)} - {r.randint(2, 99)} \div {r.choice([2, 5, 10])}$.",
            f"A rectangle has a perimeter of ${2 * n}$ units and a length of ${n // 2 + r.randint(1, n // 3)}$ units. "
            "What is its area, in square units?",
            rf"Express ${a}.\overline{{{r.randint(1, 9)}}}$ as a common fraction.",
            f"How many positive multiples of ${r.randint(3, 13)}$ are less than ${n}$?",
        ]
    )


def algebra(r: random.Random) -> str:
    a, b, c, d = (r.randint(1, 12) for _ in range(4))
    x1, x2 = r.randint(-9, 9), r.randint(-9, 9)
    s, p = x1 + x2, x1 * x2
    return r.choice(
        [
            rf"If $f(x) = {_poly([a, -b, c])}$, what is the value of $f({r.randint(-5, 6)})$?",
            rf"Solve for $x$: $\frac{{x + {a}}}{{{b}}} = \frac{{x - {c}}}{{{d + b}}}$.",
            rf"What is the sum of all values of $y$ for which ${_poly([1, -s, p], 'y')} = 0$?",
            rf"Find the slope of the line that passes through the points $({x1}, {a})$ and $({x2 + 10}, {-b})$.",
            rf"Simplify $\sqrt{{{r.choice([8, 12, 18, 20, 27, 28, 32, 45, 48, 50, 72, 75, 98, 108, 200])}}}$.",
            rf"Evaluate $\left\lceil \frac{{{a * 7 + b}}}{{{c + 1}}} \right\rceil$.",
            rf"What is the domain of the function $f(x) = \frac{{{a}}}{{x^2 - {b * b}}}$? "
            "Express your answer in interval notation.",
            rf"If $x + y = {a + b}$ and $x - y = {a - b}$, what is the value of $xy$?",
            rf"For what value of $k$ does the line ${a}x + ky = {c}$ pass through the point $({b}, {-d})$?",
            rf"Expand the product $({a}x + {b})({c}x - {d})$.",
            rf"What is the distance between the points $({x1}, {a})$ and $({x2}, {b})$?",
            rf"The sum of two numbers is ${a + b + 20}$ and their difference is ${abs(a - b)}$. "
            "What is the larger number?",
        ]
    )


def number_theory(r: random.Random) -> str:
    a, m = r.randint(2, 19), r.randint(3, 17)
    n = r.randint(100, 9999)
    base = r.randint(2, 9)
    return r.choice(
        [
            rf"What is the remainder when ${a}^{{{r.randint(10, 200)}}}$ is divided by ${m}$?",
            rf"Find the greatest common divisor of ${n}$ and ${r.randint(100, 9999)}$.",
            rf"How many positive divisors does ${r.randint(24, 2000)}$ have?",
            rf"Convert ${n}_{{10}}$ to base ${base}$.",
            rf"What is ${_in_base(r, base)}_{{{base}}} + {_in_base(r, base)}_{{{base}}}$? "
            rf"Express your answer in base ${base}$.",
            rf"What is the units digit of ${a}^{{{r.randint(10, 99)}}}$?",
            rf"Find the sum of all positive divisors of ${r.randint(20, 400)}$.",
            rf"What is the smallest positive integer $n$ such that ${a}n \equiv {r.randint(1, m - 1)} \pmod{{{m}}}$?",
            rf"What is the largest prime factor of ${n}$?",
            f"How many positive integers less than ${n}$ are divisible by ${a}$ but not by ${m}$?",
        ]
    )


WORDS = ("LEVEL", "BANANA", "COMMITTEE", "SUCCESS", "PEPPER", "BALLOON")


def counting(r: random.Random) -> str:
    n, k = r.randint(5, 15), r.randint(2, 5)
    red, blue = r.randint(2, 9), r.randint(2, 9)
    return r.choice(
        [
            rf"Compute $\dbinom{{{n}}}{{{k}}}$.",
            f"In how many ways can a committee of ${k}$ people be chosen from a group of ${n}$ people?",
            f"A bag has ${red}$ red marbles and ${blue}$ blue marbles. Two marbles are drawn at random without "
            "replacement. What is the probability that both are the same color? Express your answer as a common "
            "fraction.",
            f"Two fair {r.choice([6, 8])}-sided dice are rolled. What is the probability that the sum of the numbers "
            f"rolled is ${r.randint(4, 9)}$? Express your answer as a common fraction.",
            f"How many ways are there to arrange the letters of the word {r.choice(WORDS)}?",
            f"How many {k}-digit positive integers have digits that are all odd?",
            f"A fair coin is flipped ${n}$ times. What is the probability that exactly ${k}$ of the flips are heads? "
            "Express your answer as a common fraction.",
            f"Find the number of circular arrangements of ${k + 2}$ guests at a dinner table, counting two "
            "arrangements as one when a rotation takes one to the other.",
            f"How many diagonals does a convex polygon with ${n + 3}$ sides have?",
            f"An integer is chosen at random from $1$ to ${r.randint(50, 500)}$, inclusive. What is the probability "
            f"that it is a multiple of ${r.randint(2, 9)}$ or ${r.randint(10, 19)}$? Express your answer as a common "
            "fraction.",
            f"In how many ways can ${r.randint(4, 12)}$ identical balls be placed in ${k}$ distinct boxes?",
            f"A club has ${n}$ boys and ${r.randint(5, 15)}$ girls. In how many ways can it choose a president and a "
            "vice-president of different genders?",
            f"How many ${k}$-letter words can be made from the letters A, B, C, D, E, F, G if letters may not repeat "
            f"and the word must {r.choice(['begin with A', 'end with G', 'contain the letter C', 'not contain E'])}?",
            f"A spinner has ${n}$ equal sections numbered $1$ through ${n}$. It is spun ${k}$ times. What is the "
            f"probability that every spin lands on a number greater than ${r.randint(1, n - 2)}$? Express your "
            "answer as a common fraction.",
        ]
    )


def geometry(r: random.Random) -> str:
    a, b = r.randint(3, 24), r.randint(3, 24)
    rad, h = r.randint(2, 12), r.randint(2, 20)
    x, y = r.randint(20, 80), r.randint(20, 80)
    return r.choice(
        [
            f"A right triangle has legs of length ${a}$ and ${b}$. What is the length of its hypotenuse? "
            "Express your answer in simplest radical form.",
            rf"The area of a circle is ${rad * rad}\pi$ square units. What is its circumference, in units? "
            r"Express your answer in terms of $\pi$.",
            rf"In triangle $ABC$, $\angle A = {x}^\circ$ and $\angle B = {y}^\circ$. What is the measure of "
            r"$\angle C$, in degrees?",
            f"What is the volume, in cubic units, of a cone with radius ${rad}$ and height ${h}$? "
            r"Express your answer in terms of $\pi$.",
            f"What is the area, in square units, of a triangle with vertices at $(0, 0)$, $({a}, 0)$ and "
            f"$({r.randint(0, 9)}, {b})$?",
            f"Each interior angle of a regular polygon measures ${180 - 360 // r.choice([5, 6, 8, 9, 10, 12, 15, 18])}"
            r"^\circ$. How many sides does the polygon have?",
            f"A sphere has a surface area of ${4 * rad * rad}\\pi$ square units. What is its volume, in cubic units? "
            r"Express your answer in terms of $\pi$.",
            f"Two similar triangles have corresponding sides of length ${a}$ and ${a + b}$. If the smaller triangle "
            f"has area ${h * 3}$, what is the area of the larger triangle?",
        ]
    )


def intermediate_algebra(r: random.Random) -> str:
    a, b, c = (r.randint(1, 9) for _ in range(3))
    s, p = r.randint(-9, 9), r.randint(-20, 20)
    return r.choice(
        [
            rf"Find the remainder when ${_poly([1, 0, -a, b, -c])}$ is divided by $x - {r.randint(1, 4)}$.",
            rf"Let $r$ and $s$ be the roots of ${_poly([1, -s, p])} = 0$. Compute $r^2 + s^2$.",
            rf"Find the minimum value of ${_poly([a, -2 * a * b, c])}$ over all real numbers $x$.",
            rf"Find the sum of the infinite geometric series ${a} + \frac{{{a}}}{{{b + 1}}} + "
            rf"\frac{{{a}}}{{{(b + 1) ** 2}}} + \cdots$.",
            rf"Evaluate $\log_{{{a + 1}}} {(a + 1) ** r.randint(2, 5)}$.",
            rf"Find all real solutions to $|x - {a}| = {b + c}$. Enter all the solutions, separated by commas.",
            rf"If $\log_2 x + \log_2 (x + {2 * a}) = {r.randint(3, 8)}$, find $x$.",
            rf"Find the number of real roots of ${_poly([1, 0, -a * a, 0])} = 0$.",
            rf"Compute $\sum_{{k=1}}^{{{r.randint(10, 60)}}} ({a}k + {b})$.",
            rf"Find the horizontal asymptote of $y = \frac{{{a}x^2 + {b}}}{{{c}x^2 - {a + b}x + 1}}$.",
        ]
    )


def precalculus(r: random.Random) -> str:
    a, b, c, d = (r.randint(-7, 9) for _ in range(4))
    deg = r.choice([30, 45, 60, 90, 120, 135, 150, 210, 225, 240, 300, 315, 330])
    return r.choice(
        [
            rf"Compute $\begin{{pmatrix}} {a} & {b} \\ {c} & {d} \end{{pmatrix}} "
            rf"\begin{{pmatrix}} {r.randint(-5, 5)} \\ {r.randint(-5, 5)} \end{{pmatrix}}$.",
            rf"Find the determinant of $\begin{{pmatrix}} {a} & {b} \\ {c} & {d} \end{{pmatrix}}$.",
            rf"Compute $\sin {deg}^\circ$.",
            rf"Compute $\cos {deg}^\circ$.",
            rf"Convert the point $\left( {abs(a) + 1}, \frac{{\pi}}{{{r.choice([3, 4, 6])}}} \right)$ in polar "
            "coordinates to rectangular coordinates.",
            rf"Compute $\begin{{pmatrix}} {a} \\ {b} \\ {c} \end{{pmatrix}} \cdot "
            rf"\begin{{pmatrix}} {d} \\ {r.randint(-5, 5)} \\ {r.randint(-5, 5)} \end{{pmatrix}}$.",
            rf"Simplify $({a} + {r.randint(2, 9)}i)({c} - {r.randint(2, 9)}i)$.",
            rf"Find $\tan {r.choice([30, 45, 60, 120, 135, 150])}^\circ$.",
            rf"Find the inverse of the matrix $\begin{{pmatrix}} {a} & {b} \\ {c} & {d} \end{{pmatrix}}$. "
            "If the inverse does not exist, then enter the zero matrix.",
            rf"Convert ${deg}^\circ$ to radians.",
        ]
    )


SUBJECTS = {
    "prealgebra": prealgebra,
    "algebra": algebra,
    "number_theory": number_theory,
    "counting_and_probability": counting,
    "geometry": geometry,
    "intermediate_algebra": intermediate_algebra,
    "precalculus": precalculus,
}


def make(count: int, seed: int) -> list[dict]:
    """``count`` distinct prompts, the subjects in turn, each a random template of its subject."""
    r, rows, seen = random.Random(seed), [], set()
    names = list(SUBJECTS)
    while len(rows) < count:
        subject = names[len(rows) % len(names)]
        for _ in range(10_000):
            q = SUBJECTS[subject](r)
            if q not in seen:
                break
        else:
            raise SystemExit(
                f"error: the {subject} templates make fewer than {count // len(names) + 1} prompts; ask fewer"
            )
        seen.add(q)
        rows.append({"question": q, "subject": subject})
    return rows


def shared_runs(rows: list[dict], benchmark: Path, n: int = 12) -> int:
    """How many prompts share a run of ``n`` words with a problem of ``benchmark`` (MATH-500's JSONL)."""
    words = lambda t: re.findall(r"\S+", t)  # noqa: E731
    grams = set()
    for line in benchmark.read_text().splitlines():
        w = words(json.loads(line)["problem"])
        grams.update(tuple(w[i : i + n]) for i in range(len(w) - n + 1))
    hits = 0
    for row in rows:
        w = words(row["question"])
        hits += any(tuple(w[i : i + n]) in grams for i in range(len(w) - n + 1))
    return hits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--count", type=int, default=2048, help="prompts (default 2048)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="JSONL file to write")
    ap.add_argument(
        "--check",
        action="store_true",
        help="refuse to write if a prompt shares a 12-word run with MATH-500 (../shared/data/eval/math500_test.jsonl)",
    )
    args = ap.parse_args()
    if args.count < 1:
        raise SystemExit("error: --count must be >= 1")
    rows = make(args.count, args.seed)
    if args.check:
        bench = Path(__file__).resolve().parents[2] / "shared/data/eval/math500_test.jsonl"
        if not bench.is_file():
            raise SystemExit(f"error: --check needs {bench}")
        hits = shared_runs(rows, bench)
        if hits:
            raise SystemExit(f"error: {hits} prompts share a 12-word run with MATH-500; change the templates")
        print(f"checked: no prompt shares a 12-word run with {bench.name}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(x) + "\n" for x in rows))
    os.replace(tmp, out)
    print(f"{out}: {len(rows)} prompts, {math.ceil(len(rows) / len(SUBJECTS))} or fewer a subject")


if __name__ == "__main__":
    main()
