"""Write a small, deterministic, multi-domain demo corpus (generated here; nothing is downloaded).

    python tools/make_demo_data.py [--output-dir data/demo] [--size-mb 1.25] [--seed 1234] [--force]

Domains (each generated from its own seeded RNG with templates and word lists):
  web   templated English prose articles (a few names carry non-ASCII letters)
  code  Python modules of generated, syntactically valid functions
  math  arithmetic word problems and equations, each with its correct answer

For each domain D it writes ``D.jsonl`` (``{"id", "domain", "text"}`` per line) and the byte-level
tokenized dataset ``D_text_document.{bin,idx}`` (``--append-eod``), plus ``manifest.json``. Same
arguments, same bytes. Existing outputs made with the same arguments are kept unless ``--force``.
"""

import argparse
import json
import os
import random
import sys
from typing import Callable, Dict, List

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.path.pardir)))

from megatron.runtime.known_warnings import quiet_known_warnings  # noqa: E402

quiet_known_warnings()  # before megatron.core is imported

from megatron.data.preprocess import output_prefix_for_key, preprocess_jsonl  # noqa: E402
from megatron.utils.atomic_io import atomic_write_text  # noqa: E402

DOMAINS = ("web", "code", "math")
DEFAULT_OUTPUT_DIR = os.path.join("data", "demo")
DEFAULT_SIZE_MB = 1.25
DEFAULT_SEED = 1234
MANIFEST = "manifest.json"

# --------------------------------------------------------------------------- web prose
_NAMES = ["Alice", "Bruno", "Chloé", "Daniel", "Elena", "Farid", "Grace", "Hiro", "Ingrid", "José",
          "Kofi", "Lena", "Mateo", "Nadia", "Oscar", "Priya", "Quentin", "Rosa", "Samir", "Zoë",
          "Björn", "Amara", "Tomás", "Wei"]
_CITIES = ["Lisbon", "Nairobi", "Kyoto", "Oslo", "Toronto", "Montréal", "Lima", "Hanoi", "Seville",
           "Dublin", "Tbilisi", "Perth", "Valparaíso", "Kraków", "Accra", "Auckland"]
_TOPICS = {
    "gardening": (["tomatoes", "roses", "herbs", "seedlings", "beans", "fruit trees", "the soil",
                   "compost"],
                  ["water", "prune", "plant", "harvest", "mulch", "feed", "protect"]),
    "cooking": (["bread", "soup", "the sauce", "dumplings", "a stew", "fresh pasta", "rice",
                 "the spices"],
                ["bake", "simmer", "season", "knead", "roast", "taste", "stir"]),
    "travel": (["the old town", "the harbour", "a night train", "the museum", "the market",
                "a mountain trail", "the river"],
               ["visit", "explore", "photograph", "walk along", "discover", "map"]),
    "cycling": (["the bike", "a long climb", "the chain", "the commute", "a gravel road",
                 "the tyres"],
                ["ride", "repair", "clean", "climb", "plan", "adjust"]),
    "astronomy": (["the moon", "Jupiter", "a meteor shower", "the telescope", "distant galaxies",
                   "the night sky"],
                  ["observe", "track", "sketch", "photograph", "study", "find"]),
}
_ADJS = ["quiet", "bright", "crowded", "patient", "careful", "early", "simple", "surprising",
         "gentle", "busy", "small", "generous", "steady", "curious", "familiar", "remarkable"]
_TIMES = ["in the morning", "after lunch", "every weekend", "in early spring", "late at night",
          "during the summer", "on rainy days", "at dawn", "before the holidays", "each autumn"]
_CONNECTIVES = ["However,", "Later,", "Meanwhile,", "In the end,", "At first,", "Because of this,",
                "Still,", "Even so,", "Afterwards,", "Surprisingly,"]
