"""Write a small, deterministic, templated multitask (T0-style) data set, made here from word lists.

    python tools/make_toy_multitask.py --output-dir data/toy_mtf [--examples-per-task 1500]
        [--seed 1234] [--preprocess]

Training tasks (prompted, each an {"inputs", "targets"} pair):
  sentiment    a short review with a positive or negative opinion word -> " positive" / " negative"
  topic        a sentence about sports, food or weather -> the topic, answer choices listed
  copy         "Repeat the word ..." -> the word
  addition     "What is A plus B?" -> the sum
  contains     "Which of these words appears in the sentence ...?" -> the word that appears
Held-out tasks (never trained on; validation and zero-shot evaluation):
  animal_or_object  "Is a WORD an animal or an object?" (answer choices listed)
  first_word        "Which word comes first in: ...?" (answer choices listed)

Outputs in ``--output-dir``:
  train_TASK.jsonl, valid_TASK.jsonl          {"task", "inputs", "targets"} per line
  heldout_TASK.jsonl                          {"task", "inputs", "targets"} per line
  rank_eval.jsonl                             {"task", "inputs", "choices", "label"} (fresh examples
                                              of sentiment, copy, contains and the held-out tasks)
  pretrain.jsonl                              {"text"}: plain text in the same domain (no prompts)
  manifest.json
With ``--preprocess``: ``*_inputs_document`` / ``*_targets_document`` (``--json-keys inputs targets``)
and ``pretrain_text_document`` byte-level datasets (``--append-eod``). Same arguments, same bytes.
"""
import argparse
import json
import os
import random
import sys
from typing import Callable, Dict, List, Tuple

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.path.pardir)))

from megatron.runtime.known_warnings import quiet_known_warnings  # noqa: E402

quiet_known_warnings()  # before megatron.core is imported

from megatron.utils.atomic_io import atomic_write_text  # noqa: E402

TRAIN_TASKS = ("sentiment", "topic", "copy", "addition", "contains")
HELDOUT_TASKS = ("animal_or_object", "first_word")
RANK_EVAL_TASKS = ("sentiment", "copy", "contains", "animal_or_object", "first_word")

_POSITIVE = ["wonderful", "great", "excellent", "lovely", "delightful", "superb", "amazing",
             "fantastic", "charming", "brilliant"]
_NEGATIVE = ["awful", "terrible", "boring", "dreadful", "poor", "horrible", "disappointing",
             "dull", "annoying", "bad"]
_THINGS = ["film", "book", "restaurant", "hotel", "concert", "album", "game", "museum", "show",
           "cafe"]
_NAMES = ["Alice", "Bruno", "Chloe", "Daniel", "Elena", "Farid", "Grace", "Hiro", "Ingrid", "Jose",
          "Kofi", "Lena", "Mateo", "Nadia", "Oscar", "Priya"]
_TOPIC_WORDS = {
    "sports": ["football", "the match", "the goalkeeper", "a marathon", "the tennis final",
               "the team", "a penalty", "the stadium"],
    "food": ["the soup", "fresh bread", "a spicy curry", "the dessert", "grilled fish",
             "the salad", "a cheese plate", "noodles"],
    "weather": ["the rain", "a cold wind", "the snow", "a sunny sky", "the storm", "thick fog",
                "the heat", "a light drizzle"],
}
_WORDS = ["apple", "river", "candle", "garden", "window", "pencil", "mountain", "violin", "ladder",
          "basket", "mirror", "planet", "bridge", "lemon", "rocket", "pillow", "forest", "castle",
          "button", "anchor", "desert", "feather", "island", "jacket", "kettle", "meadow"]
_ANIMALS = ["cat", "dog", "horse", "rabbit", "tiger", "eagle", "salmon", "frog", "sheep", "whale",
            "owl", "fox"]
_OBJECTS = ["chair", "spoon", "lamp", "table", "bottle", "hammer", "clock", "shoe", "cup", "key",
            "book", "phone"]


def _review(rng: random.Random, positive: bool) -> str:
    word = rng.choice(_POSITIVE if positive else _NEGATIVE)
    thing = rng.choice(_THINGS)
    name = rng.choice(_NAMES)
    templates = [f"{name} went to the {thing} last week. It was {word}.",
                 f"The {thing} was {word}, said {name}.",
                 f"I thought the {thing} was {word} from start to finish.",
                 f"{name} wrote: what a {word} {thing}."]
    return rng.choice(templates)


