"""Open-ended chat prompts, written from templates here: writing, role-play and reasoning tasks in the manner of
MT-Bench's first turns, which the training prompt files hold little of (Alpaca's instructions are short; the code
sets and GSM8K are no chat).

Issue 38: on MT-Bench the shipped drafter is 1.18x prompt lookup's tau where 1.3x is asked, and the gap is its own
tokens (docs/BENCHMARKS.md, "Where prompt lookup beats the shipped drafter"). The 40 first turns measured there are
MT-Bench's writing, role-play, reasoning and mathematics questions, and the drafter's tau is lowest on writing
(2.2) and mathematics (2.2; ``experiments/math_prompts.py`` covers that). The target answers these prompts itself
(``prepare-data``), so the drafter learns SmolLM2's own long-form prose. No benchmark question is used or
paraphrased: every prompt is a template below filled from lists written here (seeded), and ``--check`` refuses a
template that reads as an MT-Bench turn (``math_prompts.overlaps``: the longest run of words in common).

    .venv/bin/python experiments/chat_prompts.py --count 2048 --out data/prompts/chat_templates.jsonl --check
    .venv/bin/dflash-jax prepare-data --prompts data/prompts/chat_templates.jsonl --format plain \\
        --max-new-tokens 256 --batch-size 16 --shard-size 128 --out data/smollm2-chats

Each row is ``{"prompt": ..., "kind": ...}``.
"""

from __future__ import annotations

import random

from math_prompts import cli, make_rows

