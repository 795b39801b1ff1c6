#!/usr/bin/env python
"""Export a training checkpoint of any layout to a Hugging Face transformers model directory.

    python tools/checkpoint/convert_to_hf.py --load DIR [--iteration N] --output HF_DIR
        [--max-shard-size 2GB]

writes ``HF_DIR/config.json``, the weights as safetensors (``model.safetensors``, or shards
``model-0000K-of-0000N.safetensors`` with ``model.safetensors.index.json`` beyond
``--max-shard-size``) and, when the run used a Hugging Face tokenizer (``--tokenizer-type
PretrainedFromHF``/``HuggingFaceTokenizer``) or GPT-2 BPE files, the tokenizer files. The family
follows the recorded model flags (``model_args.json``): learned absolute positions ->
``GPT2LMHeadModel``, RoPE -> ``LlamaForCausalLM`` (with ``--num-experts``: ``MixtralForCausalLM``,
the experts under the Hub's per-expert names), ALiBi -> ``BloomForCausalLM``; flags the class
cannot represent (for Mixtral: routers other than its renormalised top-k softmax, shared experts,
dense layers, token dropping) are refused naming the flag (megatron/checkpoint/hf/).

Tensors are read one at a time from the memory-mapped checkpoint files (their pages released once
used, megatron/checkpoint/reader.py) and streamed into the safetensors files, whose
headers are planned from the shards' metadata first, so peak memory is about the largest tensor.
Weights keep the checkpoint's dtype. The vocabulary keeps the rows that take probability (the
recorded ``vocab_size``, the tokenizer's vocabulary): the padding rows that Megatron adds (a
multiple of ``--make-vocab-size-divisible-by`` x TP) get ``-inf`` logits here, while transformers
would softmax over them, so they are dropped. ``bos_token_id``/``eos_token_id`` are the
tokenizer's.
"""
import argparse
import json
import math
import os
import shutil
import sys
from typing import List, Optional, Tuple

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir)))

from megatron.runtime.known_warnings import quiet_known_warnings  # noqa: E402

quiet_known_warnings()

import torch  # noqa: E402

from megatron.checkpoint.model_args import resolve_tokenizer_paths  # noqa: E402
from megatron.checkpoint.reader import CheckpointReader  # noqa: E402
from megatron.errors import ConfigError  # noqa: E402
from megatron.model.param_names import VOCAB_PARAMETERS  # noqa: E402
from megatron.runtime.process_exit import run_entry_point  # noqa: E402
from megatron.tokenizer.types import tokenizer_config  # noqa: E402

# Tokenizer files transformers' AutoTokenizer reads from a model directory.
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                      "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json",
                      "generation_config.json")


def parse_size(text: str) -> int:
    """Bytes of ``text`` such as ``2GB``, ``500MB``, ``1024`` (decimal units, as transformers)."""
    units = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "B": 1}
    upper = text.strip().upper()
    for unit, factor in units.items():
        if upper.endswith(unit):
            try:
                value = float(upper[:-len(unit)]) * factor
            except ValueError:
                break
            if value > 0:
                return int(value)
            break
    else:
        if upper.isdigit() and int(upper) > 0:
            return int(upper)
    raise ConfigError(f"--max-shard-size {text!r}: expected a positive size such as 2GB, 500MB or "
                      "a number of bytes")


def get_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--load", required=True, help="Checkpoint directory (a training run's --save).")
    p.add_argument("--iteration", type=int, default=None,
                   help="Iteration to export (default: the latest complete checkpoint).")
    p.add_argument("--output", required=True, help="Transformers model directory to write.")
    p.add_argument("--max-shard-size", default="2GB",
                   help="Largest safetensors file; larger models are sharded (default 2GB).")
    return p.parse_args(argv)


_SAFETENSORS_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                       torch.float64: "F64"}

TensorPlan = List[Tuple[str, Tuple[int, ...], torch.dtype]]