def task_sentiment(rng: random.Random) -> Tuple[str, List[str], int]:
    positive = rng.random() < 0.5
    text = _review(rng, positive)
    return (f"Review: {text}\nIs this review positive or negative?\nAnswer:",
            [" positive", " negative"], 0 if positive else 1)


def task_topic(rng: random.Random) -> Tuple[str, List[str], int]:
    topics = list(_TOPIC_WORDS)
    label = rng.randrange(len(topics))
    subject = rng.choice(_TOPIC_WORDS[topics[label]])
    name = rng.choice(_NAMES)
    text = rng.choice([f"{name} talked about {subject} all evening.",
                       f"Everyone in town was thinking about {subject}.",
                       f"{name} wrote a long letter about {subject}."])
    return (f"Sentence: {text}\nWhat is the topic? Options: {', '.join(topics)}.\nAnswer:",
            [f" {t}" for t in topics], label)


def task_copy(rng: random.Random) -> Tuple[str, List[str], int]:
    words = rng.sample(_WORDS, 2)
    return (f"Repeat the word {words[0]} once.\nAnswer:", [f" {w}" for w in words], 0)


def task_addition(rng: random.Random) -> Tuple[str, List[str], int]:
    a, b = rng.randrange(0, 50), rng.randrange(0, 50)
    wrong = a + b + rng.choice([-2, -1, 1, 2])
    if wrong < 0:
        wrong = a + b + 3
    return f"What is {a} plus {b}?\nAnswer:", [f" {a + b}", f" {wrong}"], 0


def task_contains(rng: random.Random) -> Tuple[str, List[str], int]:
    present, absent = rng.sample(_WORDS, 2)
    name = rng.choice(_NAMES)
    sentence = rng.choice([f"{name} found a {present} near the door.",
                           f"There was a {present} on the table.",
                           f"{name} drew a picture of a {present}."])
    choices = [present, absent]
    rng.shuffle(choices)
    return (f"Sentence: {sentence}\nWhich of these words appears in the sentence? Options: "
            f"{choices[0]}, {choices[1]}.\nAnswer:", [f" {c}" for c in choices], choices.index(present))


def task_animal_or_object(rng: random.Random) -> Tuple[str, List[str], int]:
    animal = rng.random() < 0.5
    word = rng.choice(_ANIMALS if animal else _OBJECTS)
    return (f"Is a {word} an animal or an object? Options: animal, object.\nAnswer:",
            [" animal", " object"], 0 if animal else 1)


def task_first_word(rng: random.Random) -> Tuple[str, List[str], int]:
    words = rng.sample(_WORDS, 3)
    choices = [words[0], words[2]]
    order = rng.random() < 0.5
    if not order:
        choices.reverse()
    return (f"Which word comes first in: {' '.join(words)}? Options: {choices[0]}, {choices[1]}."
            f"\nAnswer:", [f" {c}" for c in choices], choices.index(words[0]))


TASKS: Dict[str, Callable[[random.Random], Tuple[str, List[str], int]]] = {
    "sentiment": task_sentiment, "topic": task_topic, "copy": task_copy,
    "addition": task_addition, "contains": task_contains,
    "animal_or_object": task_animal_or_object, "first_word": task_first_word,
}


def _task_rng(seed: int, task: str, split: str) -> random.Random:
    return random.Random(f"{seed}:{task}:{split}")


def examples(task: str, n: int, seed: int, split: str) -> List[dict]:
    """``n`` examples of ``task`` ({"task", "inputs", "targets", "choices", "label"})."""
    rng = _task_rng(seed, task, split)
    out = []
    for _ in range(n):
        inputs, choices, label = TASKS[task](rng)
        out.append({"task": task, "inputs": inputs, "targets": choices[label], "choices": choices,
                    "label": label})
    return out


