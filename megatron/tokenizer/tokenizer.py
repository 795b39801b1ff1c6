"""``build_tokenizer(config)``: the tokenizer a ``TokenizerConfig`` names (megatron/tokenizer/types.py:
the type and its files); ``tokenizer_setup(config, vocab)``: it with the padded vocabulary
(embedding rows, from the :class:`VocabConfig`) and the start-up lines, returned for the caller
that sets up the run to assign (megatron/config/tokenizer_flags.py ``apply_tokenizer_setup``).

Hugging Face and sentencepiece tokenizers are megatron-core's (``megatron.core.tokenizers``, see
``core_tokenizers.py``); the byte-level default and GPT-2 BPE files are the project's own
(``byte_level.py`` and ``gpt2_bpe.py`` say why). Every tokenizer is a megatron-core
``MegatronTokenizerBase``, so megatron-core datasets accept it, and provides ``tokenize(text) ->
list[int]`` (no special tokens added; ``--append-eod`` or the dataset adds ``eod``),
``detokenize(ids)``, ``vocab_size`` (unpadded), ``eod``, ``pad``, ``bos``, ``eos`` and ``name``.
"""

import dataclasses
from typing import Any, List, Optional, Tuple

from megatron.errors import ConfigError
from megatron.tokenizer.byte_level import ByteLevelTokenizer
from megatron.tokenizer.gpt2_bpe import GPT2BPETokenizer
from megatron.tokenizer.types import TOKENIZER_FILE_FLAGS, TokenizerConfig

__all__ = ["ByteLevelTokenizer", "GPT2BPETokenizer", "TokenizerSetup", "VocabConfig", "build_tokenizer",
           "padded_vocab_size", "tokenizer_setup"]


