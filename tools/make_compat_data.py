"""Write the tokenizers and datasets the launch scripts in examples/compat/ run on (made here from the
project's own demo text and toy multitask set; nothing is downloaded).

    python tools/make_compat_data.py [--output-dir data/compat]

Each family's script tokenizes with the tokenizer its public original uses, so the data is
preprocessed once per tokenizer (tools/preprocess_data.py, ``--append-eod``):

  tokenizers/hf/                 Hugging Face tokenizer directory (tools/make_tiny_tokenizers.py):
                                 ``--tokenizer-type PretrainedFromHF --tokenizer-name-or-path``
  tokenizers/spm/tokenizer.model sentencepiece model: ``--tokenizer-type GPTSentencePieceTokenizer``
  tokenizers/gpt2/{vocab.json,merges.txt}
                                 GPT-2 BPE files with ``<|endoftext|>``: ``--vocab-file --merge-file``
  text/{web,code}.jsonl          the demo web and code text (tools/make_demo_data.py), one
                                 paragraph per document, so that even the 0.1 % test split of
                                 Megatron-LM's ``--split 949,50,1`` holds documents; the last
                                 one is a short closing line (:data:`CLOSING_PARAGRAPH`), so
                                 that test split holds fewer tokens than one sample, as on a
                                 user's first small corpus (its epochs span several passes)
  {hf,spm,gpt2}/{web,code}_text_document   that text, per tokenizer
  mtf_hf/{train,valid,heldout}_TASK_{inputs,targets}_document   the toy multitask set (HF tokenizer)
  splits/tr11-{train,valid}-splits.txt     BigScience ``--*-weighted-split-paths-path`` files in
                                 the form BigScience's load_ratios_meg_ds_format.py writes
                                 (one quoted group on one line, train 0:0.95, valid 0.95:1)
  splits/xp3-{train,validation}.txt        tr13 (xP3) form: the whole argument text on one line,
                                 each group in double quotes (one validation group per held-out task)

Same arguments, same files. Outputs are kept when ``manifest.json`` records the same arguments.
"""
import argparse
import json
import os
import sys
from typing import Dict, List

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.path.pardir)))

from megatron.runtime.known_warnings import quiet_known_warnings  # noqa: E402

quiet_known_warnings()  # before megatron.core is imported

from megatron.utils.atomic_io import atomic_write_text  # noqa: E402
from tools.make_toy_multitask import HELDOUT_TASKS, TRAIN_TASKS, make_toy_multitask  # noqa: E402

DEFAULT_OUTPUT_DIR = os.path.join("data", "compat")
DEFAULT_SIZE_MB = 0.15          # demo text per domain (600 to 1200 paragraphs)
DEFAULT_EXAMPLES_PER_TASK = 60  # toy multitask examples per training task
TEXT_DOMAINS = ("web", "code")
MANIFEST = "manifest.json"
VERSION = 3
# the last document of every text domain: fewer tokens than one sample of the scripts' 64
CLOSING_PARAGRAPH = "The end."


def _tokenizer_flags(tokenizers: Dict[str, str]) -> Dict[str, List[str]]:
    """Preprocessing flags per tokenizer name, in the families' own flag spelling."""
    return {
        "hf": ["--tokenizer-type", "PretrainedFromHF", "--tokenizer-name-or-path", tokenizers["hf"]],
        "spm": ["--tokenizer-type", "GPTSentencePieceTokenizer",
                "--tokenizer-model", tokenizers["sentencepiece"]],
        "gpt2": ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", tokenizers["vocab_file"],
                 "--merge-file", tokenizers["merge_file"]],
    }


