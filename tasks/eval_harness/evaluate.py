"""Evaluate a checkpoint with lm-evaluation-harness (0.4.x) on local task files.

    python tasks/eval_harness/evaluate.py [the model flags used in training] \
        --load CHECKPOINT_DIR [--load-iteration N] \
        --tasks my_tasks/copa_local.yaml,my_ppl_task [--include-path my_tasks] \
        [--num-fewshot K] [--limit N] [--eval-batch-size 16] [--max-gen-toks 256] \
        [--prefix-lm] [--bootstrap-iters 100000] --results-path results.json [--log-samples]

``--tasks`` is a comma-separated list of lm-eval task YAML files and names of tasks (or groups,
or tags) defined by the YAML files under the ``--include-path`` directories. Nothing is
downloaded: ``HF_DATASETS_OFFLINE`` and ``HF_HUB_OFFLINE`` are set, so a task reads local data
(e.g. ``dataset_path: json`` with ``dataset_kwargs: {data_files: {test: /abs/path.jsonl}}``).
``--include-default-tasks`` also offers lm-eval's own task library (its datasets must already be in
the local Hugging Face cache).

The model is built from the model flags (or ``--use-checkpoint-args``) and loaded from
``--load``, a checkpoint of any parallel layout (tasks/checkpoint_model.py: the full TP=1/PP=1
weights, one process); any ``--tokenizer-type`` works. It is
scored by :class:`tasks.eval_harness.lm.MegatronLM` (``--seq-length`` tokens per forward,
``--prefix-lm`` for non-causal decoders) through ``lm_eval.simple_evaluate``, with lm-eval's
default seeds. The results (lm-eval's dict, without per-sample logs) are printed as lm-eval's
table and written to ``--results-path`` as JSON; ``--log-samples`` also writes each task's
per-document records (prompts, responses, metrics) beside it as ``RESULTS_samples_TASK.jsonl``.
"""
import argparse
import json
import os
import sys
from typing import Dict, List, Optional, Sequence

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.path.pardir, os.path.pardir))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# Local task files only: never reach the Hugging Face Hub (read by `datasets` when imported).
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"

from megatron.runtime.known_warnings import quiet_known_warnings  # noqa: E402

quiet_known_warnings()  # before megatron.core is imported

from megatron.errors import ConfigError  # noqa: E402
from megatron.runtime.process_exit import run_entry_point  # noqa: E402
from megatron.utils.atomic_io import atomic_write_text  # noqa: E402

TASK_FILE_SUFFIXES = (".yaml", ".yml")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be a positive integer")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be a non-negative integer")
    return value