def pretrain_text(n: int, seed: int) -> List[str]:
    """Plain sentences of the same domain (reviews, topics, word lists, sums), no prompts."""
    rng = random.Random(f"{seed}:pretrain")
    lines = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(3, 6)):
            kind = rng.randrange(4)
            if kind == 0:
                parts.append(_review(rng, rng.random() < 0.5))
            elif kind == 1:
                topic = rng.choice(list(_TOPIC_WORDS))
                parts.append(f"{rng.choice(_NAMES)} likes {rng.choice(_TOPIC_WORDS[topic])}, "
                             f"which is about {topic}.")
            elif kind == 2:
                a, b = rng.randrange(50), rng.randrange(50)
                parts.append(f"{a} plus {b} is {a + b}.")
            else:
                parts.append(f"A {rng.choice(_ANIMALS)} is an animal and a {rng.choice(_OBJECTS)} "
                             f"is an object; the {rng.choice(_WORDS)} is nearby.")
        lines.append(" ".join(parts))
    return lines


def _write_jsonl(path: str, records: List[dict], keys=("task", "inputs", "targets")) -> None:
    atomic_write_text(path, "".join(json.dumps({k: r[k] for k in keys}, ensure_ascii=False) + "\n"
                                    for r in records))


def make_toy_multitask(output_dir: str, examples_per_task: int = 1500, seed: int = 1234,
                       preprocess: bool = False, valid_fraction: float = 0.1,
                       rank_eval_per_task: int = 100, pretrain_docs: int = 1500) -> Dict[str, str]:
    """Write the toy set; returns {name: path or dataset prefix}. Names: ``train_TASK``,
    ``valid_TASK``, ``heldout_TASK`` (jsonl, or the MTF prefix with ``preprocess``),
    ``rank_eval``, ``pretrain`` (jsonl, or the text dataset prefix with ``preprocess``)."""
    os.makedirs(output_dir, exist_ok=True)
    written: Dict[str, str] = {}
    n_valid = max(1, int(round(examples_per_task * valid_fraction)))
    for task in TRAIN_TASKS:
        written[f"train_{task}"] = os.path.join(output_dir, f"train_{task}.jsonl")
        _write_jsonl(written[f"train_{task}"], examples(task, examples_per_task, seed, "train"))
        written[f"valid_{task}"] = os.path.join(output_dir, f"valid_{task}.jsonl")
        _write_jsonl(written[f"valid_{task}"], examples(task, n_valid, seed, "valid"))
    for task in HELDOUT_TASKS:
        written[f"heldout_{task}"] = os.path.join(output_dir, f"heldout_{task}.jsonl")
        _write_jsonl(written[f"heldout_{task}"], examples(task, n_valid, seed, "heldout"))
    rank = [r for task in RANK_EVAL_TASKS for r in examples(task, rank_eval_per_task, seed, "rank")]
    written["rank_eval"] = os.path.join(output_dir, "rank_eval.jsonl")
    _write_jsonl(written["rank_eval"], rank, keys=("task", "inputs", "choices", "label"))
    written["pretrain"] = os.path.join(output_dir, "pretrain.jsonl")
    _write_jsonl(written["pretrain"], [{"text": t} for t in pretrain_text(pretrain_docs, seed)],
                 keys=("text",))
    manifest = {"seed": seed, "examples_per_task": examples_per_task, "train_tasks": TRAIN_TASKS,
                "heldout_tasks": HELDOUT_TASKS, "files": sorted(os.path.basename(p) for p in written.values())}
    with open(os.path.join(output_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    if preprocess:
        from megatron.data.preprocess import preprocess_jsonl  # lazy: numpy, only with --preprocess
        for name, path in list(written.items()):
            if name == "rank_eval":
                continue
            prefix = os.path.join(output_dir, name)
            keys = ("text",) if name == "pretrain" else ("inputs", "targets")
            preprocess_jsonl(path, prefix, keys, append_eod=True, log_interval=0)
            written[name] = prefix + ("_text_document" if name == "pretrain" else "")
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output-dir", default=os.path.join("data", "toy_mtf"))
    parser.add_argument("--examples-per-task", type=int, default=1500)
    parser.add_argument("--rank-eval-per-task", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--preprocess", action="store_true",
                        help="Also write byte-level indexed datasets (--append-eod).")
    args = parser.parse_args(argv)
    written = make_toy_multitask(args.output_dir, args.examples_per_task, args.seed,
                                 preprocess=args.preprocess,
                                 rank_eval_per_task=args.rank_eval_per_task)
    for name, path in sorted(written.items()):
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