def make_gpt2_bpe_files(output_dir: str, docs: List[str], vocab_size: int = 384) -> Dict[str, str]:
    """Train a byte-level BPE of ``vocab_size`` tokens (``<|endoftext|>`` first) on ``docs`` and
    write it as GPT-2's ``vocab.json`` and ``merges.txt`` in ``output_dir``; returns their paths
    as ``{"vocab_file", "merge_file"}``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer=trainer)
    os.makedirs(output_dir, exist_ok=True)
    vocab_file, merge_file = tok.model.save(output_dir)
    return {"vocab_file": vocab_file, "merge_file": merge_file}


def _preprocess(jsonl: str, prefix: str, keys: List[str], tokenizer_flags: List[str]) -> None:
    from tools.preprocess_data import main as preprocess_main  # lazy: numpy + the tokenizer flags; not --help

    status = preprocess_main(["--input", jsonl, "--output-prefix", prefix, "--json-keys", *keys,
                              "--append-eod", "--log-interval", "0", *tokenizer_flags])
    if status != 0:
        raise SystemExit(f"make_compat_data.py: preprocessing {jsonl} with {tokenizer_flags} "
                         f"failed (exit status {status})")


def _write_paragraphs(output_dir: str, size_mb: float) -> Dict[str, str]:
    """Write ``DOMAIN.jsonl`` ({"text"} per paragraph of the demo text) for each of
    :data:`TEXT_DOMAINS`; returns {domain: path}."""
    from tools.make_demo_data import generate_domain  # lazy: numpy + the data package; not --help

    os.makedirs(output_dir, exist_ok=True)
    paths = {}
    for domain in TEXT_DOMAINS:
        docs = generate_domain(domain, int(size_mb * 1024 * 1024))
        paragraphs = [p for doc in docs for p in doc.split("\n\n") if p.strip()]
        paragraphs.append(CLOSING_PARAGRAPH)
        paths[domain] = os.path.join(output_dir, f"{domain}.jsonl")
        atomic_write_text(paths[domain], "".join(json.dumps({"text": p}, ensure_ascii=False) + "\n"
                                                 for p in paragraphs))
    return paths


def _split_files(output_dir: str, text: Dict[str, str], mtf: Dict[str, str]) -> Dict[str, str]:
    """Write the BigScience split files; returns {name: path}."""
    split_dir = os.path.join(output_dir, "splits")
    os.makedirs(split_dir, exist_ok=True)
    files = {}

    def write(name: str, line: str) -> None:
        files[name] = os.path.join(split_dir, name + ".txt")
        atomic_write_text(files[name], line + "\n")

    # tr11: load_ratios_meg_ds_format.py writes '"train: RATIO 0:0.950 PATH, ..."'
    for split, token_range in (("train", "0:0.950"), ("valid", "0.950:1.0")):
        items = ", ".join(f"0.5 {token_range} {text[d]}" for d in TEXT_DOMAINS)
        write(f"tr11-{split}-splits", f'"{split}: {items}"')
    # tr13 (xP3): the whole argument on one line, every group quoted
    train_items = ", ".join(f"1 0:1 {mtf['train_' + t]}" for t in TRAIN_TASKS)
    write("xp3-train", f'"train: {train_items}"')
    valid_groups = [f'"{t}: 1 0:1 {mtf["heldout_" + t]}"' for t in HELDOUT_TASKS]
    valid_groups.append(f'"copy_valid: 1 0:1 {mtf["valid_copy"]}"')
    write("xp3-validation", " ".join(valid_groups))
    return files


def make_compat_data(output_dir: str = DEFAULT_OUTPUT_DIR, size_mb: float = DEFAULT_SIZE_MB,
                     examples_per_task: int = DEFAULT_EXAMPLES_PER_TASK, force: bool = False,
                     verbose: bool = True) -> Dict[str, str]:
    """Write everything examples/compat/ needs into ``output_dir`` (skipped when its manifest
    records the same arguments, unless ``force``); returns {name: path or dataset prefix}."""
    manifest_path = os.path.join(output_dir, MANIFEST)
    params = {"version": VERSION, "size_mb": size_mb, "examples_per_task": examples_per_task}
    if not force and os.path.exists(manifest_path):
        with open(manifest_path, encoding="utf-8") as f:
            old = json.load(f)
        if old.get("params") == params:
            if verbose:
                print(f"compat data in {output_dir} is up to date")
            return old["paths"]

    from tools.make_tiny_tokenizers import make_tiny_tokenizers, training_texts  # lazy: numpy; --help needs none

    paths: Dict[str, str] = {}
    tokenizers = make_tiny_tokenizers(os.path.join(output_dir, "tokenizers"))
    tokenizers.update(make_gpt2_bpe_files(os.path.join(output_dir, "tokenizers", "gpt2"),
                                          training_texts()))
    paths.update(tokenizers)
    jsonl = _write_paragraphs(os.path.join(output_dir, "text"), size_mb)
    text: Dict[str, str] = {}
    for name, flags in _tokenizer_flags(tokenizers).items():
        for domain in TEXT_DOMAINS:
            prefix = os.path.join(output_dir, name, domain)
            _preprocess(jsonl[domain], prefix, ["text"], flags)
            paths[f"{name}_{domain}"] = prefix + "_text_document"
        text[name] = {d: paths[f"{name}_{d}"] for d in TEXT_DOMAINS}
    mtf_dir = os.path.join(output_dir, "mtf_hf")
    toy = make_toy_multitask(mtf_dir, examples_per_task=examples_per_task, rank_eval_per_task=5,
                             pretrain_docs=1)
    mtf = {}
    for name, jsonl in toy.items():
        if name.startswith(("train_", "valid_", "heldout_")):
            mtf[name] = os.path.join(mtf_dir, name)
            _preprocess(jsonl, mtf[name], ["inputs", "targets"], _tokenizer_flags(tokenizers)["hf"])
    paths.update(_split_files(output_dir, text["hf"], mtf))
    atomic_write_text(manifest_path, json.dumps({"params": params, "paths": paths}, indent=1,
                                                sort_keys=True) + "\n")
    if verbose:
        print(f"wrote the compat tokenizers and datasets in {output_dir}")
    return paths


def main(argv=None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output-dir", default=DEFAULT_OUTPUT_DIR,
                        help=f"Where to write (default {DEFAULT_OUTPUT_DIR}).")
    parser.add_argument("--force", action="store_true", help="Rebuild even when up to date.")
    args = parser.parse_args(argv)
    make_compat_data(args.output_dir, force=args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
