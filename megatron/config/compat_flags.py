"""The "flags of other launch scripts" group: the parser side of megatron/config/flag_compat.py
(other projects' flags, as data). ``add_compat_args`` registers every flag of that table the
parser does not define itself, ``value_alias`` is the ``type=`` of the flags whose values other
projects spell differently, and ``refused_flags``/``inert_flags`` report the ones a command line
gave (refused: in the parse error; inert: in one start-up line)."""
import argparse
from typing import Callable, List

from megatron.config import flag_compat


def value_alias(flag: str) -> Callable[[str], str]:
    """argparse ``type=`` for ``flag``: another project's spelling of a value (listed in
    megatron/config/flag_compat.py VALUE_ALIASES, e.g. ``rotary``) becomes the value it means
    (``rope``), so ``choices`` are checked against the canonical values."""
    def value(text: str) -> str:
        return flag_compat.canonical_value(flag, text)

    return value


class _SwitchByValue(argparse.Action):
    """An alias that takes a value and sets a switch (``--glu-activation swiglu`` = ``--swiglu``);
    ``choices`` are the values it accepts."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, True)


# Aliases whose canonical value depends on other flags: parsed under their own name and resolved
# in validate_args (--use-distributed-optimizer is ZeRO stage 1 unless a stage >= 1 is given).
_ALIASES_RESOLVED_IN_VALIDATION = ("--use-distributed-optimizer",)


def add_compat_args(parser: argparse.ArgumentParser) -> None:
    """Register every flag of megatron/config/flag_compat.py that ``parser`` does not define itself.
    An alias writes its canonical flag's destination (so alias and canonical give equal args;
    an alias of a flag the parser lacks, e.g. ``--prefixlm`` without ``--prefix-lm``, is not
    registered); inert and refused flags are parsed under their own names, with their value,
    and reported after parsing (refused: in the error; inert: in one start-up line)."""
    g = parser.add_argument_group("flags of other launch scripts (docs/compatibility.md)")
    actions = parser._option_string_actions
    for c in flag_compat.COMPAT_FLAGS:
        if c.flag in actions:
            continue
        help_text = f"{c.status}: {c.note}" + (f" Use {c.use_instead}." if c.use_instead else "")
        if c.status != "alias" or c.flag in _ALIASES_RESOLVED_IN_VALIDATION:
            if c.takes_value:
                g.add_argument(c.flag, dest=c.dest, default=None, metavar="VALUE", help=help_text)
            else:
                g.add_argument(c.flag, dest=c.dest, action="store_true", help=help_text)
            continue
        canonical, _, value = c.use_instead.partition(" ")
        target = actions.get(canonical)
        if target is None:
            continue
        common = dict(dest=target.dest, default=argparse.SUPPRESS, help=f"alias of {c.use_instead}")
        if value:  # a switch standing for FLAG VALUE
            const = target.type(value) if callable(target.type) else value
            g.add_argument(c.flag, action="store_const", const=const, **common)
        elif c.accepted_values:  # a FLAG VALUE standing for a switch
            g.add_argument(c.flag, action=_SwitchByValue, choices=c.accepted_values, **common)
        elif target.nargs == 0:  # a switch standing for a switch
            g.add_argument(c.flag, action="store_const", const=target.const, **common)
        else:
            g.add_argument(c.flag, type=target.type, choices=target.choices, nargs=target.nargs,
                           metavar=target.metavar, **common)


def refused_flags(args) -> List[str]:
    """One message per refused flag of megatron/config/flag_compat.py on the command line (a value in
    its ``inert_values``, e.g. ``--ds-sequence-parallel-size 1``, is accepted)."""
    problems = []
    for c in flag_compat.COMPAT_FLAGS:
        if c.status != "refused" or c.dest not in args.given_flags:
            continue
        value = getattr(args, c.dest)
        if c.takes_value and value in c.inert_values:
            continue
        given = c.flag + (f" {value}" if c.takes_value else "")
        problems.append(f"{given} is not supported: {c.note}"
                        + (f" Use {c.use_instead} instead" if c.use_instead else " Drop the flag"))
    return problems


def inert_flags(args) -> List[str]:
    """The accepted-but-inert flags of megatron/config/flag_compat.py on the command line, as given
    (``--data-impl mmap``), in command-line order."""
    out = []
    for dest, flag in args.given_flags.items():
        c = flag_compat.compat_flag(flag)
        if c is None or c.status == "alias":
            continue
        value = getattr(args, dest)
        if c.status == "inert" or (c.takes_value and value in c.inert_values):
            out.append(flag + (f" {value}" if c.takes_value else ""))
    return out
