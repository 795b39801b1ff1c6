#!/usr/bin/env python
"""Which documents did the model see: one JSON line per global sample of training iterations
A to B (inclusive, numbered as in the training log), from the same index the loader uses.

    python tools/data_provenance.py [the training flags] --load CKPT --iterations A:B \
        --output FILE.jsonl [--coverage FILE.json] [--world-size N]

Each line is ``{"iteration", "global_sample", "dataset", "sample", "epoch", ["seq_length",
"tokens",] "documents": [[doc_id, first_token, last_token], ...]}`` (megatron/data/provenance.py says what each field
holds). Iterations up to the checkpoint's come from its data ledger (``data_mix.json``: every mix
the run was trained on, with the samples each dataset had given when it began), across edits and
resumes; iterations after it are those a resume with these flags would train (an edited mix
needs ``--override-data-mix`` here as in training). The flags are those of ``pretrain_gpt.py`` or
``finetune_t0.py`` (T0's ``--prefix-lm``, ``--norm-target-loss``... are accepted);
``--world-size`` is the run's number of ranks (batch-size checks only; the data order does not
depend on it). The file is written to a temporary name and renamed when complete; progress goes
to stderr.
"""
import os
import sys
import time
from typing import List, Optional, Tuple

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.path.pardir)))

from megatron.runtime.known_warnings import quiet_known_warnings  # noqa: E402

quiet_known_warnings()  # before megatron.core is imported

import json  # noqa: E402

from megatron.errors import ArgumentError, ConfigError  # noqa: E402
from megatron.runtime.process_exit import run_entry_point  # noqa: E402
from megatron.utils.atomic_io import atomic_path  # noqa: E402


def add_provenance_args(parser):
    """The tool's own flags, and the T0 flags of finetune_t0.py (so either entry point's command
    line is accepted)."""
    import finetune_t0  # lazy: torch, megatron-core, deepspeed

    finetune_t0.extra_args_provider(parser)
    # not the T0 entry point: its packed-samples default would make a GPT run's flags read as
    # T0's (a context stage's length change, refused for packed T0 data; the data builder still
    # refuses it for a T0 ledger)
    parser.set_defaults(packed_samples=False)
    g = parser.add_argument_group("data provenance")
    g.add_argument("--iterations", required=True, metavar="A:B",
                   help="Training iterations A to B, inclusive (1-based, as in the log).")
    g.add_argument("--output", required=True, metavar="FILE.jsonl", help="Where to write the lines.")
    g.add_argument("--coverage", default=None, metavar="FILE.json",
                   help="Also write what the iterations drew of each dataset's token stream, per "
                        "epoch (the ranges of input tokens, the samples per sequence length, any "
                        "range drawn twice), and print one line per dataset and epoch: with "
                        "--iterations 1:N, a finished epoch drawn once over a change of "
                        "--seq-length shows one contiguous range from 0.")
    g.add_argument("--world-size", type=int, default=1,
                   help="Ranks of the run (for the batch-size checks of its flags).")
    g.add_argument("--deepspeed", action="store_true", help="Accepted and ignored.")
    g.add_argument("--deepspeed_config", default=None, help="Checked against the batch flags.")
    return parser


def parse_iterations(text: str) -> Tuple[int, int]:
    """``"A:B"`` -> (A, B) with 1 <= A <= B; :class:`ArgumentError` naming ``--iterations``."""
    parts = text.split(":")
    try:
        first, last = (int(p) for p in parts) if len(parts) == 2 else (None, None)
    except ValueError:
        first = last = None
    if first is None or not 1 <= first <= last:
        raise ArgumentError(f"--iterations {text!r}: give A:B with 1 <= A <= B (training iterations, "
                            "1-based as in the log), e.g. 101:110")
    return first, last


