"""Competition-style mathematics prompts, written from templates here: training prompts in MATH-500's
manner (LaTeX, the seven subjects of the MATH set), which the training prompt files lack (GSM8K's word
problems are their only mathematics).

Issue 38: the shipped drafter's own tokens are weakest on MATH-500 and MT-Bench, the two sets where it
is under 1.3x prompt lookup's tau (docs/BENCHMARKS.md, "Where prompt lookup beats the shipped drafter"),
and the training mix holds no competition mathematics. The target answers these prompts itself
(``prepare-data``), so what the drafter learns is SmolLM2's own way of writing such answers: LaTeX,
fractions, ``\\boxed{}``. No benchmark problem is used or paraphrased: every problem is a template below
with random numbers (seeded), and ``--check`` refuses a template that reads as a MATH-500 problem or an MT-Bench
turn with other numbers (``overlaps``).

    .venv/bin/python experiments/math_prompts.py --count 2048 --out data/prompts/math_templates.jsonl --check
    .venv/bin/dflash-jax prepare-data --prompts data/prompts/math_templates.jsonl --format gsm8k \\
        --max-new-tokens 256 --batch-size 16 --shard-size 128 --out data/smollm2-math

Each row is ``{"question": ..., "subject": ...}``; ``--format gsm8k`` adds the benchmark's instruction
("Please reason step by step, and put your final answer within \\boxed{}.").
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import random
import re
from pathlib import Path

from dflash_jax.utils import atomic_write_text


def _frac(r: random.Random) -> tuple[int, int]:
    """A proper or improper fraction ``a / b`` that is not a whole number."""
    b = r.randint(2, 12)
    a = r.choice([x for x in range(1, 3 * b) if x % b])
    return a, b


def _in_base(r: random.Random, base: int) -> str:
    """A 3-4 digit numeral in ``base`` (digits below it, no leading zero)."""
    digits = [r.randint(1, base - 1)] + [r.randint(0, base - 1) for _ in range(r.randint(2, 3))]
    return "".join(map(str, digits))


def _poly(coeffs: list[int], var: str = "x") -> str:
    """``coeffs`` (highest power first) as LaTeX: ``3x^2 - x + 5`` (no ``1x``, no ``+ -``)."""
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


def _lin(a: int, b: int, var: str = "x") -> str:
    """``(a var + b)`` as LaTeX, signs and unit coefficients written properly."""
    return f"({_poly([a, b], var)})"


def _pair(r: random.Random, lo: int, hi: int) -> tuple[int, int]:
    """Two integers in ``[lo, hi]`` neither of which divides the other."""
    while True:
        a, b = r.randint(lo, hi), r.randint(lo, hi)
        if a % b and b % a:
            return a, b


def prealgebra(r: random.Random) -> str:
    a, b = _frac(r)
    c, d = _frac(r)
    n = r.randint(20, 900)
    k = r.randint(2, 9)
    return r.choice(
        [
            rf"Add the fractions $\frac{{{a}}}{{{b}}}$ and $\frac{{{c}}}{{{d}}}$, and give the sum in lowest terms.",
            rf"Reduce the fraction $\frac{{{a * k}}}{{{b * k}}}$ to lowest terms.",
            rf"Find ${r.choice([5, 12, 15, 20, 25, 40, 75])}\%$ of ${n}$.",
            rf"Write ${r.randint(10, 999)}.{r.randint(100, 999)}$ with one digit after the decimal point, rounding "
            "correctly.",
            f"The mean of ${r.randint(3, 9)}$ numbers is ${r.randint(10, 90)}$. If one number, ${r.randint(1, 50)}$, "
            "is removed, what is the mean of the remaining numbers?",
            f"Find the smallest positive integer that is a multiple of both ${r.randint(4, 40)}$ and "
            f"${r.randint(4, 40)}$.",
            rf"Use the order of operations to evaluate ${r.randint(2, 30)} \cdot {r.randint(2, 30)} - "
            rf"{k * r.randint(2, 20)} \div {k}$.",
            f"A rectangle has a perimeter of ${2 * n}$ units and a length of ${n // 2 + r.randint(1, n // 3)}$ units. "
            "What is its area, in square units?",
            rf"Write the repeating decimal ${a}.\overline{{{r.randint(1, 9)}}}$ as a fraction in lowest terms.",
            f"Count the positive multiples of ${r.randint(3, 13)}$ that are smaller than ${n}$.",
        ]
    )


def algebra(r: random.Random) -> str:
    a, b, c, d = (r.randint(1, 12) for _ in range(4))
    x1, x2 = r.randint(-9, 9), r.randint(-9, 9)
    s, p = x1 + x2, x1 * x2
    y1, y2 = r.randint(-9, 9), r.randint(-9, 9)
    return r.choice(
        [
            rf"Let $g(t) = {_poly([a, -b, c], 't')}$. Find $g$ at $t = {r.randint(-5, 6)}$.",
            rf"Find $x$ if $\frac{{x + {a}}}{{{b}}} = \frac{{x - {c}}}{{{d + b}}}$.",
            rf"Add up every solution of the equation ${_poly([1, -s, p], 'y')} = 0$.",
            rf"A line goes through $({x1}, {y1})$ and $({x1 + r.randint(1, 9)}, {y2})$. Find its slope.",
            rf"Write $\sqrt{{{r.choice([8, 12, 18, 20, 27, 28, 32, 45, 48, 50, 72, 75, 98, 108, 200])}}}$ with as "
            "little as possible left under the root sign.",
            rf"Find the least integer that is greater than or equal to $\frac{{{a * 7 + b}}}{{{c + 1}}}$.",
            rf"For which real numbers $x$ is $h(x) = \frac{{{a}}}{{x^2 - {b * b}}}$ defined? Answer in interval "
            "notation.",
            rf"Two numbers $x$ and $y$ satisfy $x + y = {a + b}$ and $x - y = {a - b}$. Find their product.",
            rf"For what value of $k$ does the line ${a}x + ky = {c}$ pass through the point $({b}, {-d})$?",
            rf"Multiply out ${_lin(a, b)}{_lin(c, -d)}$ and collect like terms.",
            rf"How far apart are the points $({x1}, {y1})$ and $({x2}, {y2})$ in the plane?",
            rf"The sum of two numbers is ${a + b + 20}$ and their difference is ${abs(a - b)}$. "
            "What is the larger number?",
        ]
    )


def number_theory(r: random.Random) -> str:
    a, m = r.randint(2, 19), r.randint(3, 17)
    n = r.randint(100, 9999)
    base = r.randint(2, 9)
    while math.gcd(a, m) != 1:  # a congruence a n = t (mod m) with a solution for every t
        a = r.randint(2, 19)
    q, w = _pair(r, 3, 20)
    return r.choice(
        [
            rf"Find the remainder of ${a}^{{{r.randint(10, 200)}}}$ upon division by ${m}$.",
            rf"What is the largest integer that divides both ${n}$ and ${r.randint(100, 9999)}$?",
            rf"Count the positive integers that divide ${r.randint(24, 2000)}$ exactly.",
            rf"Write the decimal number ${n}$ in base ${base}$.",
            rf"Add ${_in_base(r, base)}_{{{base}}}$ and ${_in_base(r, base)}_{{{base}}}$, working in base ${base}$, "
            rf"and give the sum in base ${base}$.",
            rf"Find the last digit of ${a}^{{{r.randint(10, 99)}}}$.",
            rf"Add up all the positive divisors of ${r.randint(20, 400)}$.",
            rf"Solve the congruence ${a}n \equiv {r.randint(1, m - 1)} \pmod{{{m}}}$ for the smallest positive $n$.",
            rf"What is the largest prime factor of ${n}$?",
            f"Among the positive integers below ${n}$, how many are multiples of ${q}$ and not multiples of ${w}$?",
        ]
    )


WORDS = ("LEVEL", "BANANA", "COMMITTEE", "SUCCESS", "PEPPER", "BALLOON", "MISSISSIPPI", "TATTOO", "ADDRESS")


def counting(r: random.Random) -> str:
    n, k = r.randint(5, 15), r.randint(2, 5)
    red, blue = r.randint(2, 9), r.randint(2, 9)
    q, w = _pair(r, 2, 19)
    return r.choice(
        [
            f"How many subsets with exactly ${k}$ elements does a set of ${n}$ elements have?",
            f"In how many ways can a committee of ${k}$ people be chosen from a group of ${n}$ people?",
            f"A jar holds ${red}$ red and ${blue}$ blue marbles. You draw two marbles without putting the first back. "
            "Find the probability that the two have the same colour, as a fraction in lowest terms.",
            f"Roll two fair dice with ${r.choice([4, 8, 10, 12])}$ faces each, numbered from $1$ up. What is the "
            f"chance that the faces add up to ${r.randint(4, 9)}$? Give a fraction in lowest terms.",
            f"Count the distinct orderings of the letters in {r.choice(WORDS)}.",
            f"How many {k}-digit positive integers have digits that are all odd?",
            f"Flip a fair coin ${n}$ times. Find the probability of getting exactly ${k}$ heads, as a fraction in "
            "lowest terms.",
            f"Find the number of circular arrangements of ${k + 2}$ guests at a dinner table, counting two "
            "arrangements as one when a rotation takes one to the other.",
            f"A convex polygon has ${n + 3}$ sides. How many diagonals can be drawn in it?",
            f"Pick an integer uniformly from $1$ to ${r.randint(50, 500)}$. Find the probability that it is divisible "
            f"by ${q}$ or by ${w}$, as a fraction in lowest terms.",
            f"Count the ways to put ${r.randint(4, 12)}$ identical balls into ${k}$ different boxes, where a box may "
            "stay empty.",
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
            f"The legs of a right triangle measure ${a}$ and ${b}$. Find the hypotenuse in simplest radical form.",
            rf"A circle encloses an area of ${rad * rad}\pi$. Find its circumference in terms of $\pi$.",
            rf"Two angles of a triangle measure ${x}^\circ$ and ${y}^\circ$. Find the third angle, in degrees.",
            rf"Find the volume of a cone whose base radius is ${rad}$ and whose height is ${h}$, in terms of $\pi$.",
            f"A trapezoid has parallel sides of lengths ${a}$ and ${b}$ and a height of ${h}$. Find its area.",
            f"Each interior angle of a regular polygon measures ${180 - 360 // r.choice([5, 6, 8, 9, 10, 12, 15, 18])}"
            r"^\circ$. How many sides does the polygon have?",
            rf"A sphere has a surface area of ${4 * rad * rad}\pi$. What is its volume? Answer in terms of $\pi$.",
            f"Two similar triangles have corresponding sides of length ${a}$ and ${a + b}$. If the smaller triangle "
            f"has area ${h * 3}$, what is the area of the larger triangle?",
        ]
    )


def intermediate_algebra(r: random.Random) -> str:
    a, b, c = (r.randint(1, 9) for _ in range(3))
    s, p = r.randint(-9, 9), r.randint(-20, 20)
    t = r.randint(1, 4)
    return r.choice(
        [
            rf"Let $p(x) = {_poly([1, 0, -a, b, -c])}$. Use the remainder theorem to find what is left over when "
            rf"$p(x)$ is divided by $x - {t}$.",
            rf"The quadratic ${_poly([1, -s, p])}$ has roots $r$ and $s$. Without solving, find $r^2 + s^2$.",
            rf"What is the smallest value the expression ${_poly([a, -2 * a * b, c])}$ takes for real $x$?",
            rf"Add up the infinite geometric series ${a} + \frac{{{a}}}{{{b + 1}}} + \frac{{{a}}}{{{(b + 1) ** 2}}} + "
            r"\cdots$.",
            rf"Find the exponent $k$ for which ${a + 1}^k = {(a + 1) ** r.randint(2, 5)}$.",
            rf"Solve $|x - {a}| = {b + c}$ for real $x$.",
            rf"Solve $\log_2 x + \log_2 (x + {2 * a}) = {r.randint(3, 8)}$ for $x > 0$.",
            rf"How many real solutions does ${_poly([1, 0, -a * a, 0])} = 0$ have?",
            rf"Evaluate $\sum_{{k=1}}^{{{r.randint(10, 60)}}} {_lin(a, b, 'k')}$.",
            rf"As $x$ grows without bound, what value does $\frac{{{_poly([a, 0, b])}}}{{{_poly([c, -(a + b), 1])}}}$ "
            "approach?",
        ]
    )


def precalculus(r: random.Random) -> str:
    a, b, c, d = (r.randint(-7, 9) for _ in range(4))
    deg = r.choice([30, 45, 60, 90, 120, 135, 150, 210, 225, 240, 300, 315, 330])
    return r.choice(
        [
            rf"Multiply the matrix $\begin{{pmatrix}} {a} & {b} \\ {c} & {d} \end{{pmatrix}}$ by the vector "
            rf"$\begin{{pmatrix}} {r.randint(-5, 5)} \\ {r.randint(-5, 5)} \end{{pmatrix}}$.",
            rf"Evaluate the determinant $\begin{{vmatrix}} {a} & {b} \\ {c} & {d} \end{{vmatrix}}$.",
            rf"Give the exact value of $\sin {deg}^\circ$.",
            rf"Give the exact value of $\cos {deg}^\circ$.",
            rf"A point has polar coordinates $r = {abs(a) + 1}$ and $\theta = \frac{{\pi}}{{{r.choice([3, 4, 6])}}}$. "
            "Find its $x$ and $y$ coordinates.",
            rf"Multiply the vectors $\begin{{pmatrix}} {a} \\ {b} \\ {c} \end{{pmatrix}}$ and "
            rf"$\begin{{pmatrix}} {d} \\ {r.randint(-5, 5)} \\ {r.randint(-5, 5)} \end{{pmatrix}}$ entry by entry "
            "and add the three products.",
            rf"Multiply the complex numbers ${_lin(a or 1, 0)[1:-1]} + {r.randint(2, 9)}i$ and "
            rf"${c or 1} - {r.randint(2, 9)}i$, and write the result as $x + yi$.",
            rf"Give the exact value of $\tan {r.choice([30, 45, 60, 120, 135, 150])}^\circ$.",
            rf"Find the inverse of $\begin{{pmatrix}} {a} & {b} \\ {c} & {d} \end{{pmatrix}}$, or explain why it has "
            "none.",
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


def make_rows(makers: dict, count: int, seed: int, key: str, label: str) -> list[dict]:
    """``count`` distinct prompts ``{key: prompt, label: name}``, the ``makers`` (name -> template
    function of a ``random.Random``) in turn, each a random template of its maker, seeded.

    Raises:
      SystemExit: a maker's templates cannot fill its share.
    """
    r, rows, seen = random.Random(seed), [], set()
    names = list(makers)
    while len(rows) < count:
        name = names[len(rows) % len(names)]
        for _ in range(10_000):
            q = makers[name](r)
            if q not in seen:
                break
        else:
            raise SystemExit(
                f"error: the {name} templates make fewer than {-(-count // len(names))} prompts; ask fewer"
            )
        seen.add(q)
        rows.append({key: q, label: name})
    return rows


def make(count: int, seed: int) -> list[dict]:
    """``count`` distinct prompts, the subjects in turn, each a random template of its subject."""
    return make_rows(SUBJECTS, count, seed, "question", "subject")


# instructions any textbook gives, left out of the comparison
GENERIC = (
    "express your answer as a common fraction",
    "express your answer in simplest radical form",
    "express your answer in terms of",
    "express your answer in interval notation",
)


LATEX = set(
    "frac dfrac begin end pmatrix vmatrix sqrt cdot cdots ldots circ pi sin cos tan log sum overline div pmod "
    "equiv dbinom binom left right lceil rceil lfloor rfloor mathbf text".split()
)


def normalized(text: str) -> list[str]:
    """The English words of ``text``, lower-cased, without numbers, LaTeX commands, one-letter variables and the
    generic instructions: two problems that differ only in their numbers or notation read the same."""
    s = " ".join(w for w in re.findall(r"[a-z]+", text.lower().replace("\\", " ")) if len(w) > 1 and w not in LATEX)
    for g in GENERIC:
        s = s.replace(g, " ")
    return s.split()


def overlaps(rows: list[dict], key: str, benchmarks: list[str], share: float = 0.6) -> list[tuple[str, str]]:
    """``(prompt, benchmark text)`` for each prompt whose longest run of ``normalized`` words in common with one
    benchmark text covers at least ``share`` of the prompt's words (and at least 4): a benchmark problem with its
    numbers changed, or its wording kept. Prompts of one template with other numbers are checked once."""
    bench = [normalized(b) for b in benchmarks]
    hits, seen = [], set()
    for row in rows:
        w = normalized(row[key])
        if tuple(w) in seen:
            continue
        seen.add(tuple(w))
        for text, b in zip(benchmarks, bench):
            m = difflib.SequenceMatcher(None, w, b, autojunk=False).find_longest_match(0, len(w), 0, len(b))
            if m.size >= 4 and m.size >= share * len(w):
                hits.append((row[key], text))
                break
    return hits


def benchmark_texts(shared: Path) -> list[str]:
    """MATH-500's problems and MT-Bench's turns (``../shared/data/eval``)."""
    texts = [json.loads(x)["problem"] for x in (shared / "math500_test.jsonl").read_text().splitlines()]
    for line in (shared / "mt_bench.jsonl").read_text().splitlines():
        texts += json.loads(line)["turns"]
    return texts


def cli(doc: str, make, key: str, label: str, groups: int, reads_as: str) -> None:
    """The command line both prompt generators share: ``--count``, ``--seed``, ``--out`` (a JSONL file,
    written atomically) and ``--check`` (``overlaps`` against ``../shared/data/eval``; ``reads_as`` names
    what a refused template reads as)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--count", type=int, default=2048, help="prompts (default 2048)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="JSONL file to write")
    ap.add_argument(
        "--check",
        action="store_true",
        help=f"refuse to write if a template reads as {reads_as} (../shared/data/eval; math_prompts.overlaps)",
    )
    args = ap.parse_args()
    if args.count < 1:
        raise SystemExit("error: --count must be >= 1")
    rows = make(args.count, args.seed)
    if args.check:
        shared = Path(__file__).resolve().parents[2] / "shared/data/eval"
        if not shared.is_dir():
            raise SystemExit(f"error: --check needs {shared}")
        hits = overlaps(rows, key, benchmark_texts(shared))
        if hits:
            raise SystemExit(
                f"error: {len(hits)} templates read as {reads_as}, e.g. {hits[0][0]!r} and {hits[0][1][:120]!r}; "
                "reword them"
            )
        print(f"checked: no template reads as {reads_as}")
    atomic_write_text(args.out, "".join(json.dumps(x) + "\n" for x in rows))
    print(f"{args.out}: {len(rows)} prompts, {math.ceil(len(rows) / groups)} or fewer a {label}")


def main() -> None:
    cli(__doc__, make, "question", "subject", len(SUBJECTS), "a MATH-500 problem or MT-Bench turn with other numbers")


if __name__ == "__main__":
    main()
