#!/usr/bin/env python
"""Write a small corpus of long documents for a context-extension stage on CPU
(examples/extend_context_cpu.sh): each document is one synthetic report whose sections come from
the demo corpus's generators (tools/make_demo_data.py: web prose, code, math), in turn, until it
holds at least ``--min-bytes`` bytes (byte-level tokens), several times the stage's sequence
length, so that a sample of the long stage sees one document across the old context.

    python tools/make_long_documents.py [--output-dir data/demo_long] [--documents 400]
        [--min-bytes 1536] [--seed 1234] [--force]

Writes ``OUTPUT/long.jsonl`` and ``OUTPUT/long_text_document.{bin,idx}`` (megatron-core indexed
dataset, one document per report, EOD appended) and skips the work when those files exist for
the same parameters.
"""
import argparse
import json
import os
import random
import sys
from typing import Dict, List

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.path.pardir)))

from megatron.data.preprocess import output_prefix_for_key, preprocess_jsonl  # noqa: E402
from megatron.utils.atomic_io import atomic_write_text  # noqa: E402
from tools.make_demo_data import DOMAINS, GENERATORS  # noqa: E402

DEFAULT_OUTPUT_DIR = os.path.join("data", "demo_long")
MANIFEST = "manifest.json"


def long_documents(count: int, min_bytes: int, seed: int) -> List[str]:
    """``count`` reports of at least ``min_bytes`` UTF-8 bytes each: sections of the demo domains
    in turn (web, code, math, web, ...), from an RNG seeded by ``seed``."""
    rng = random.Random(f"make_long_documents:{seed}")
    docs = []
    for i in range(count):
        sections, size, k = [], 0, 0
        while size < min_bytes:
            domain = DOMAINS[k % len(DOMAINS)]
            text = GENERATORS[domain](rng, i * 1000 + k)
            sections.append(text)
            size += len(text.encode("utf-8")) + 2
            k += 1
        docs.append("\n\n".join(sections))
    return docs


def make_long_documents(output_dir: str = DEFAULT_OUTPUT_DIR, documents: int = 400,
                        min_bytes: int = 1536, seed: int = 1234, force: bool = False,
                        verbose: bool = True) -> str:
    """Write the long-document corpus into ``output_dir`` (see the module docstring) and return
    its dataset prefix."""
    prefix = output_prefix_for_key(os.path.join(output_dir, "long"), "text")
    params: Dict[str, int] = {"documents": documents, "min_bytes": min_bytes, "seed": seed}
    manifest = os.path.join(output_dir, MANIFEST)
    if not force and all(os.path.exists(prefix + ext) for ext in (".bin", ".idx")):
        try:
            with open(manifest, encoding="utf-8") as f:
                if json.load(f).get("params") == params:
                    if verbose:
                        print(f"long documents in {output_dir} are up to date")
                    return prefix
        except (OSError, ValueError):
            pass
    os.makedirs(output_dir, exist_ok=True)
    jsonl = os.path.join(output_dir, "long.jsonl")
    atomic_write_text(jsonl, "".join(json.dumps({"id": f"long-{i:06d}", "text": text},
                                                ensure_ascii=False) + "\n"
                                     for i, text in enumerate(long_documents(documents, min_bytes, seed))))
    result = preprocess_jsonl(jsonl, os.path.join(output_dir, "long"), ["text"], None,
                              append_eod=True, workers=1, log_interval=0)
    atomic_write_text(manifest, json.dumps({"params": params, "documents": result.num_documents,
                                            "tokens": result.num_tokens["text"]}, indent=2) + "\n")
    if verbose:
        print(f"wrote {prefix}.{{bin,idx}}: {result.num_documents} documents, "
              f"{result.num_tokens['text']} tokens")
    return prefix


def main(argv=None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output-dir", default=DEFAULT_OUTPUT_DIR)
    parser.add_argument("--documents", type=int, default=400, help="Reports to write.")
    parser.add_argument("--min-bytes", type=int, default=1536,
                        help="Least UTF-8 bytes (byte-level tokens) per report.")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--force", action="store_true", help="Rewrite even if outputs exist.")
    args = parser.parse_args(argv)
    if args.documents <= 0 or args.min_bytes <= 0:
        parser.error(f"--documents {args.documents} and --min-bytes {args.min_bytes} must be > 0")
    make_long_documents(args.output_dir, args.documents, args.min_bytes, args.seed, args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