TOPICS = (
    "a week of hiking in the Scottish Highlands",
    "learning to bake sourdough bread",
    "the first day at a new job",
    "growing tomatoes on a city balcony",
    "the history of the printing press",
    "a solar eclipse seen from a small village",
    "commuting by bicycle in winter",
    "adopting a rescue cat",
    "a family reunion that went wrong",
    "the invention of the telephone",
    "a lighthouse keeper's last night",
    "a robot that learns to paint",
    "saving money on groceries",
    "the life cycle of a monarch butterfly",
    "a jazz concert in New Orleans",
    "moving to a country where you do not speak the language",
    "the benefits of a daily walk",
    "an old bookshop about to close",
    "the first snowfall of the year",
    "a chess tournament for beginners",
    "building a treehouse with children",
    "a train journey across Canada",
    "the importance of sleep for students",
    "a festival of lanterns",
    "restoring an old motorcycle",
    "a volunteer day at an animal shelter",
    "the future of public libraries",
    "a storm at sea",
    "learning a musical instrument as an adult",
    "the street food of Mexico City",
    "a small town's annual fair",
    "the discovery of penicillin",
    "working from home with young children",
    "a marathon run in the rain",
    "a beekeeper's year",
    "the night sky in the desert",
    "a wedding in a thunderstorm",
    "recycling electronics",
    "a first visit to an art museum",
    "the rise of electric scooters",
    "a grandmother's secret recipe",
    "a mountain village cut off by snow",
    "starting a neighbourhood book club",
    "the history of coffee",
    "a detective who is afraid of the dark",
    "a drought in a farming town",
    "the science of rainbows",
    "a summer job at an ice cream shop",
    "planning a surprise party",
    "the building of a great bridge",
    "a musician who loses her hearing",
    "cleaning up a polluted river",
    "a birthday on the International Space Station",
    "the ethics of self-driving cars",
    "a ferry ride between islands",
    "a lost wallet and an honest stranger",
    "teaching a parrot to talk",
    "the last day of school",
    "a power cut in a big city",
    "the origins of the Olympic Games",
    "a scientist who finds a new species",
    "renovating a kitchen on a budget",
    "a dragon who wants to be a chef",
    "the history of chocolate",
    "a child's first swimming lesson",
    "a haunted hotel in the mountains",
)
FORMS = (
    "a blog post",
    "a short story",
    "a persuasive essay",
    "a personal letter",
    "a speech for a school assembly",
    "a newspaper article",
    "a product review",
    "a diary entry",
    "a dialogue between two friends",
    "a travel guide entry",
    "the opening chapter of a novel",
    "a motivational talk",
    "a museum plaque",
    "a radio advertisement",
    "a children's bedtime story",
    "a formal report",
    "a set of practical tips",
)
CONSTRAINTS = (
    "",
    " Keep it under 200 words.",
    " Give it a catchy title.",
    " Use at least three vivid images.",
    " End with a question for the reader.",
    " Write it in the first person.",
    " Make it funny.",
    " Use simple words a child would understand.",
    " Organise it under three headings.",
    " Include one surprising fact.",
    " Make the mood calm and reflective.",
    " Write it in exactly four paragraphs.",
)
ROLES = (
    "a medieval blacksmith",
    "a ship's captain in a storm",
    "a detective in 1920s London",
    "a kindergarten teacher",
    "the first colonist on Mars",
    "a chef in a busy restaurant kitchen",
    "a museum tour guide",
    "a personal trainer",
    "an alien visiting Earth for the first time",
    "a village librarian",
    "a startup founder pitching to investors",
    "a park ranger",
    "a pirate who has retired to a quiet village",
    "a nurse on a night shift",
    "a weather forecaster on live television",
    "a wise old owl",
    "a time traveller from the year 3000",
    "a football coach at half time",
    "a tailor in a small shop",
    "a mountain guide",
    "a friendly dragon",
    "a stand-up comedian",
    "a travel agent",
    "a history professor",
    "a lighthouse keeper",
    "a barista",
    "a career counsellor",
    "a gardener in a royal palace",
    "a news reporter at a science fair",
    "a sleepy cat",
)
ROLE_TASKS = (
    "Introduce yourself and describe a typical day.",
    "A visitor asks you what the hardest part of your work is. Answer in character.",
    "Give a newcomer your best three pieces of advice.",
    "Explain {topic} to me in your own voice.",
    "Tell me about the most memorable day you have ever had.",
    "Someone complains to you that {topic} is boring. Convince them otherwise, staying in character.",
    "Describe your favourite place and why you love it.",
    "Answer this question in character: what would you change about the world?",
)
NAMES = ("Alice", "Ben", "Chloe", "Daniel", "Emma", "Farid", "Grace", "Hiro", "Isla", "Jonas", "Kira", "Liam", "Maya")
THINGS = ("apples", "pencils", "marbles", "stickers", "books", "coins", "cookies", "stamps", "shells", "cards")


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def writing(r: random.Random) -> str:
    topic = r.choice(TOPICS)
    lead = r.choice(("Write", "Compose", "Draft", "Create", "Please write", "Could you write"))
    if r.random() < 0.15:
        form, rule = r.choice(VERSE), r.choice(("", " Make it rhyme.", " Keep it light-hearted.", " Give it a title."))
    else:
        form, rule = r.choice(FORMS), r.choice(CONSTRAINTS)
    return f"{lead} {form} about {topic}.{rule}"


PROPOSITIONS = (
    "school uniforms",
    "a four-day working week",
    "banning cars from city centres",
    "homework for young children",
    "public money for space exploration",
    "nuclear power",
    "an age limit for social media",
    "shops that refuse cash",
    "year-round schooling",
    "working from home",
    "free public transport",
    "a tax on sugary drinks",
    "keeping animals in zoos",
    "self-checkout machines",
    "daylight saving time",
    "mobile phones in classrooms",
    "building more high-rise housing",
    "paying students for good grades",
    "tourist taxes",
    "a universal basic income",
)
ACTIVITIES = (
    "a weekend hike",
    "a pottery class",
    "a beach clean-up",
    "a board game night",
    "a cooking workshop",
    "a charity run",
    "a visit to the science museum",
    "a picnic in the park",
    "a community garden day",
    "a photography walk",
    "a trip to the farmers' market",
    "an outdoor film screening",
    "a salsa lesson",
    "a stargazing evening",
    "a bike ride along the river",
    "a quiz night at the library",
)
VERSE = ("a poem", "a limerick", "a song chorus")


