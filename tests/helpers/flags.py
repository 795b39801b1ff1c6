"""The tiny model and run flags the in-process tests parse (one definition; tests add or override
flags after them: a later flag wins).

``TINY_MODEL`` is the model shape alone; :func:`tiny_run_flags` a whole command line in a fixed
order (shape, sequence, batch, length, LR, data), each part left out with ``None``; ``TINY_RUN``
its defaults, the command line most flag tests start from."""
from typing import List, Optional

TINY_MODEL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4"]


def tiny_run_flags(*, num_layers: int = 2, hidden_size: int = 64, seq_length: int = 32,
                   micro_batch_size: int = 2, global_batch_size: Optional[int] = None,
                   train_iters: Optional[int] = 10, lr: Optional[str] = "1e-3",
                   data_path: Optional[str] = "some/prefix") -> List[str]:
    """``--num-layers --hidden-size --num-attention-heads 4 --seq-length --micro-batch-size
    [--global-batch-size] [--train-iters] [--lr] [--data-path]`` (the data path names no file:
    enough for parsing and validation)."""
    flags = ["--num-layers", str(num_layers), "--hidden-size", str(hidden_size),
             "--num-attention-heads", "4", "--seq-length", str(seq_length),
             "--micro-batch-size", str(micro_batch_size)]
    for flag, value in (("--global-batch-size", global_batch_size), ("--train-iters", train_iters),
                        ("--lr", lr), ("--data-path", data_path)):
        if value is not None:
            flags += [flag, str(value)]
    return flags


TINY_RUN = tiny_run_flags()
# the model and its batch, without a length, an LR or data: the schedule tests add their own
TINY_SCHEDULE = tiny_run_flags(seq_length=16, train_iters=None, lr=None, data_path=None)


def parse(extra: List[str], world_size: int = 1, extra_args_provider=None, base=TINY_RUN):
    """``validate_args`` of ``base + extra`` as the entry points parse them for ``world_size``
    ranks (an ArgumentError raises)."""
    from megatron.config.arguments import validate_args
    from megatron.config.parser import get_parser

    return validate_args(get_parser(extra_args_provider).parse_args(base + extra), world_size)


def one_error_line(argv: List[str], capsys, **kwargs) -> str:
    """``parse_args(argv)`` exits 2 with one line on stderr and no usage text; that line."""
    import pytest

    from megatron.config.parser import parse_args

    with pytest.raises(SystemExit) as info:
        parse_args(argv, world_size=1, **kwargs)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "usage:" not in err, err
    return err


def parsed(extra: List[str], extra_args_provider=None, base=None):
    """The parser's namespace of ``base + extra`` before validation (``base``: the tiny run
    without a data source), for the functions that read raw flags (the weighted split paths,
    before validation turns them into groups)."""
    from megatron.config.parser import get_parser

    base = tiny_run_flags(data_path=None) if base is None else base
    return get_parser(extra_args_provider, deepspeed_args=False).parse_args(base + extra)
