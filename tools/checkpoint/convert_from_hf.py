#!/usr/bin/env python
"""Import a Hugging Face transformers model directory as a checkpoint to finetune from.

    python tools/checkpoint/convert_from_hf.py --hf HF_DIR --save DIR
        [--tensor-model-parallel-size T] [--pipeline-model-parallel-size P]

reads ``HF_DIR/config.json`` and its safetensors weights (``model.safetensors`` or an index of
shards; ``pytorch_model.bin`` too) of a GPT-2, Llama, Mixtral or BLOOM model and writes ``DIR/iter_0000000/``
for the layout T x P (default 1 x 1) with ``model_args.json`` (and, for P = 1,
``param_index.json``: the finetuning run may then use any layout), so that

    deepspeed pretrain_gpt.py --load DIR --finetune --use-checkpoint-args [data and training flags]

(or finetune_t0.py) starts from it without any model flag. A Mixtral model becomes a
mixture-of-experts checkpoint (``--num-experts``, ``--moe-router-topk``, ``--moe-ffn-hidden-size``
recorded; its experts read from the Hub's per-expert tensors or from transformers' fused
``gate_up_proj``/``down_proj``). The vocabulary keeps the model's rows
(recorded as ``--pad-vocab-size-to``). Tokenizer files found in ``HF_DIR`` are copied to
``DIR/tokenizer/`` and recorded as ``--tokenizer-type PretrainedFromHF``. Configurations this
project cannot build are refused naming the config key
(megatron/checkpoint/hf/).

Tensors are read one at a time from the files (no memory map), so peak memory is about one copy of
the weights.
"""
import argparse
import json
import os
import shutil
import sys
from typing import Callable, Dict

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir)))

from megatron.runtime.known_warnings import quiet_known_warnings  # noqa: E402

quiet_known_warnings()

import torch  # noqa: E402

from megatron.checkpoint.format import MODEL_ARGS_FORMAT_VERSION as FORMAT_VERSION  # noqa: E402
from megatron.checkpoint.writer import write_checkpoint  # noqa: E402
from megatron.errors import ConfigError  # noqa: E402
from megatron.runtime.process_exit import run_entry_point  # noqa: E402

_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
                       "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
                       "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
# Buffers some transformers checkpoints carry that are not weights.
_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq")
TOKENIZER_DIR = "tokenizer"


def get_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--hf", required=True, help="Transformers model directory (config.json + weights).")
    p.add_argument("--save", required=True, help="Checkpoint directory to write.")
    p.add_argument("--tensor-model-parallel-size", type=int, default=1,
                   help="Tensor-parallel size of the written checkpoint (that of the finetuning run).")
    p.add_argument("--pipeline-model-parallel-size", type=int, default=1,
                   help="Pipeline-parallel size of the written checkpoint.")
    return p.parse_args(argv)


class SafetensorsFiles:
    """Tensors of a safetensors model directory by name, each read from disk when asked (plain
    reads into a fresh buffer, so nothing stays mapped)."""

    def __init__(self, directory: str):
        index = os.path.join(directory, "model.safetensors.index.json")
        single = os.path.join(directory, "model.safetensors")
        if os.path.isfile(index):
            with open(index) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        elif os.path.isfile(single):
            files = ["model.safetensors"]
        else:
            raise FileNotFoundError
        self.where: Dict[str, tuple] = {}
        for name in files:
            path = os.path.join(directory, name)
            with open(path, "rb") as f:
                length = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(length))
            for key, info in header.items():
                if key != "__metadata__":
                    self.where[key] = (path, 8 + length, info)

    def get(self, name: str) -> torch.Tensor:
        path, base, info = self.where[name]
        start, end = info["data_offsets"]
        with open(path, "rb") as f:
            f.seek(base + start)
            data = bytearray(f.read(end - start))
        dtype = _SAFETENSORS_DTYPES[info["dtype"]]
        if not data:
            return torch.empty(info["shape"], dtype=dtype)
        return torch.frombuffer(data, dtype=dtype).reshape(info["shape"])


def open_weights(directory: str):
    """``(names, get)`` of the weights in ``directory``: safetensors, else ``pytorch_model.bin``."""
    try:
        files = SafetensorsFiles(directory)
        return set(files.where), files.get
    except FileNotFoundError:
        pass
    binary = os.path.join(directory, "pytorch_model.bin")
    if os.path.isfile(binary):
        state = torch.load(binary, map_location="cpu", mmap=True, weights_only=True)
        return set(state), state.__getitem__
    raise ConfigError(f"--hf {directory}: no model.safetensors, model.safetensors.index.json or "
                      "pytorch_model.bin")


def _resolver(names: set, get: Callable) -> Callable[[str], torch.Tensor]:
    """``get`` that also finds GPT-2 checkpoints saved without the ``transformer.`` prefix."""
    def resolve(name: str) -> torch.Tensor:
        if name in names:
            return get(name)
        short = name[len("transformer."):] if name.startswith("transformer.") else None
        if short in names:
            return get(short)
        raise KeyError(name)
    return resolve


