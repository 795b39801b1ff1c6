"""Zero-shot rank classification (T0 evaluation): score every answer choice by its log-likelihood
as the target of the prompt, pick the best, report accuracy per task.

    python tasks/zero_shot_rank_classification.py [the model flags used in training] \
        --load CHECKPOINT_DIR --task-data eval.jsonl [--prefix-lm] [--append-eod] \
        [--length-normalize] [--eval-batch-size 32] [--output-json results.json]

``--task-data`` is JSON lines ``{"task": NAME, "inputs": TEXT, "choices": [TEXT, ...], "label": INDEX}``.
Each (inputs, choice) pair is tokenized as preprocessing tokenized (inputs, targets) pairs
(``--append-eod`` when the training data was preprocessed with it) and laid out as one packed
segment exactly as ``megatron/data/mtf_dataset.py`` does (same truncation, same attention mask, so
``--prefix-lm`` models are scored with bidirectional attention over the inputs). The score of a
choice is the sum of its target tokens' log-probabilities (T0's rank classification), or their mean
with ``--length-normalize``. ``--output-json`` also writes every example's ``choice_scores`` (one
score per choice, in the choices' order) and ``predictions``, in the order of ``--task-data``.

Weights come from a checkpoint saved by training (tasks/checkpoint_model.py): ``--load DIR``
reads the iteration in ``DIR/latest_checkpointed_iteration.txt`` (or ``--load-iteration N``) of any
tensor/pipeline/data-parallel layout as full TP=1/PP=1 weights; ``--load`` may also name a TP=1/PP=1
``iter_N/mp_rank_00_model_states.pt`` file directly.
"""
import argparse
import json
import os
import sys
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.path.pardir)))

from megatron.runtime.known_warnings import quiet_known_warnings  # noqa: E402

quiet_known_warnings()  # before megatron.core is imported

import numpy as np  # noqa: E402
import torch  # noqa: E402

from megatron.config.parser import parse_args  # noqa: E402
from megatron.config.tokenizer_flags import apply_tokenizer_setup  # noqa: E402
from megatron.data.device_transfer import batch_to_device  # noqa: E402
from megatron.data.mtf_dataset import pack_sample, truncated_lengths  # noqa: E402
from megatron.model.masks import attention_structure_from_batch, collate_with_segment_layout  # noqa: E402

# the model and its checkpoint (any layout); re-exported as this script's Python API
from tasks.checkpoint_model import build_model, one_process_argv  # noqa: E402


