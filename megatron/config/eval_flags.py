"""The "evaluation by position" flag group (each validation group's loss per range of token
positions, megatron/metrics/position_buckets.py) and its check, which derives
``args.eval_position_bounds``: the bucket bounds from 0 to ``--seq-length`` (None: no buckets).
The evaluation's intervals and iterations (``--eval-interval``, ``--eval-iters``) are "training"
flags (megatron/config/train_flags.py)."""
import argparse
from typing import List

from megatron.errors import ArgumentError
from megatron.metrics.position_buckets import BASES

MAX_POSITION_BUCKETS = 256  # records per group and evaluation stay readable


def add_eval_args(parser: argparse.ArgumentParser) -> None:
    """The "evaluation by position" flag group."""
    g = parser.add_argument_group("evaluation by position")
    g.add_argument("--eval-position-buckets", type=int, default=None, metavar="WIDTH",
                   help="Also log each validation/test group's loss per range of WIDTH token "
                        "positions: [0, WIDTH), [WIDTH, 2 WIDTH), ... up to --seq-length (the last "
                        "range may be shorter), as GROUP/lm_loss_pos_LO_HI. For a context "
                        "extension, WIDTH = the previous --seq-length. docs/logging.md.")
    g.add_argument("--eval-position-bucket-edges", type=int, nargs="+", default=None,
                   metavar="EDGE",
                   help="The same with explicit ranges: increasing edges between 0 and "
                        "--seq-length, e.g. '64 256' gives [0, 64), [64, 256), [256, seq-length).")
    g.add_argument("--eval-position-bucket-basis", default="context", choices=BASES,
                   help="How a token's position is counted: 'context' (default) within its "
                        "document when documents are masked from each other "
                        "(--reset-attention-mask, packed T0 samples), else within the sequence; "
                        "'sequence' always within the sequence.")


def validate_eval(args, notes: List[str]) -> None:
    """``args.eval_position_bounds``: ``(0, e1, ..., seq_length)`` of ``--eval-position-buckets``
    or ``--eval-position-bucket-edges`` (tokens), or None without either."""
    width, edges, seq = args.eval_position_buckets, args.eval_position_bucket_edges, args.seq_length
    args.eval_position_bounds = None
    if width is None and edges is None:
        if "eval_position_bucket_basis" in args.given_flags:
            raise ArgumentError(f"--eval-position-bucket-basis {args.eval_position_bucket_basis} "
                                "needs --eval-position-buckets or --eval-position-bucket-edges")
        return
    if width is not None and edges is not None:
        raise ArgumentError(f"--eval-position-buckets {width} and --eval-position-bucket-edges "
                            f"{' '.join(map(str, edges))} are mutually exclusive; give one")
    if width is not None:
        if not 1 <= width <= seq:
            raise ArgumentError(f"--eval-position-buckets {width}: the bucket width must be "
                                f"between 1 and --seq-length {seq} tokens")
        inner = list(range(width, seq, width))
        flag = f"--eval-position-buckets {width}"
    else:
        flag = f"--eval-position-bucket-edges {' '.join(map(str, edges))}"
        if any(not 0 < e < seq for e in edges) or any(b <= a for a, b in zip(edges, edges[1:], strict=False)):
            raise ArgumentError(f"{flag}: the edges must increase strictly and lie between 0 and "
                                f"--seq-length {seq}, both excluded")
        inner = list(edges)
    if len(inner) + 1 > MAX_POSITION_BUCKETS:
        raise ArgumentError(f"{flag} gives {len(inner) + 1} buckets over --seq-length {seq}; at "
                            f"most {MAX_POSITION_BUCKETS} are allowed")
    args.eval_position_bounds = (0, *inner, seq)
    if args.eval_iters == 0:
        notes.append(f"{flag} with --eval-iters 0: nothing is evaluated, no position buckets")
