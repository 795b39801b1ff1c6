"""The command-line parser: ``get_parser`` builds one ``argparse`` parser with Megatron-LM flag
names from the flag groups (megatron/config/*_flags.py, in their ``--help`` order), whose errors
are one line naming every unknown flag and bad value; ``parse_args`` parses and validates
(megatron/config/arguments.py ``validate_args``)."""
import argparse
import os
from typing import Callable, List, Optional

from megatron.config.arguments import validate_args
from megatron.config.bloom_flags import add_bloom_model_args
from megatron.config.checkpoint_flags import add_checkpoint_args
from megatron.config.compat_flags import add_compat_args, refused_flags
from megatron.config.data_flags import add_data_args
from megatron.config.eval_flags import add_eval_args
from megatron.config.logging_flags import add_logging_args
from megatron.config.lr_flags import add_lr_args
from megatron.config.model_flags import add_model_args
from megatron.config.moe_flags import add_moe_args
from megatron.config.parallel_flags import add_parallel_args
from megatron.config.run_control_flags import add_run_control_args
from megatron.config.seqlen_flags import add_seqlen_args
from megatron.config.skip_step_flags import add_skip_step_args
from megatron.config.tokenizer_flags import add_tokenizer_args
from megatron.config.train_flags import add_training_args
from megatron.errors import EXIT_FLAG_ERROR, ArgumentError, exit_with_error


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (``error: MESSAGE (see PROG --help)``, exit
    status 2, no usage block) and that reports every unknown flag and every bad value of one
    command line together instead of stopping at the first."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._bad_values: List[str] = []
        self._given: dict = {}

    def _get_values(self, action, arg_strings):
        if action.option_strings:  # the flag is on the command line
            self._given[action.dest] = action.option_strings[0]
        return super()._get_values(action, arg_strings)

    def parse_known_args(self, args=None, namespace=None):
        """argparse's, plus ``namespace.given_flags``: ``{dest: flag}`` for every flag on the
        command line (as registered: an alias under its own name), in command-line order, so
        validation can tell a value given from a default."""
        self._given = {}
        namespace, unknown = super().parse_known_args(args, namespace)
        namespace.given_flags = dict(self._given)
        return namespace, unknown

    def _get_value(self, action, arg_string):
        try:
            return super()._get_value(action, arg_string)
        except argparse.ArgumentError as e:  # e.g. "argument --lr: invalid float value: 'x'"
            self._bad_values.append(str(e))
            return None

    def _check_value(self, action, value):
        if value is None and self._bad_values:  # its conversion failed; reported already
            return
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as e:  # "argument --x: invalid choice: ..."
            self._bad_values.append(str(e))

    def parse_args(self, args=None, namespace=None):
        namespace, problems, _ = self.parse_collecting(args, namespace)
        if problems:
            self._fail(problems)
        return namespace

    def parse_collecting(self, args=None, namespace=None):
        """Parse without exiting on unknown flags, bad values or refused flags: returns
        ``(namespace, problems, values_ok)``, ``values_ok`` False when a value did not convert
        (its destination then holds None)."""
        self._bad_values = []
        namespace, unknown = self.parse_known_args(args, namespace)
        problems = ([f"unrecognized arguments: {' '.join(unknown)}"] if unknown else []) \
            + self._bad_values + refused_flags(namespace)
        return namespace, problems, not self._bad_values

    def error(self, message):
        """argparse's own errors (missing value, missing required flag), with the bad values
        collected before it."""
        self._fail(self._bad_values + [message])

    def _fail(self, problems: List[str]):
        exit_with_error(f"{'; '.join(problems)} (see {self.prog} --help)", EXIT_FLAG_ERROR)


def get_parser(extra_args_provider: Optional[Callable] = None,
               deepspeed_args: bool = True) -> argparse.ArgumentParser:
    """The full parser; ``extra_args_provider(parser)`` adds a script's own flags.
    ``deepspeed_args=False`` leaves out DeepSpeed's flags (and its slow import) for tools that
    build no engine; such a tool must define ``--deepspeed_config`` itself."""
    parser = _Parser(
        description="Megatron-DeepSpeed GPT training", allow_abbrev=False,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for add in (add_model_args, add_training_args, add_lr_args, add_data_args,
                add_tokenizer_args, add_checkpoint_args, add_logging_args, add_parallel_args,
                add_run_control_args, add_bloom_model_args, add_skip_step_args, add_moe_args,
                add_seqlen_args, add_eval_args):
        add(parser)
    if extra_args_provider is not None:
        parser = extra_args_provider(parser) or parser
    if deepspeed_args:
        import deepspeed

        parser = deepspeed.add_config_arguments(parser)
    add_compat_args(parser)
    return parser


def parse_args(argv: Optional[List[str]] = None, extra_args_provider: Optional[Callable] = None,
               world_size: Optional[int] = None, require_data: bool = True) -> argparse.Namespace:
    """Parse ``argv`` (default ``sys.argv``) and validate for ``world_size`` ranks
    (default ``$WORLD_SIZE`` or 1). Bad flags exit with status 2 and one line naming all of
    them (megatron.errors.exit_with_error)."""
    import sys

    from megatron.config.checkpoint_args import apply_checkpoint_args  # lazy: torch (~1 s); --help needs none

    parser = get_parser(extra_args_provider)
    args, problems, values_ok = parser.parse_collecting(argv)
    if world_size is None:
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if values_ok:  # every value converted: validation adds its problems to the same one line
        try:
            apply_checkpoint_args(args, parser, sys.argv[1:] if argv is None else list(argv))
            validate_args(args, world_size, require_data)
        except ArgumentError as e:
            problems.append(str(e))
    if problems:
        parser._fail(problems)
    return args