def parse_provenance_args(argv: Optional[List[str]] = None):
    from megatron.config.arguments import validate_args  # lazy: numpy + the flag modules, only to parse
    from megatron.config.parser import get_parser  # lazy: numpy + the flag modules, only to parse

    parser = get_parser(add_provenance_args, deepspeed_args=False)
    args = parser.parse_args(argv)
    if not args.load:
        raise ArgumentError("--load CKPT is required: the checkpoint whose data ledger says what "
                            "the run drew")
    args.iteration_range = parse_iterations(args.iterations)
    return validate_args(args, world_size=args.world_size)


def training_mix_of(args):
    """The run's training mix with its data ledger, built as a resume with these flags would
    build it (megatron/data/mix_resume.py; with context stages in one run, at the stage that
    trained the checkpoint: iterations after the next stage's start are not traced from it)."""
    from megatron.config.tokenizer_flags import apply_tokenizer_setup  # lazy: megatron-core (seconds)
    from megatron.train.resume import data_resume  # lazy: megatron-core (seconds)

    apply_tokenizer_setup(args)
    resume = data_resume(args.run_config.checkpoint, args.run_config.loop.skip_train)
    if resume is None:
        raise ConfigError(f"--load {args.load}: no checkpoint there (no "
                          "latest_checkpointed_iteration.txt)")
    if resume.record is None:
        raise ConfigError(f"--load {args.load}: checkpoint of iteration {resume.iteration} has no "
                          "data_mix.json (written before checkpoints carried the data ledger)")
    if args.context_stages is not None:  # a run with context stages resumes at the checkpoint's
        from megatron.config.context_stages import stage_args  # lazy: as the imports above

        args = stage_args(args, args.context_stages.recorded_at(resume.iteration))
    if args.weighted_split_groups["train"] and resume.record.kind == "t0":
        from megatron.data.mtf_builder import build_mtf_data  # lazy: megatron-core, only for a T0 mix

        data = build_mtf_data(args.run_config.data, args.tokenizer, resume)
    else:
        from megatron.data.builder import build_pretraining_data  # lazy: megatron-core, only for a GPT mix

        data = build_pretraining_data(args.run_config.data, args.tokenizer, resume)
    if data.mix is None:
        raise ConfigError("these flags give no training data to trace")
    return data.mix


def main(argv: Optional[List[str]] = None) -> int:
    from megatron.data.provenance import (  # lazy: numpy (megatron.data), only in main
        coverage_lines,
        provenance_records,
        token_coverage,
    )

    start = time.perf_counter()
    args = parse_provenance_args(argv)
    first, last = args.iteration_range
    if last > args.train_iters:
        raise ArgumentError(f"--iterations {args.iterations}: the run has {args.train_iters} "
                            "iterations (--train-iters)")
    mix = training_mix_of(args)
    history = mix.history()
    written, every, current = 0, max(1, (last - first + 1) // 10), None
    kept = [] if args.coverage else None
    with atomic_path(args.output) as tmp, open(tmp, "w") as out:
        for record in provenance_records(history, first, last):
            out.write(json.dumps(record) + "\n")
            if kept is not None:
                kept.append({k: record[k] for k in ("dataset", "epoch", "seq_length", "tokens")
                             if k in record})
            written += 1
            if record["iteration"] != current:  # progress: about ten lines per call
                current = record["iteration"]
                if (current - first) % every == 0:
                    print(f"provenance: iteration {current} ({current - first}/{last - first + 1} "
                          "done)", file=sys.stderr)
    if kept is not None:
        coverage = token_coverage(kept)
        with atomic_path(args.coverage) as tmp, open(tmp, "w") as out:
            json.dump({name: {str(e): c for e, c in epochs.items()}
                       for name, epochs in coverage.items()}, out, indent=1)
        for line in coverage_lines(coverage):
            print(f"coverage: {line}", file=sys.stderr)
    print(f"provenance: {written} samples of iterations {first}..{last} written to {args.output} "
          f"in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return written


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    run_entry_point(main)