def planning(r: random.Random) -> str:
    topic = r.choice(TOPICS)
    return r.choice(
        [
            f"Suggest five titles for an article about {topic}, and explain which one you would choose.",
            f"Write an outline for a talk about {topic}, with an introduction, three main points and a conclusion.",
            f"Write two short paragraphs about {topic}: one hopeful, one worried.",
            f"Write the first and last sentences of a story about {topic}, then fill in the middle in 100 words.",
            f"Summarise the main arguments for and against {r.choice(PROPOSITIONS)}, as a balanced list.",
            f"Explain how you would turn {topic} into {r.choice(FORMS)}: the audience, the tone and the structure.",
            f"Write a short email inviting a friend to join you for {r.choice(ACTIVITIES)}."
            f"{r.choice(('', ' Keep it friendly and brief.', ' Mention the time and place.', ' Make it funny.'))}",
            f"Give {r.randint(3, 7)} questions an interviewer might ask an expert on {topic}, with short answers.",
            f"Write a short debate between two people about {r.choice(PROPOSITIONS)}, each making two points.",
            f"Make a packing list for {r.choice(ACTIVITIES)} and explain why each item is on it.",
        ]
    )


def roleplay(r: random.Random) -> str:
    role, topic = r.choice(ROLES), r.choice(TOPICS)
    lead = r.choice(("Pretend you are", "Act as", "Imagine you are", "Take on the role of", "You are"))
    return f"{lead} {role}. {r.choice(ROLE_TASKS).format(topic=topic)}"


def reasoning(r: random.Random) -> str:
    a, b, c, d = r.sample(NAMES, 4)
    x = r.randint(6, 30)
    y = r.randint(2, min(9, x // 2))
    thing = r.choice(THINGS)
    return r.choice(
        [
            f"{a} is older than {b}, and {b} is older than {c}. Is {c} older than {a}? Explain your reasoning.",
            f"{a} has {x} {thing}. {a} gives {y} to {b} and then receives twice as many from {c}. "
            f"How many {thing} does {a} have now? Explain step by step.",
            f"In a line of {x + 5} people, {a} is {_ordinal(y)} from the front. What is {a}'s position from the back?",
            f"{a}, {b} and {c} each have a different pet: a dog, a cat and a fish. {a} does not have the dog, and "
            f"{b} has the cat. Who has which pet?",
            f"If all {thing} in a box are red, and {a} takes one of them out, what colour is it? "
            "Is the conclusion certain? Explain.",
            f"A clock shows {r.randint(1, 11)}:{r.choice(['00', '15', '30', '45'])}. What is the angle between "
            "the hour and minute hands? Explain your reasoning.",
            f"{a} walks {x} metres north, then {y} metres east, then {x} metres south. How far is {a} from the "
            "start, and in which direction?",
            f"If it takes {y} workers {x} hours to build a wall, how long would it take {y * 2} workers, assuming "
            "they all work at the same rate? What assumptions are you making?",
            f"{a} says: 'I always lie.' Can that sentence be true? Explain the puzzle and what it shows.",
            f"{a} is twice as old as {b}. In {y} years the sum of their ages will be {3 * x + 2 * y}. "
            "How old is each now? Show your reasoning.",
            f"{a}, {b}, {c} and {d} finish a race. {b} finishes before {a}, {c} finishes last, and {d} is not first. "
            "In what order did they finish?",
            f"A shop sells {thing} at {y} for ${x}. How much do {y * 3} {thing} cost, and what is the price of one? "
            "Explain.",
            f"{a} starts reading a {x * 10}-page book and reads {y * 5} pages a day. On which day does {a} finish? "
            "Explain your answer.",
            f"Three friends, {a}, {b} and {c}, split a bill of ${x * 3 + y}. {a} pays ${y} more than each of the other "
            "two, who pay the same. How much does each pay?",
        ]
    )


KINDS = {"writing": writing, "planning": planning, "roleplay": roleplay, "reasoning": reasoning}


def make(count: int, seed: int) -> list[dict]:
    """``count`` distinct prompts, the kinds in turn, each a random template of its kind."""
    return make_rows(KINDS, count, seed, "prompt", "kind")


def main() -> None:
    cli(__doc__, make, "prompt", "kind", len(KINDS), "an MT-Bench turn or a MATH-500 problem")


if __name__ == "__main__":
    main()