def padded_vocab_size(
    raw_vocab_size: int, make_vocab_size_divisible_by: int = 128,
    tensor_model_parallel_size: int = 1, pad_vocab_size_to=None,
) -> int:
    """Vocabulary size (number of embedding rows) padded up to the next multiple of
    ``make_vocab_size_divisible_by * tensor_model_parallel_size``, as Megatron-LM's
    ``_vocab_size_with_padding``; with ``pad_vocab_size_to`` (``--pad-vocab-size-to``, BigScience)
    exactly that many rows, which must be at least ``raw_vocab_size`` (ConfigError naming the flag
    otherwise; that it is positive and divisible by the tensor-parallel size ``validate_args``
    checks)."""
    if pad_vocab_size_to is not None:
        if pad_vocab_size_to < raw_vocab_size:
            raise ConfigError(f"--pad-vocab-size-to {pad_vocab_size_to} is smaller than the "
                              f"tokenizer's vocabulary ({raw_vocab_size} tokens); it can only pad "
                              "to a larger size")
        return int(pad_vocab_size_to)
    for name, value in (
        ("raw_vocab_size", raw_vocab_size),
        ("make_vocab_size_divisible_by", make_vocab_size_divisible_by),
        ("tensor_model_parallel_size", tensor_model_parallel_size),
    ):
        if int(value) != value or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    multiple = int(make_vocab_size_divisible_by) * int(tensor_model_parallel_size)
    return -(-int(raw_vocab_size) // multiple) * multiple


def build_tokenizer(config: TokenizerConfig):
    """The tokenizer ``config`` names (its type resolved: megatron/tokenizer/types.py
    ``tokenizer_config``), read from its files. Raises ConfigError for missing or unreadable
    files (naming flag and value)."""
    ttype = config.tokenizer_type
    if ttype == "ByteLevelTokenizer":
        return ByteLevelTokenizer()
    if ttype == "GPT2BPETokenizer":
        return GPT2BPETokenizer(config.vocab_file, config.merge_file)
    # megatron-core's Hugging Face / sentencepiece tokenizers import transformers (about a second
    # of start-up per rank): imported only by the runs that use them.
    from megatron.tokenizer.core_tokenizers import HuggingFaceTokenizer, SentencePieceTokenizer  # lazy: transformers

    if ttype == "HuggingFaceTokenizer":
        return HuggingFaceTokenizer(config.tokenizer_model, "--tokenizer-model", ttype)
    if ttype == "PretrainedFromHF":
        return HuggingFaceTokenizer(config.tokenizer_name_or_path, "--tokenizer-name-or-path", ttype)
    if ttype in ("SentencePieceTokenizer", "GPTSentencePieceTokenizer"):
        return SentencePieceTokenizer(config.tokenizer_model, ttype)
    raise AssertionError(f"tokenizer_config let --tokenizer-type {ttype!r} through")


@dataclasses.dataclass(frozen=True)
class VocabConfig:
    """What the embedding rows follow besides the tokenizer (argparse dests): Megatron-LM's
    rounding (``--make-vocab-size-divisible-by`` x ``--tensor-model-parallel-size``) or
    BigScience's ``--pad-vocab-size-to``; with ``--use-checkpoint-args``, the checkpoint's record
    (``checkpoint_model_args``: the ``model_args.json`` of ``--load`` ``load``, None without) and
    the note on its tokenizer (``checkpoint_tokenizer_note``)."""

    make_vocab_size_divisible_by: int
    tensor_model_parallel_size: int
    pad_vocab_size_to: Optional[int]
    load: Optional[str]
    checkpoint_model_args: Optional[dict]
    checkpoint_tokenizer_note: Optional[str]


@dataclasses.dataclass(frozen=True)
class TokenizerSetup:
    """What a run's tokenizer gives the model, returned by :func:`tokenizer_setup` for the caller
    that sets up the run (the entry points: megatron/config/tokenizer_flags.py
    ``apply_tokenizer_setup``): ``tokenizer``; ``padded_vocab_size``, the embedding rows
    (Megatron-LM's rounding, or ``--pad-vocab-size-to``); ``vocab_size``, the rows that take
    probability (:func:`model_vocab_size`; the others are padding,
    megatron/model/vocab_padding.py); ``notes``, the start-up lines (the tokenizer summary and its
    warnings)."""

    tokenizer: Any
    padded_vocab_size: int
    vocab_size: int
    notes: Tuple[str, ...] = ()


def tokenizer_setup(config: TokenizerConfig, vocab: VocabConfig) -> TokenizerSetup:
    """:func:`build_tokenizer` of the run's ``TokenizerConfig`` ``config`` (built by validation)
    with the embedding rows for it, as Megatron-LM computes them (``vocab``): the vocabulary
    padded to a multiple of ``--make-vocab-size-divisible-by`` x ``--tensor-model-parallel-size``,
    or ``--pad-vocab-size-to``; the rows that take probability (more than the tokenizer's with a
    ``--use-checkpoint-args`` record of more real rows) and the start-up lines."""
    tokenizer = build_tokenizer(config)
    record = vocab.checkpoint_model_args or {}  # --use-checkpoint-args: model_args.json
    check_fits_checkpoint(tokenizer, config, record, vocab.load)
    padded = padded_vocab_size(tokenizer.vocab_size, vocab.make_vocab_size_divisible_by,
                               vocab.tensor_model_parallel_size, vocab.pad_vocab_size_to)
    notes = [tokenizer_summary(tokenizer, padded, config.tokenizer_type_note)]
    if vocab.checkpoint_tokenizer_note:
        notes.append(vocab.checkpoint_tokenizer_note)
    unused = unused_tokenizer_flags(config)
    if unused:
        notes.append(f"warning: {' '.join(unused)} not used by --tokenizer-type "
                     f"{config.tokenizer_type} (it reads "
                     f"{' '.join(TOKENIZER_FILE_FLAGS[config.tokenizer_type] or ['no files'])})")
    return TokenizerSetup(tokenizer, padded,
                          model_vocab_size(tokenizer.vocab_size, padded, record.get("vocab_size")),
                          tuple(notes))


def unused_tokenizer_flags(config: TokenizerConfig) -> List[str]:
    """``FLAG 'VALUE'`` for each tokenizer file flag given that ``config.tokenizer_type`` ignores
    (Megatron-LM ignores them too; scripts written for another tokenizer often carry them)."""
    used = TOKENIZER_FILE_FLAGS[config.tokenizer_type] or ()
    return [f"{flag} {value!r}" for flag, value in config.file_flags().items() if flag not in used]


def check_fits_checkpoint(tokenizer, config: TokenizerConfig, record: dict,
                          load: Optional[str]) -> None:
    """With ``--use-checkpoint-args`` (``record``: the ``model_args.json`` of ``--load``
    ``load``; empty without), a ConfigError naming both sizes when the tokenizer has more tokens
    than the checkpoint's embedding rows (its ``padded_vocab_size``)."""
    rows = record.get("padded_vocab_size")
    if rows and tokenizer.vocab_size > int(rows):
        raise ConfigError(
            f"--tokenizer-type {config.tokenizer_type}: the tokenizer has {tokenizer.vocab_size} "
            f"tokens but the checkpoint in --load {load} embeds {rows} "
            "rows (--use-checkpoint-args); give a tokenizer that fits, or drop the tokenizer "
            "flags to use the checkpoint's")


def model_vocab_size(tokenizer_vocab_size: int, padded_vocab_size: int,
                     recorded: Optional[int] = None) -> int:
    """The number of vocabulary rows that take probability (tokens): the tokenizer's vocabulary,
    or more when the checkpoint records more real rows (``recorded``: a model imported from
    Hugging Face whose ``vocab_size`` exceeds its tokenizer's, as BLOOM's), never more than the
    embedding's ``padded_vocab_size`` rows."""
    rows = max(int(tokenizer_vocab_size), int(recorded or 0))
    return min(rows, int(padded_vocab_size))


def tokenizer_summary(tokenizer, padded: int, type_note: str = None) -> str:
    """One start-up line: the tokenizer type (and ``type_note``, why it is that type when no
    ``--tokenizer-type`` was given), its vocabulary size and special ids, and the ``padded``
    number of embedding rows (as Megatron-LM's "padded vocab ... dummy tokens"), which take no
    probability."""
    why = f" ({type_note})" if type_note else ""
    return (f"tokenizer: {tokenizer.name}{why}, {tokenizer.vocab_size} tokens (eod "
            f"{tokenizer.eod}, pad {tokenizer.pad}); embedding rows {padded} "
            f"({padded - tokenizer.vocab_size} dummy tokens of padding, which take no "
            "probability)")
