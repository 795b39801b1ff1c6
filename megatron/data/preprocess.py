"""Tokenize a JSON-lines corpus into megatron-core indexed datasets (``.bin``/``.idx``).

For every json key K, ``PREFIX_K_document.{bin,idx}`` holds one document per non-blank input line
(one sequence per document: the tokens of that line's K value, plus the end-of-document token
with ``append_eod``). All keys therefore have the same document count, so ``inputs``/``targets``
datasets for T0 stay aligned by document index.

``tools/preprocess_data.py`` is the command-line front end; other tools and tests call
``preprocess_jsonl`` directly.
"""

import json
import multiprocessing
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, TextIO, Tuple

import numpy

from megatron.tokenizer.types import TokenizerConfig, tokenizer_config

# megatron-core (the indexed-dataset writer, the tokenizers) is imported where data is written, not
# here: tools/make_demo_data.py's up-to-date check needs only output_prefix_for_key, and an import
# of megatron.core costs every run of an example script several seconds.

LEVEL = "document"


def output_prefix_for_key(output_prefix: str, key: str) -> str:
    """Path prefix of the dataset written for json ``key``: ``{output_prefix}_{key}_document``."""
    return f"{output_prefix}_{key}_{LEVEL}"


def encode_record(
    record: dict, json_keys: Sequence[str], tokenizer, append_eod: bool, where: str = "record"
) -> Dict[str, List[int]]:
    """Token ids for each json key of one parsed record (a dict), with the tokenizer's eod id
    appended when ``append_eod``. Raises ValueError naming the key and ``where`` if a key is
    missing or its value is not a string."""
    out: Dict[str, List[int]] = {}
    for key in json_keys:
        if key not in record:
            raise ValueError(
                f"{where}: missing json key {key!r} (keys present: {sorted(record)})"
            )
        text = record[key]
        if not isinstance(text, str):
            raise ValueError(
                f"{where}: json key {key!r} holds {type(text).__name__}, expected a string"
            )
        ids = list(tokenizer.tokenize(text))
        if append_eod:
            ids.append(tokenizer.eod)
        out[key] = ids
    return out


def encode_line(
    line: str, json_keys: Sequence[str], tokenizer, append_eod: bool, where: str = "line"
) -> Dict[str, List[int]]:
    """Token ids for each json key of one JSON-lines line (see ``encode_record``). Raises
    ValueError naming ``where`` if the line is not a JSON object."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON ({exc})") from exc
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
    return encode_record(record, json_keys, tokenizer, append_eod, where)


# --- worker-process state (set by _init_worker in each pool process) -------------------------
_WORKER: dict = {}


def _init_worker(tokenizer: TokenizerConfig, json_keys, append_eod, input_path) -> None:
    """Pool initializer: build this process's tokenizer once."""
    from megatron.tokenizer import build_tokenizer  # lazy: megatron-core, in the pool workers only

    _WORKER["tokenizer"] = build_tokenizer(tokenizer)
    _WORKER["json_keys"] = tuple(json_keys)
    _WORKER["append_eod"] = append_eod
    _WORKER["input_path"] = input_path


def _encode_numbered_line(item: Tuple[int, str]) -> Tuple[int, Dict[str, List[int]], int]:
    """(line number, line) -> (line number, {key: token ids}, line size in bytes)."""
    line_no, line = item
    ids = encode_line(
        line, _WORKER["json_keys"], _WORKER["tokenizer"], _WORKER["append_eod"],
        where=f"{_WORKER['input_path']} line {line_no}",
    )
    return line_no, ids, len(line.encode("utf-8"))


def _numbered_lines(path: str) -> Iterator[Tuple[int, str]]:
    """Yield (1-based line number, line) for each non-blank line of ``path``."""
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"--input {path!r} line {line_no}: not UTF-8 text ({exc})") from None
            if line.strip():
                yield line_no, line


@dataclass
class PreprocessResult:
    """What ``preprocess_jsonl`` wrote: dataset prefix, document and token counts per key."""

    prefixes: Dict[str, str]
    num_documents: int
    num_tokens: Dict[str, int] = field(default_factory=dict)
    input_bytes: int = 0
    seconds: float = 0.0