def convert(hf_dir: str, save_dir: str, tp: int = 1, pp: int = 1) -> dict:
    """Import (see the module docstring); returns ``{"family", "directory", "parameters",
    "tokenizer"}``."""
    from megatron.checkpoint.hf.families import (  # lazy: megatron-core (seconds); not --help
        canonical_names,
        check_exportable,
        flags_from_hf_config,
        from_hf,
        hf_sources,
    )
    from megatron.checkpoint.hf.mixtral import MIXTRAL, per_expert_view  # lazy: megatron-core (seconds)

    config_path = os.path.join(hf_dir, "config.json")
    if not os.path.isfile(config_path):
        raise ConfigError(f"--hf {hf_dir}: no config.json (not a transformers model directory)")
    with open(config_path) as f:
        config = json.load(f)
    flags = flags_from_hf_config(config, hf_dir)
    family = check_exportable(flags)
    if tp < 1 or pp < 1:
        raise ConfigError(f"--tensor-model-parallel-size {tp} and --pipeline-model-parallel-size "
                          f"{pp} must be positive")
    for flag, value, what in (("--tensor-model-parallel-size", tp, "num_attention_heads"),
                              ("--tensor-model-parallel-size", tp, "vocab_size")):
        if config.get(what) and config[what] % value:
            raise ConfigError(f"{flag} {value} does not divide config.json {what}={config[what]}")
    if pp > flags["num_layers"]:
        raise ConfigError(f"--pipeline-model-parallel-size {pp} exceeds the {flags['num_layers']} layers")
    if os.path.isdir(save_dir) and os.listdir(save_dir):
        raise ConfigError(f"--save {save_dir} exists and is not empty; give a new directory")
    names, get = open_weights(hf_dir)
    if family is MIXTRAL:  # transformers' fused experts read as the Hub's per-expert tensors
        names, get = per_expert_view(names, get, flags["num_experts"])
    resolve = _resolver(names, get)
    tensors, used = {}, set()
    for name in canonical_names(flags):
        sources = hf_sources(name, flags)
        absent = [s for s in sources if s not in names and s[len("transformer."):] not in names]
        if absent:
            raise ConfigError(f"--hf {hf_dir}: weight {absent[0]} is missing ({family.architecture} "
                              f"with this config.json has it)")
        used.update(sources)
        used.update(s[len("transformer."):] for s in sources)
        tensors[name] = from_hf(name, resolve, flags).contiguous()
    leftover = sorted(n for n in names - used if not n.endswith(_IGNORED_SUFFIXES)
                      and not (n == "lm_head.weight" and not flags["untie_embeddings_and_output_weights"]))
    if leftover:
        raise ConfigError(f"--hf {hf_dir}: weights this project's model has no place for: "
                          f"{', '.join(leftover[:5])}{' ...' if len(leftover) > 5 else ''}")
    tokenizer = {}
    hf_tokenizer_files = [f for f in ("tokenizer.json", "tokenizer_config.json",
                                      "special_tokens_map.json", "vocab.json", "merges.txt",
                                      "tokenizer.model", "added_tokens.json")
                          if os.path.isfile(os.path.join(hf_dir, f))]
    if any(f in hf_tokenizer_files for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        os.makedirs(os.path.join(save_dir, TOKENIZER_DIR), exist_ok=True)
        for f in hf_tokenizer_files:
            shutil.copyfile(os.path.join(hf_dir, f), os.path.join(save_dir, TOKENIZER_DIR, f))
        tokenizer = {"tokenizer_type": "PretrainedFromHF", "tokenizer_name_or_path": TOKENIZER_DIR}
    model_flags = {k: v for k, v in flags.items()}
    record = {"format_version": FORMAT_VERSION, "model": model_flags, "tokenizer": tokenizer,
              "defaults": {"seq_length": flags["max_position_embeddings"]},
              "padded_vocab_size": config["vocab_size"], "vocab_size": config["vocab_size"],
              "imported_from": os.path.abspath(hf_dir)}
    directory = write_checkpoint(save_dir, tensors, record, tp=tp, pp=pp)
    return {"family": family.architecture, "directory": directory,
            "parameters": sum(t.numel() for t in tensors.values()),
            "tokenizer": bool(tokenizer)}


def main(argv=None):
    args = get_args(argv)
    summary = convert(args.hf, args.save, args.tensor_model_parallel_size,
                      args.pipeline_model_parallel_size)
    note = (f"tokenizer in {os.path.join(args.save, TOKENIZER_DIR)}" if summary["tokenizer"]
            else "no tokenizer files in --hf: give the tokenizer flags when finetuning")
    print(f"wrote {summary['directory']}: {summary['family']}, {summary['parameters']} parameters; "
          f"{note}; finetune with --load {args.save} --finetune --use-checkpoint-args")


if __name__ == "__main__":
    run_entry_point(main)