def _limit(text: str) -> float:
    """lm-eval's ``limit``: N documents per task (N >= 1) or a fraction of them (0 < N < 1)."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} must be a document count >= 1 or a fraction "
                                         "in (0, 1)")
    return int(value) if value >= 1 and value == int(value) else value


def extra_args_provider(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The evaluation flags (BigScience's underscore spellings accepted as aliases)."""
    g = parser.add_argument_group("lm-eval harness")
    g.add_argument("--tasks", "--task-list", "--task_list", dest="tasks", required=True,
                   help="Comma-separated lm-eval task YAML files and task/group/tag names "
                        "defined under --include-path.")
    g.add_argument("--include-path", nargs="+", default=[],
                   help="Directories whose lm-eval task YAML files define task names.")
    g.add_argument("--include-default-tasks", action="store_true",
                   help="Also offer lm-eval's own task library (datasets must be in the local "
                        "Hugging Face cache: nothing is downloaded).")
    g.add_argument("--results-path", "--results_path", dest="results_path", default=None,
                   help="Write lm-eval's results JSON here.")
    g.add_argument("--log-samples", "--log_samples", dest="log_samples", action="store_true",
                   help="Also write each task's per-document records (prompts, model responses, "
                        "metrics) as JSON lines beside --results-path: "
                        "RESULTS_samples_TASK.jsonl.")
    g.add_argument("--num-fewshot", type=_non_negative_int, default=None,
                   help="Few-shot examples per prompt (default: each task's own, else 0).")
    g.add_argument("--limit", type=_limit, default=None,
                   help="Evaluate only the first N documents of each task (a fraction if < 1).")
    g.add_argument("--bootstrap-iters", "--bootstrap_iters", dest="bootstrap_iters",
                   type=_non_negative_int, default=100000,
                   help="Bootstrap resamples for the standard errors of lm-eval's metrics "
                        "(0: none).")
    g.add_argument("--eval-batch-size", type=_positive_int, default=16,
                   help="Requests (or rolling windows, or generated sequences) per forward.")
    g.add_argument("--max-gen-toks", type=_positive_int, default=256,
                   help="Generated tokens per request when the task gives no max_gen_toks.")
    if "--load-iteration" not in parser._option_string_actions:
        g.add_argument("--load-iteration", type=_non_negative_int, default=None,
                       help="Checkpoint iteration (default: the tracker file's).")
    if "--prefix-lm" not in parser._option_string_actions:
        g.add_argument("--prefix-lm", action="store_true",
                       help="Score with bidirectional attention over the context "
                            "(a non-causal decoder finetuned with --prefix-lm).")
    # Not a flag: scored batches carry segment_ids (padding), which --attention-backend considers.
    parser.set_defaults(packed_samples=True)
    return parser


def parse_eval_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The shared parser's flags (model, tokenizer, checkpoint) plus the evaluation flags."""
    from megatron.config.parser import parse_args  # lazy: numpy + the flag modules, only to parse
    from megatron.config.tokenizer_flags import apply_tokenizer_setup  # lazy: megatron-core (seconds)
    from tasks.checkpoint_model import one_process_argv  # lazy: torch (~1 s), only to parse
    from tasks.zero_shot_rank_classification import _DEFAULTS  # lazy: megatron-core (seconds)

    # one process: a training command line's expert-parallel size becomes 1
    argv = one_process_argv(sys.argv[1:] if argv is None else argv)
    args = parse_args(_DEFAULTS + argv, extra_args_provider=extra_args_provider, world_size=1,
                      require_data=False)
    apply_tokenizer_setup(args)  # the tokenizer and the embedding rows it needs
    return args


def resolve_tasks(tasks: str, include_path: Sequence[str] = (), include_defaults: bool = False):
    """``(lm_eval TaskManager, [task spec])`` for ``--tasks``: each item must be an existing task
    YAML file or a name the ``--include-path`` YAML files (or lm-eval's library with
    ``include_defaults``) define; anything else is a ConfigError naming the item."""
    from pathlib import Path

    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._index import TaskIndex

    for directory in include_path:
        if not os.path.isdir(directory):
            raise ConfigError(f"--include-path {directory}: no such directory")
    manager = TaskManager(include_path=list(include_path) or None,
                          include_defaults=include_defaults)
    specs = [t.strip() for t in tasks.split(",") if t.strip()]
    if not specs:
        raise ConfigError(f"--tasks {tasks!r}: no task given")
    for spec in specs:
        if spec in manager.all_tasks:
            continue
        if spec.endswith(TASK_FILE_SUFFIXES) or os.sep in spec:
            if not os.path.isfile(spec):
                raise ConfigError(f"--tasks {spec}: no such task file")
            try:
                entry = TaskIndex.entry_from_path(Path(spec))
            except Exception as e:  # YAML syntax, unknown shape
                raise ConfigError(f"--tasks {spec}: not an lm-eval task file: {e}") from None
            if entry is None:
                raise ConfigError(f"--tasks {spec}: not an lm-eval task file (no 'task' or "
                                  "'group' key)")
            continue
        where = ", ".join(include_path) if include_path else "no --include-path given"
        known = [n for n in manager.all_tasks][:20]
        raise ConfigError(
            f"--tasks {spec}: neither a task YAML file nor a task defined under --include-path "
            f"({where}{'; lm-eval library included' if include_defaults else ''}); known "
            f"names: {', '.join(known) if known else 'none'}")
    return manager, specs


