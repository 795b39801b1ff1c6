"""Command-line arguments: ``validate_args``, the ordered table of the flag groups' checks.

Flags keep Megatron-LM's (and the BigScience Megatron-DeepSpeed fork's) names and meanings; each flag
group and its checks is a module of megatron/config (``*_flags.py``, the DeepSpeed JSON's in
deepspeed_config.py), and the parser that registers them is megatron/config/parser.py.
``validate_args`` fills derived values (data-parallel size, ffn size, the iterations of a
``--train-samples`` run, the attention backend, megatron-core's ``TransformerConfig`` ...) and
rejects impossible combinations with an :class:`ArgumentError` that names the flags and values. It
is the last writer of ``args``: only the entry points add the tokenizer and its embedding rows
(megatron/config/tokenizer_flags.py ``apply_tokenizer_setup``), which need the tokenizer's files.
"""
import argparse
import copy
from typing import List

from megatron.config.bloom_flags import validate_bloom_model
from megatron.config.compat_flags import inert_flags
from megatron.config.context_extension import validate_context_extension
from megatron.config.context_stages import validate_context_stages
from megatron.config.data_flags import validate_data
from megatron.config.deepspeed_config import validate_deepspeed_config, validate_deepspeed_json
from megatron.config.eval_flags import validate_eval
from megatron.config.logging_flags import validate_logging
from megatron.config.lr_flags import read_schedule_file, validate_lr_units
from megatron.config.model_flags import build_transformer_config, resolve_attention_backend, validate_model
from megatron.config.moe_flags import validate_moe_args
from megatron.config.parallel_flags import validate_layout, validate_pipe_accumulation
from megatron.config.run_control_flags import validate_run_control
from megatron.config.seqlen_flags import validate_seq_length_curriculum
from megatron.config.skip_step_flags import validate_skip_step_args
from megatron.config.tokenizer_flags import validate_tokenizer
from megatron.config.train_flags import derive_train_iters, validate_batch, validate_training
from megatron.errors import ArgumentError


def _require(args, *names: str) -> None:
    missing = [n for n in names if getattr(args, n) is None]
    if missing:
        flags = ", ".join("--" + n.replace("_", "-") for n in missing)
        raise ArgumentError(f"missing required flag(s): {flags}")


def validate_args(args: argparse.Namespace, world_size: int = 1,
                  require_data: bool = True) -> argparse.Namespace:
    """Check flag combinations for ``world_size`` ranks, fill derived values in place and, last,
    build the run's typed configs (``args.run_config``, megatron/config/run_config.py) with the
    start-up notes the checks returned. ``require_data=False`` lets tools that build no dataset
    (schedule previews) skip data flags."""
    _require(args, "num_layers", "hidden_size", "num_attention_heads", "seq_length", "micro_batch_size")
    # Every check whose inputs are valid runs, so one error names all problems of a command line;
    # a check is skipped when one it builds on (derived values) failed.
    if not hasattr(args, "given_flags"):  # a namespace not from get_parser(): nothing "given"
        args.given_flags = {}
    # the flags as given, before any check fills a value: each context stage of the schedule
    # file is this command line with the stage's values (megatron/config/context_stages.py)
    raw = (copy.deepcopy(vars(args)) if getattr(args, "lr_schedule_config", None) is not None
           and getattr(args, "context_stage_index", None) is None else None)
    args.seq_length_plan = None  # the sequence-length curriculum's, once its check ran
    notes: List[str] = []  # start-up lines the checks hand back (printed once the run starts)
    checks = (("deepspeed json", (), lambda: validate_deepspeed_json(args, notes)),
              ("batch", ("deepspeed json",), lambda: validate_batch(args, world_size, notes)),
              ("model", (), lambda: validate_model(args, notes)),
              ("training", (), lambda: validate_training(args, notes)),
              ("skip step", (), lambda: validate_skip_step_args(args, notes)),
              ("schedule file", (), lambda: read_schedule_file(args)),
              ("seq length", ("deepspeed json", "batch", "training", "schedule file"),
               lambda: validate_seq_length_curriculum(args, notes)),
              ("run control", ("batch", "training", "seq length"), lambda: validate_run_control(args)),
              ("lr", ("batch", "training", "run control", "schedule file"),
               lambda: validate_lr_units(args)),
              ("data", (), lambda: validate_data(args, require_data)),
              ("tokenizer", (), lambda: validate_tokenizer(args)),
              ("deepspeed", ("batch", "training"), lambda: validate_deepspeed_config(args, notes)),
              ("layout", ("batch", "model", "deepspeed"), lambda: validate_layout(args)),
              ("BLOOM model", ("batch",), lambda: validate_bloom_model(args)),
              ("pipe accumulation", ("batch", "layout"),
               lambda: validate_pipe_accumulation(args)),
              ("logging", (), lambda: validate_logging(args, notes)),
              ("evaluation by position", (), lambda: validate_eval(args, notes)),
              # after the flags they read (bf16/fp16 may come from --deepspeed_config)
              ("attention", ("model", "deepspeed"), lambda: resolve_attention_backend(args)),
              ("moe", ("batch", "model", "layout"), lambda: validate_moe_args(args, notes)),
              ("transformer config", ("model", "layout", "deepspeed", "moe"),
               lambda: build_transformer_config(args)),
              ("train iters", ("batch", "training", "run control", "lr"),
               lambda: derive_train_iters(args)),
              ("context stages", ("batch", "model", "training", "schedule file", "seq length",
                                  "run control", "lr", "data", "layout", "train iters"),
               lambda: validate_context_stages(args, raw, world_size, require_data,
                                               validate_args, notes)),
              ("context extension", ("batch", "model", "run control", "context stages"),
               lambda: validate_context_extension(args, notes, require_data)))
    failed, errors = set(), []
    for name, needs, check in checks:
        if failed.intersection(needs):
            failed.add(name)
            continue
        try:
            check()
        except ArgumentError as e:
            failed.add(name)
            errors.append(str(e))
    if errors:
        raise ArgumentError("; ".join(errors))
    inert = inert_flags(args)
    if inert:
        notes.append(f"accepted without effect here (docs/compatibility.md): "
                     f"{', '.join(inert)}")
    from megatron.config.run_config import run_config_from_args  # lazy: torch + megatron-core (seconds); not --help

    args.run_config = run_config_from_args(args, notes)
    return args