_SENTENCES = [
    "{name} likes to {verb} {obj} {time}.",
    "{conn} {name} decided to {verb} {obj} with {a_adj} friend from {city}.",
    "The {adj} part of {topic} is learning to {verb} {obj} without hurrying.",
    "Many people in {city} {verb} {obj} {time}, and {name} is no exception.",
    "{name} wrote in a notebook that {obj} looked {adj} {time}.",
    "{conn} the neighbours in {city} asked {name} how to {verb} {obj}.",
    "{A_adj} guide to {topic} says you should {verb} {obj} {time}.",
    "When {name} moved to {city}, {topic} became {a_adj} habit.",
    "It took {num} weeks for {name} to {verb} {obj} properly.",
    "{name} believes that {topic} teaches people to be {adj}.",
    "There were {num} people at the {adj} {topic} club in {city} last week.",
    "{conn} {name} found it {adj} to {verb} {obj} {time}.",
]


def _article(word: str) -> str:
    """The indefinite article ('a' or 'an') for ``word``."""
    return "an" if word[0] in "aeiou" else "a"


def _web_document(rng: random.Random, index: int) -> str:
    """One prose article: a title line and 3-6 paragraphs of 3-6 templated sentences."""
    topic = rng.choice(sorted(_TOPICS))
    objs, verbs = _TOPICS[topic]
    name, city = rng.choice(_NAMES), rng.choice(_CITIES)
    title = f"{rng.choice(_ADJS).capitalize()} notes on {topic} from {city}"
    paragraphs = []
    for _ in range(rng.randint(3, 6)):
        sentences = []
        for _ in range(rng.randint(3, 6)):
            adj = rng.choice(_ADJS)
            s = rng.choice(_SENTENCES).format(
                name=name if rng.random() < 0.7 else rng.choice(_NAMES),
                city=city, topic=topic, obj=rng.choice(objs), verb=rng.choice(verbs),
                adj=adj, a_adj=_article(adj) + " " + adj, A_adj=_article(adj).title() + " " + adj,
                time=rng.choice(_TIMES), conn=rng.choice(_CONNECTIVES),
                num=rng.randint(2, 40),
            )
            sentences.append(s[0].upper() + s[1:])
        paragraphs.append(" ".join(sentences))
    return title + "\n\n" + "\n\n".join(paragraphs) + "\n"


# --------------------------------------------------------------------------- Python code
_NOUNS = ["items", "values", "scores", "prices", "words", "records", "counts", "weights", "names",
          "lines", "points", "samples"]
_VERBS = ["compute", "count", "filter", "merge", "normalize", "summarize", "find", "collect",
          "scale", "group", "clip", "rank"]
_ADJ_CODE = ["total", "max", "min", "mean", "unique", "valid", "sorted", "positive", "recent",
             "short", "long", "weighted"]


def _fn_body(rng: random.Random, arg: str) -> List[str]:
    """Body lines (4-space indented) of a generated function over the sequence ``arg``."""
    kind = rng.randrange(6)
    k = rng.randint(2, 9)
    if kind == 0:
        return ["    result = 0", f"    for x in {arg}:", f"        if x > {k}:",
                "            result += x", "    return result"]
    if kind == 1:
        return [f"    return [x * {k} for x in {arg} if x % {rng.randint(2, 5)} == 0]"]
    if kind == 2:
        return ["    counts = {}", f"    for x in {arg}:",
                "        counts[x] = counts.get(x, 0) + 1",
                f"    return sorted(counts.items(), key=lambda kv: -kv[1])[:{k}]"]
    if kind == 3:
        return [f"    if not {arg}:", "        return 0.0",
                f"    return sum({arg}) / len({arg})"]
    if kind == 4:
        return ["    best = None", f"    for i, x in enumerate({arg}):",
                "        if best is None or x < best[1]:", "            best = (i, x)",
                "    return best"]
    return [f"    lo, hi = {-k}, {k}", f"    return [min(max(x, lo), hi) for x in {arg}]"]