def load_model(args):
    """The model of the flags with the weights of the ``--load`` checkpoint (any layout), in
    eval mode (tasks/checkpoint_model.py). A missing or unfitting checkpoint is a ConfigError
    naming ``--load``."""
    from tasks.checkpoint_model import build_model  # lazy: torch, megatron-core, deepspeed

    if not args.load:
        raise ConfigError("--load is required: the checkpoint directory (or model-states file) "
                          "to evaluate")
    return build_model(args)


def build_lm(args, model):
    """:class:`MegatronLM` over ``model`` with the evaluation flags of ``args``."""
    from tasks.eval_harness.lm import MegatronLM  # lazy: lm_eval + megatron-core (seconds)

    info = {"load": args.load, "load_iteration": args.load_iteration,
            "tokenizer_type": args.tokenizer_type, "num_layers": args.num_layers,
            "hidden_size": args.hidden_size}
    return MegatronLM(model, args.tokenizer, args.seq_length, batch_size=args.eval_batch_size,
                      max_gen_toks=args.max_gen_toks, prefix_lm=args.prefix_lm, model_info=info)


def evaluate(lm, task_manager, specs: List[str], num_fewshot: Optional[int] = None,
             limit=None, bootstrap_iters: int = 100000, log_samples: bool = False) -> Dict:
    """lm-eval's results dict for ``specs`` (``lm_eval.simple_evaluate``)."""
    from lm_eval import simple_evaluate

    return simple_evaluate(model=lm, tasks=list(specs), num_fewshot=num_fewshot, limit=limit,
                           bootstrap_iters=bootstrap_iters, task_manager=task_manager,
                           log_samples=log_samples, batch_size=lm.batch_size)


def samples_path(results_path: str, task: str) -> str:
    """Where ``--log-samples`` writes ``task``'s records: ``RESULTS_samples_TASK.jsonl`` beside
    ``--results-path`` (its ``.json`` suffix dropped)."""
    stem = results_path[:-len(".json")] if results_path.endswith(".json") else results_path
    return f"{stem}_samples_{task}.jsonl"


def write_results(results: Dict, path: str) -> List[str]:
    """Write ``results`` (without per-sample logs) as JSON and, when ``results`` holds
    ``samples``, each task's records as JSON lines (:func:`samples_path`), all atomically;
    returns the files written."""
    from lm_eval.utils import handle_non_serializable

    data = {k: v for k, v in results.items() if k != "samples"}
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    atomic_write_text(path, json.dumps(data, indent=2, default=handle_non_serializable) + "\n")
    written = [path]
    for task, records in (results.get("samples") or {}).items():
        target = samples_path(path, task)
        atomic_write_text(target, "".join(json.dumps(r, default=handle_non_serializable) + "\n"
                                          for r in records))
        written.append(target)
    return written


def main(argv: Optional[Sequence[str]] = None) -> Dict:
    """Parse the flags, check the tasks and the checkpoint, evaluate, print and write results."""
    args = parse_eval_args(argv)
    if args.log_samples and not args.results_path:
        raise ConfigError("--log-samples writes beside --results-path; give --results-path FILE")
    manager, specs = resolve_tasks(args.tasks, args.include_path, args.include_default_tasks)
    model = load_model(args)
    lm = build_lm(args, model)
    results = evaluate(lm, manager, specs, num_fewshot=args.num_fewshot, limit=args.limit,
                       bootstrap_iters=args.bootstrap_iters, log_samples=args.log_samples)
    from lm_eval.utils import make_table

    print(make_table(results))
    if results.get("groups"):
        print(make_table(results, "groups"))
    if args.results_path:
        for path in write_results(results, args.results_path):
            print(f"written: {path}")
    return results


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    run_entry_point(main)
