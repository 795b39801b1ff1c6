"""Tokenize a JSON-lines file into megatron-core indexed datasets (Megatron-LM compatible CLI).

    python tools/preprocess_data.py --input corpus.jsonl --output-prefix data/corpus \
        --json-keys text --tokenizer-type GPT2BPETokenizer --vocab-file vocab.json \
        --merge-file merges.txt --append-eod --workers 4

Tokenizers: the byte-level default (no flags), ``--tokenizer-type GPT2BPETokenizer --vocab-file
--merge-file``, ``PretrainedFromHF --tokenizer-name-or-path DIR_OR_TOKENIZER_JSON`` (BigScience),
``HuggingFaceTokenizer --tokenizer-model DIR_OR_TOKENIZER_JSON`` (Megatron-LM) and
``GPTSentencePieceTokenizer``/``SentencePieceTokenizer --tokenizer-model FILE.model``; paths are
local only. Tokenizer files without ``--tokenizer-type`` are an error.

writes ``data/corpus_text_document.{bin,idx}`` (one ``.bin``/``.idx`` pair per json key; e.g.
``--json-keys inputs targets`` for T0 data). The work is done by
``megatron.data.preprocess.preprocess_jsonl``.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.path.pardir)))

from megatron.runtime.known_warnings import quiet_known_warnings  # noqa: E402

quiet_known_warnings()  # before megatron.core is imported

from megatron.config.tokenizer_flags import (  # noqa: E402
    add_tokenizer_args,
    check_tokenizer_args,
    tokenizer_config_from_args,  # noqa: E402
)
from megatron.data.preprocess import preprocess_jsonl  # noqa: E402
from megatron.errors import ConfigError  # noqa: E402


def get_args(argv=None) -> argparse.Namespace:
    """Parse the command line (``argv``, default ``sys.argv[1:]``) into a Namespace."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    group = parser.add_argument_group(title="input data")
    group.add_argument("--input", type=str, required=True, help="Path to the input JSON-lines file.")
    group.add_argument("--json-keys", nargs="+", default=["text"],
                       help="Keys to extract from each JSON line (one dataset per key).")
    add_tokenizer_args(parser)
    group = parser.add_argument_group(title="output data")
    group.add_argument("--output-prefix", type=str, required=True,
                       help="Output path prefix, without the _KEY_document suffix.")
    group.add_argument("--append-eod", action="store_true",
                       help="Append the end-of-document token to each document.")
    group = parser.add_argument_group(title="runtime")
    group.add_argument("--workers", type=int, default=1,
                       help="Number of tokenizer worker processes.")
    group.add_argument("--chunk-size", type=int, default=32,
                       help="Lines handed to a worker at a time.")
    group.add_argument("--log-interval", type=int, default=1000,
                       help="Print progress every this many documents (0: never).")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be >= 1")
    try:
        check_tokenizer_args(args)
    except ConfigError as exc:
        parser.error(str(exc))
    return args


def main(argv=None) -> int:
    """Run preprocessing for the command line ``argv``; return the process exit status."""
    args = get_args(argv)
    tokenizer = tokenizer_config_from_args(args)
    if args.tokenizer_type_note:
        print(f"tokenizer: {args.tokenizer_type} ({args.tokenizer_type_note})", file=sys.stderr)
    try:
        result = preprocess_jsonl(
            args.input, args.output_prefix, args.json_keys, tokenizer,
            append_eod=args.append_eod, workers=args.workers, log_interval=args.log_interval,
            chunk_size=args.chunk_size,
        )
    except ValueError as exc:
        print(f"preprocess_data.py: error: {exc}", file=sys.stderr)
        return 2
    mb = result.input_bytes / 1024 / 1024
    print(
        f"Done: {result.num_documents} documents, {mb:.2f} MB in {result.seconds:.1f} s.",
        file=sys.stderr,
    )
    for key, prefix in result.prefixes.items():
        print(f"  {key}: {prefix}.bin/.idx ({result.num_tokens[key]} tokens)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