def preprocess_jsonl(
    input_path: str,
    output_prefix: str,
    json_keys: Sequence[str] = ("text",),
    tokenizer: Optional[TokenizerConfig] = None,
    append_eod: bool = False,
    workers: int = 1,
    log_interval: int = 1000,
    chunk_size: int = 32,
    log_stream: Optional[TextIO] = None,
) -> PreprocessResult:
    """Tokenize every non-blank line of the JSON-lines file ``input_path`` and write, for each
    json key K, the megatron-core indexed dataset ``{output_prefix}_K_document.{bin,idx}``.

    ``tokenizer`` is the megatron/tokenizer/types.py ``TokenizerConfig`` to tokenize with
    (``None``: the byte-level tokenizer). Token dtype is ``DType.optimal_dtype(vocab_size)``.
    ``workers`` > 1 tokenizes in a
    process pool (``imap`` in chunks of ``chunk_size`` lines; document order is preserved).
    Every ``log_interval`` documents (0: never) a progress line with documents/s and input MB/s
    goes to ``log_stream`` (default stderr). Outputs are written under temporary names and
    renamed only on success. Raises ValueError for a missing input file, a bad line, or a missing
    json key (naming the key and line number).
    """
    if not input_path or not os.path.isfile(input_path):
        raise ValueError(f"--input {input_path!r}: no such file")
    json_keys = list(json_keys)
    if not json_keys:
        raise ValueError("--json-keys needs at least one key")
    if len(set(json_keys)) != len(json_keys):
        raise ValueError(f"--json-keys has duplicates: {json_keys}")
    tokenizer_choice = tokenizer if tokenizer is not None else tokenizer_config()  # byte-level
    workers = max(1, int(workers))
    log_stream = sys.stderr if log_stream is None else log_stream

    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    # Build once here: validates the tokenizer files before any worker starts, gives the dtype.
    _init_worker(tokenizer_choice, json_keys, append_eod, input_path)
    tokenizer = _WORKER["tokenizer"]
    dtype = DType.optimal_dtype(tokenizer.vocab_size)

    out_dir = os.path.dirname(os.path.abspath(output_prefix))
    os.makedirs(out_dir, exist_ok=True)
    prefixes = {key: output_prefix_for_key(output_prefix, key) for key in json_keys}
    tmp_suffix = f".tmp{os.getpid()}"
    tmp_paths = []
    builders = {}
    for key, prefix in prefixes.items():
        bin_tmp, idx_tmp = prefix + ".bin" + tmp_suffix, prefix + ".idx" + tmp_suffix
        tmp_paths += [bin_tmp, idx_tmp]
        builders[key] = IndexedDatasetBuilder(bin_tmp, dtype=dtype)

    num_docs = 0
    num_tokens = {key: 0 for key in json_keys}
    total_bytes = 0
    start = time.time()
    pool = None
    try:
        lines = _numbered_lines(input_path)
        if workers > 1:
            pool = multiprocessing.Pool(
                workers, initializer=_init_worker,
                initargs=(tokenizer_choice, json_keys, append_eod, input_path),
            )
            encoded = pool.imap(_encode_numbered_line, lines, chunksize=max(1, chunk_size))
        else:
            encoded = map(_encode_numbered_line, lines)
        for _line_no, doc, nbytes in encoded:
            for key in json_keys:
                ids = doc[key]
                builders[key].add_document(numpy.asarray(ids, dtype=dtype), [len(ids)])
                num_tokens[key] += len(ids)
            num_docs += 1
            total_bytes += nbytes
            if log_interval and num_docs % log_interval == 0:
                elapsed = max(time.time() - start, 1e-9)
                print(
                    f"Processed {num_docs} documents ({num_docs / elapsed:.1f} docs/s, "
                    f"{total_bytes / elapsed / 1024 / 1024:.2f} MB/s).",
                    file=log_stream, flush=True,
                )
        if pool is not None:
            pool.close()
            pool.join()
            pool = None
        for key, prefix in prefixes.items():
            builders[key].finalize(prefix + ".idx" + tmp_suffix)
        for _key, prefix in prefixes.items():
            os.replace(prefix + ".bin" + tmp_suffix, prefix + ".bin")
            os.replace(prefix + ".idx" + tmp_suffix, prefix + ".idx")
    except BaseException:
        if pool is not None:
            pool.terminate()
            pool.join()
        for b in builders.values():
            if not b.data_file.closed:
                b.data_file.close()
        for p in tmp_paths:
            if os.path.exists(p):
                os.remove(p)
        raise
    return PreprocessResult(
        prefixes=prefixes, num_documents=num_docs, num_tokens=num_tokens,
        input_bytes=total_bytes, seconds=time.time() - start,
    )