def extra_args_provider(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    g = parser.add_argument_group("zero-shot rank classification")
    g.add_argument("--task-data", required=True, help="JSON lines with task, inputs, choices, label.")
    if "--prefix-lm" not in parser._option_string_actions:
        g.add_argument("--prefix-lm", action="store_true",
                       help="Score with bidirectional attention over the inputs (non-causal decoder).")
    g.add_argument("--append-eod", action="store_true",
                   help="Append the end-of-document token to inputs and choices, as "
                        "tools/preprocess_data.py --append-eod did.")
    g.add_argument("--length-normalize", action="store_true",
                   help="Mean instead of sum of the choice's token log-probabilities.")
    g.add_argument("--eval-batch-size", type=int, default=32, help="Scored pairs per forward.")
    g.add_argument("--load-iteration", type=int, default=None,
                   help="Checkpoint iteration (default: the tracker file's).")
    g.add_argument("--output-json", default=None, help="Write the results here as JSON.")
    # Not a flag: scored batches carry segment_ids (padding), which --attention-backend considers.
    parser.set_defaults(packed_samples=True)
    return parser


# Training-only flags the shared parser requires; irrelevant for scoring.
_DEFAULTS = ["--micro-batch-size", "1", "--train-iters", "1", "--lr", "0"]


def parse_eval_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    # one process: a training command line's expert-parallel size becomes 1
    argv = one_process_argv(sys.argv[1:] if argv is None else argv)
    args = parse_args(_DEFAULTS + argv, extra_args_provider=extra_args_provider, world_size=1,
                      require_data=False)
    apply_tokenizer_setup(args)  # the tokenizer and the embedding rows it needs
    return args


def _encode(tokenizer, text: str, append_eod: bool) -> List[int]:
    ids = list(tokenizer.tokenize(text))
    if append_eod:
        ids.append(tokenizer.eod)
    return ids


@torch.no_grad()
def score_pairs(model, pairs: Sequence, seq_length: int, pad_id: int, prefix_lm: bool = False,
                length_normalize: bool = False, batch_size: int = 32) -> np.ndarray:
    """Log-likelihood of each (input ids, target ids) pair's target given its input (sum over
    target tokens, or mean with ``length_normalize``)."""
    scores = np.zeros(len(pairs), dtype=np.float64)
    device = next(model.parameters()).device
    for lo in range(0, len(pairs), batch_size):
        chunk = []
        for inp, tgt in pairs[lo:lo + batch_size]:
            keep_in, keep_tg = truncated_lengths(len(inp), len(tgt), seq_length)
            chunk.append((np.asarray(inp[len(inp) - keep_in:], np.int64),
                          np.asarray(tgt[:keep_tg], np.int64)))
        length = max(len(i) + len(t) for i, t in chunk)
        samples = [pack_sample([p], length, pad_id, prefix_lm=prefix_lm) for p in chunk]
        # the segment layout is worked out on the host, then the batch moves in one copy
        batch = batch_to_device(collate_with_segment_layout(samples), device)
        logits = model(batch["tokens"], batch["position_ids"], None,
                       packed_seq_params=attention_structure_from_batch(batch))
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        token_lp = logprobs.gather(-1, batch["labels"].unsqueeze(-1)).squeeze(-1)
        weight = (batch["loss_mask"] > 0).to(token_lp.dtype)
        total = (token_lp * weight).sum(dim=1)
        if length_normalize:
            total = total / weight.sum(dim=1).clamp(min=1)
        scores[lo:lo + len(chunk)] = total.double().cpu().numpy()
    return scores


def evaluate_records(model, tokenizer, records: Sequence[Dict], seq_length: int,
                     prefix_lm: bool = False, append_eod: bool = False,
                     length_normalize: bool = False, batch_size: int = 32) -> Dict:
    """Rank-classify ``records``; returns {"tasks": {task: {"accuracy", "correct", "total",
    "chance"}}, "accuracy": mean over tasks, "predictions": [index per record],
    "choice_scores": [[score per choice, in the choices' order] per record]} (a score is the
    choice's summed target log-probability in nats, or its mean with ``length_normalize``)."""
    pad_id = getattr(tokenizer, "pad", tokenizer.eod)
    pairs, owners = [], []
    for r_i, record in enumerate(records):
        inp = _encode(tokenizer, record["inputs"], append_eod)
        for choice in record["choices"]:
            pairs.append((inp, _encode(tokenizer, choice, append_eod)))
            owners.append(r_i)
    scores = score_pairs(model, pairs, seq_length, pad_id, prefix_lm, length_normalize, batch_size)
    predictions, choice_scores, pos = [], [], 0
    tasks: Dict[str, Dict] = OrderedDict()
    for record in records:
        n = len(record["choices"])
        pred = int(np.argmax(scores[pos:pos + n]))
        choice_scores.append([float(x) for x in scores[pos:pos + n]])
        pos += n
        predictions.append(pred)
        t = tasks.setdefault(record["task"], {"correct": 0, "total": 0, "chance": 0.0})
        t["correct"] += int(pred == int(record["label"]))
        t["total"] += 1
        t["chance"] += 1.0 / n
    for t in tasks.values():
        t["accuracy"] = t["correct"] / t["total"]
        t["chance"] = t["chance"] / t["total"]
    mean = float(np.mean([t["accuracy"] for t in tasks.values()])) if tasks else 0.0
    return {"tasks": tasks, "accuracy": mean, "predictions": predictions,
            "choice_scores": choice_scores}


def read_records(path: str) -> List[Dict]:
    """The ``--task-data`` records; ValueError naming the line for a malformed one."""
    records = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            r = json.loads(line)
            if not all(k in r for k in ("task", "inputs", "choices", "label")) or \
                    not r["choices"] or not 0 <= int(r["label"]) < len(r["choices"]):
                raise ValueError(f"{path} line {line_no}: need task, inputs, non-empty choices and "
                                 "a label indexing them")
            records.append(r)
    return records


def main(argv=None) -> Dict:
    args = parse_eval_args(argv)
    model = build_model(args)
    records = read_records(args.task_data)
    results = evaluate_records(model, args.tokenizer, records, args.seq_length,
                               prefix_lm=args.prefix_lm, append_eod=args.append_eod,
                               length_normalize=args.length_normalize,
                               batch_size=args.eval_batch_size)
    for task, t in results["tasks"].items():
        print(f"{task}: accuracy {t['accuracy']:.4f} ({t['correct']}/{t['total']}, chance "
              f"{t['chance']:.4f})")
    print(f"mean accuracy over {len(results['tasks'])} tasks: {results['accuracy']:.4f}")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    from megatron.runtime.process_exit import run_entry_point

    run_entry_point(main)  # a bad checkpoint or file: one "error: ..." line, exit 1
