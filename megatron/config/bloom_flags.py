"""The "BLOOM architecture" flag group (BigScience Megatron-DeepSpeed: ``--embed-layernorm``,
``--pad-vocab-size-to``) and its check."""
import argparse

from megatron.errors import ArgumentError


def add_bloom_model_args(parser: argparse.ArgumentParser) -> None:
    """BLOOM's architecture flags (BigScience Megatron-DeepSpeed)."""
    g = parser.add_argument_group("BLOOM architecture")
    g.add_argument("--embed-layernorm", action="store_true",
                   help="LayerNorm right after the word embeddings (BLOOM's "
                        "word_embeddings_layernorm).")
    g.add_argument("--pad-vocab-size-to", type=int, default=None, metavar="N",
                   help="Pad the vocabulary to exactly N embedding rows (N >= the tokenizer's "
                        "vocabulary, divisible by --tensor-model-parallel-size) instead of "
                        "rounding up to --make-vocab-size-divisible-by x TP.")


def validate_bloom_model(args) -> None:
    """``--pad-vocab-size-to``: positive and divisible by the tensor-parallel size (that it is at
    least the tokenizer's vocabulary is checked when the tokenizer is built)."""
    n, tp = args.pad_vocab_size_to, args.tensor_model_parallel_size
    if n is None:
        return
    if n <= 0:
        raise ArgumentError(f"--pad-vocab-size-to {n} must be positive")
    if n % tp:
        raise ArgumentError(f"--pad-vocab-size-to {n} is not divisible by "
                            f"--tensor-model-parallel-size {tp} (each rank holds vocab / TP "
                            "embedding rows)")