class SafetensorsStreamWriter:
    """Writes tensors announced in advance (``plan``: name, shape, dtype, in writing order) into
    safetensors files of at most ``max_bytes`` each (a larger tensor gets a file of its own) and,
    when there are several, transformers' ``model.safetensors.index.json``. Each file's header is
    written first, then every tensor's bytes as :meth:`write` receives it, so only the tensor being
    written is in memory."""

    def __init__(self, output: str, plan: TensorPlan, max_bytes: int):
        self.output, self.plan = output, plan
        groups: List[TensorPlan] = []
        size = 0
        for entry in plan:
            nbytes = math.prod(entry[1]) * entry[2].itemsize
            if not groups or (size + nbytes > max_bytes and groups[-1]):
                groups.append([])
                size = 0
            groups[-1].append(entry)
            size += nbytes
        count = len(groups)
        self.names = (["model.safetensors"] if count == 1 else
                      [f"model-{k + 1:05d}-of-{count:05d}.safetensors" for k in range(count)])
        self.groups, self.total_bytes = groups, 0
        self.weight_map = {e[0]: self.names[k] for k, g in enumerate(groups) for e in g}
        self.position, self.file, self.file_index, self.in_file = 0, None, -1, 0

    def _open_next(self) -> None:
        if self.file is not None:
            self.file.close()
        self.file_index += 1
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for name, shape, dtype in self.groups[self.file_index]:
            nbytes = math.prod(shape) * dtype.itemsize
            header[name] = {"dtype": _SAFETENSORS_DTYPES[dtype], "shape": list(shape),
                            "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        self.file = open(os.path.join(self.output, self.names[self.file_index]), "wb")
        self.file.write(len(text).to_bytes(8, "little") + text)
        self.in_file = 0

    def write(self, name: str, tensor: torch.Tensor) -> None:
        """Write the next planned tensor (its name, shape and dtype must be the plan's)."""
        expected = self.plan[self.position]
        got = (name, tuple(tensor.shape), tensor.dtype)
        if got != expected:
            raise RuntimeError(f"tensor {got} written where the plan has {expected}")
        if self.file is None or self.in_file == len(self.groups[self.file_index]):
            self._open_next()
        data = tensor.detach().contiguous().view(torch.uint8).reshape(-1).numpy()
        self.file.write(memoryview(data))
        self.total_bytes += data.nbytes
        self.position += 1
        self.in_file += 1

    def finish(self) -> List[str]:
        """Close the last file, write the index when sharded; returns the weight file names."""
        if self.position != len(self.plan):
            raise RuntimeError(f"{len(self.plan) - self.position} planned tensors not written")
        if self.file is not None:
            self.file.close()
        if len(self.names) > 1:
            index = {"metadata": {"total_size": self.total_bytes}, "weight_map": self.weight_map}
            with open(os.path.join(self.output, "model.safetensors.index.json"), "w") as f:
                json.dump(index, f, indent=2, sort_keys=True)
        return self.names


def tokenizer_source(tokenizer_flags: dict) -> Optional[List[str]]:
    """The tokenizer files of a run to copy into the model directory, or None when the run's
    tokenizer has no transformers form (the built-in byte-level one)."""
    kind = tokenizer_flags.get("tokenizer_type")
    if kind in ("PretrainedFromHF", "HuggingFaceTokenizer"):
        where = tokenizer_flags.get("tokenizer_name_or_path") or tokenizer_flags.get("tokenizer_model")
        if where and os.path.isdir(where):
            return [os.path.join(where, f) for f in HF_TOKENIZER_FILES
                    if os.path.isfile(os.path.join(where, f))]
        if where and os.path.isfile(where):
            return [where]
        raise ConfigError(f"the checkpoint's tokenizer (--tokenizer-type {kind}) is at {where!r}, "
                          "which no longer exists; restore it to export the tokenizer files")
    if kind == "GPT2BPETokenizer":
        return [tokenizer_flags["vocab_file"], tokenizer_flags["merge_file"]]
    return None


def special_token_ids(tokenizer_flags: dict) -> dict:
    """``{"bos_token_id", "eos_token_id"}`` of the run's tokenizer (``model_args.json``
    ``tokenizer`` flags, paths resolved) for ``config.json``: generation in transformers stops
    at the eos id."""
    from megatron.tokenizer import build_tokenizer  # lazy: megatron-core (seconds)

    names = ("tokenizer_type", "vocab_file", "merge_file", "tokenizer_model",
             "tokenizer_name_or_path")  # the record's other keys (vocab_extra_ids) build nothing
    tokenizer = build_tokenizer(tokenizer_config(**{n: tokenizer_flags.get(n) for n in names}))
    return {"bos_token_id": getattr(tokenizer, "bos", None),
            "eos_token_id": getattr(tokenizer, "eos", None)}


def copy_tokenizer(tokenizer_flags: dict, output: str) -> List[str]:
    """Copy the run's tokenizer files into ``output``; returns the names written."""
    files = tokenizer_source(tokenizer_flags)
    if files is None:
        return []
    written = []
    kind = tokenizer_flags.get("tokenizer_type")
    for path in files:
        name = os.path.basename(path)
        if kind == "GPT2BPETokenizer":
            name = "vocab.json" if path == tokenizer_flags["vocab_file"] else "merges.txt"
        shutil.copyfile(path, os.path.join(output, name))
        written.append(name)
    if kind == "GPT2BPETokenizer":
        with open(os.path.join(output, "tokenizer_config.json"), "w") as f:
            json.dump({"tokenizer_class": "GPT2Tokenizer", "model_max_length": 1 << 30}, f, indent=2)
        written.append("tokenizer_config.json")
    return written


def convert(load: str, output: str, iteration: Optional[int] = None,
            max_shard_size: str = "2GB") -> dict:
    """Export the checkpoint (see the module docstring); returns a summary ``{"family",
    "iteration", "files", "tokenizer_files", "parameters", "bytes"}``."""
    from megatron.checkpoint.hf.families import (  # lazy: megatron-core (seconds); not --help
        canonical_names,
        canonical_shapes,
        check_exportable,
        hf_config,
        to_hf,
    )

    max_bytes = parse_size(max_shard_size)
    if os.path.isdir(output) and os.listdir(output):
        raise ConfigError(f"--output {output} exists and is not empty; give a new directory")
    with CheckpointReader(load, iteration) as reader:
        if reader.model_args is None:
            raise ConfigError(f"--load {load}: checkpoint {reader.directory} has no model_args.json "
                              "(written before checkpoints recorded their model flags), so its "
                              "architecture is unknown")
        flags = reader.model_args["model"]
        family = check_exportable(flags)
        expected = canonical_names(flags)
        if sorted(expected) != sorted(reader.names):
            missing = sorted(set(expected) - set(reader.names))
            extra = sorted(set(reader.names) - set(expected))
            raise ConfigError(f"--load {load}: checkpoint {reader.directory} does not match its "
                              f"model flags (missing {missing[:4]}, unexpected {extra[:4]})")
        # plan every transformers tensor from the shards' metadata (shapes checked against the
        # recorded flags before anything is written), then stream them one at a time
        vocab_rows = reader.shape("embedding.word_embeddings.weight")[0]
        dtype = reader.dtype("embedding.word_embeddings.weight")
        shapes = canonical_shapes(flags, vocab_rows)
        # transformers softmaxes over every lm_head row: export only the rows that take
        # probability here (the padding rows beyond them get -inf logits in this project)
        real_rows = min(int(reader.model_args.get("vocab_size") or vocab_rows), vocab_rows)
        plan: TensorPlan = []
        for name in reader.names:
            if reader.shape(name) != shapes[name]:
                raise ConfigError(f"--load {load}: {name} in {reader.directory} is "
                                  f"{list(reader.shape(name))}, its model flags give "
                                  f"{list(shapes[name])}")
            shape = (real_rows, *shapes[name][1:]) if name in VOCAB_PARAMETERS else shapes[name]
            meta = torch.empty(shape, dtype=reader.dtype(name), device="meta")
            plan += [(n, tuple(t.shape), t.dtype) for n, t in to_hf(name, meta, flags)]
        os.makedirs(output, exist_ok=True)
        writer = SafetensorsStreamWriter(output, plan, max_bytes)
        parameters = 0
        for name in reader.names:
            tensor = reader.tensor(name)
            if name in VOCAB_PARAMETERS:
                tensor = tensor[:real_rows]
            parameters += tensor.numel()
            for hf_name, hf_tensor in to_hf(name, tensor, flags):
                writer.write(hf_name, hf_tensor)
            del tensor
        files = writer.finish()
        summary_iteration = reader.iteration
    # relative tokenizer paths (an imported checkpoint's) are relative to the checkpoint root
    tokenizer_flags = resolve_tokenizer_paths(reader.model_args.get("tokenizer") or {}, load)
    config = hf_config(flags, real_rows, dtype, special_token_ids(tokenizer_flags))
    with open(os.path.join(output, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    tokenizer_files = copy_tokenizer(tokenizer_flags, output)
    return {"family": family.architecture, "iteration": summary_iteration, "files": files,
            "tokenizer_files": tokenizer_files, "parameters": parameters,
            "bytes": writer.total_bytes}


def main(argv=None):
    args = get_args(argv)
    summary = convert(args.load, args.output, args.iteration, args.max_shard_size)
    note = (f"tokenizer files: {', '.join(summary['tokenizer_files'])}" if summary["tokenizer_files"]
            else "no tokenizer files (the run's tokenizer has no transformers form)")
    print(f"wrote {args.output}: {summary['family']}, iteration {summary['iteration']}, "
          f"{summary['parameters']} parameters in {', '.join(summary['files'])}; {note}")


if __name__ == "__main__":
    run_entry_point(main)