def _code_document(rng: random.Random, index: int) -> str:
    """One Python module: a docstring, an optional import and 2-5 generated functions."""
    lines = [f'"""Utilities for {rng.choice(_NOUNS)} (module {index})."""', ""]
    if rng.random() < 0.5:
        lines += [f"import {rng.choice(['math', 'itertools', 'collections', 'statistics'])}", ""]
    used = set()
    for _ in range(rng.randint(2, 5)):
        noun = rng.choice(_NOUNS)
        name = f"{rng.choice(_VERBS)}_{rng.choice(_ADJ_CODE)}_{noun}"
        if name in used:
            continue
        used.add(name)
        arg = noun
        lines += ["", f"def {name}({arg}):",
                  f'    """{name.replace("_", " ").capitalize()} of the given {noun}."""']
        lines += _fn_body(rng, arg)
        lines.append("")
    if rng.random() < 0.5:
        name = sorted(used)[0]
        data = [rng.randint(-20, 50) for _ in range(rng.randint(3, 8))]
        lines += ["", 'if __name__ == "__main__":', f"    print({name}({data}))", ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- math problems
_ITEMS = ["apples", "marbles", "books", "stamps", "pencils", "coins", "shells", "cards"]


def _math_problem(rng: random.Random) -> str:
    """One problem with its correct answer, as 'Question: ... Answer: ...' text."""
    kind = rng.randrange(6)
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    if kind == 0:
        q = f"{name} has {a} {item} and finds {b} more. How many {item} does {name} have now?"
        ans = f"{a} + {b} = {a + b}. The answer is {a + b}."
    elif kind == 1:
        a, b = max(a, b), min(a, b)
        q = f"{name} had {a} {item} and gave away {b}. How many {item} are left?"
        ans = f"{a} - {b} = {a - b}. The answer is {a - b}."
    elif kind == 2:
        a, b = a % 12 + 2, b % 15 + 2
        q = f"There are {a} boxes with {b} {item} in each box. How many {item} are there in all?"
        ans = f"{a} * {b} = {a * b}. The answer is {a * b}."
    elif kind == 3:
        per, groups = a % 9 + 2, b % 12 + 2
        total = per * groups
        q = f"{name} shares {total} {item} equally among {groups} friends. How many does each get?"
        ans = f"{total} / {groups} = {per}. The answer is {per}."
    elif kind == 4:
        x, m = rng.randint(-20, 20), rng.randint(2, 12)
        c = rng.randint(-50, 50)
        q = f"Solve for x: {m}x {'+' if c >= 0 else '-'} {abs(c)} = {m * x + c}."
        undo = f"{'-' if c >= 0 else '+'} {abs(c)}"
        ans = f"{m}x = {m * x + c} {undo} = {m * x}, so x = {m * x} / {m} = {x}. The answer is {x}."
    else:
        p, r, s = rng.randint(1, 30), rng.randint(1, 30), rng.randint(2, 9)
        q = f"Compute {p} + {r} * {s}."
        ans = f"{r} * {s} = {r * s}, and {p} + {r * s} = {p + r * s}. The answer is {p + r * s}."
    return f"Question: {q}\nAnswer: {ans}"


def _math_document(rng: random.Random, index: int) -> str:
    """One worksheet: a title line and 5-15 problems with answers."""
    problems = [_math_problem(rng) for _ in range(rng.randint(5, 15))]
    return f"Worksheet {index}\n\n" + "\n\n".join(problems) + "\n"


GENERATORS: Dict[str, Callable[[random.Random, int], str]] = {
    "web": _web_document, "code": _code_document, "math": _math_document,
}


def generate_domain(domain: str, size_bytes: int, seed: int = DEFAULT_SEED) -> List[str]:
    """Documents of ``domain`` from an RNG seeded by (seed, domain), generated until their UTF-8
    text totals at least ``size_bytes`` bytes."""
    rng = random.Random(f"make_demo_data:{seed}:{domain}")
    gen = GENERATORS[domain]
    docs, total = [], 0
    while total < size_bytes:
        doc = gen(rng, len(docs))
        docs.append(doc)
        total += len(doc.encode("utf-8"))
    return docs


def demo_output_files(output_dir: str, domains=DOMAINS) -> List[str]:
    """Paths ``make_demo_data`` writes: per domain ``D.jsonl``, ``D_text_document.bin/.idx``, and
    ``manifest.json``."""
    files = []
    for d in domains:
        prefix = output_prefix_for_key(os.path.join(output_dir, d), "text")
        files += [os.path.join(output_dir, f"{d}.jsonl"), prefix + ".bin", prefix + ".idx"]
    return files + [os.path.join(output_dir, MANIFEST)]


def make_demo_data(
    output_dir: str = DEFAULT_OUTPUT_DIR, size_mb: float = DEFAULT_SIZE_MB,
    seed: int = DEFAULT_SEED, force: bool = False, verbose: bool = True,
) -> Dict[str, str]:
    """Write the demo corpus (about ``size_mb`` MiB of text per domain) into ``output_dir`` and
    return {domain: dataset prefix} (prefix = ``output_dir/D_text_document``). Skips the work if
    the outputs and a manifest with the same ``size_mb``/``seed`` exist, unless ``force``."""
    prefixes = {d: output_prefix_for_key(os.path.join(output_dir, d), "text") for d in DOMAINS}
    params = {"seed": seed, "size_mb": size_mb, "tokenizer_type": "ByteLevelTokenizer",
              "append_eod": True, "domains": list(DOMAINS)}
    manifest_path = os.path.join(output_dir, MANIFEST)
    if not force and all(os.path.exists(p) for p in demo_output_files(output_dir)):
        try:
            with open(manifest_path, encoding="utf-8") as f:
                old = json.load(f)
        except (OSError, ValueError):
            old = {}
        if old.get("params") == params:
            if verbose:
                print(f"demo data in {output_dir} is up to date (use --force to rebuild)")
            return prefixes
    os.makedirs(output_dir, exist_ok=True)
    size_bytes = int(size_mb * 1024 * 1024)
    summary = {}
    for domain in DOMAINS:
        docs = generate_domain(domain, size_bytes, seed)
        jsonl = os.path.join(output_dir, f"{domain}.jsonl")
        atomic_write_text(jsonl, "".join(
            json.dumps({"id": f"{domain}-{i:06d}", "domain": domain, "text": text},
                       ensure_ascii=False) + "\n" for i, text in enumerate(docs)))
        result = preprocess_jsonl(
            jsonl, os.path.join(output_dir, domain), ["text"], None,
            append_eod=True, workers=1, log_interval=0,
        )
        summary[domain] = {"documents": result.num_documents,
                           "tokens": result.num_tokens["text"],
                           "jsonl_bytes": os.path.getsize(jsonl)}
        if verbose:
            print(f"wrote {jsonl} and {prefixes[domain]}.{{bin,idx}}: "
                  f"{result.num_documents} documents, {result.num_tokens['text']} tokens")
    atomic_write_text(manifest_path, json.dumps({"params": params, "datasets": summary}, indent=2,
                                                sort_keys=True) + "\n")
    if verbose:
        print(f"wrote {manifest_path}")
    return prefixes


def main(argv=None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output-dir", default=DEFAULT_OUTPUT_DIR,
                        help=f"Where to write (default {DEFAULT_OUTPUT_DIR}).")
    parser.add_argument("--size-mb", type=float, default=DEFAULT_SIZE_MB,
                        help="Approximate MiB of text per domain.")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--force", action="store_true", help="Regenerate even if outputs exist.")
    args = parser.parse_args(argv)
    if args.size_mb <= 0:
        parser.error("--size-mb must be > 0")
    make_demo_data(args.output_dir, args.size_mb, args.seed, args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
