"""Checkpoint interop in a run: a Hugging Face Llama imported with convert_from_hf.py (TP 1) starts
a --finetune at TP 2 through the deepspeed launcher with --use-checkpoint-args and no model
flags, and its checkpoint exports back (convert_to_hf.py) to the imported weights bit for bit. In
process: tests/unit/test_hf_conversion.py."""
import json
import os
import subprocess
import sys

import pytest
import torch

from helpers.hf import read_safetensors
from helpers.launch import read_jsonl, run_deepspeed
from helpers.paths import ROOT

pytestmark = pytest.mark.launch


def test_finetune_starts_from_an_imported_checkpoint_without_model_flags(demo_data, tmp_path):
    """convert_from_hf.py's (TP 1) checkpoint, loaded by pretrain_gpt.py at TP 2 (resharded
    through its param_index.json) with --finetune --use-checkpoint-args and no model flag: trains
    (finite loss), saves a TP 2 checkpoint recording the model flags, and (lr 0) that checkpoint
    exports back to the imported weights bit for bit."""
    import transformers

    torch.manual_seed(3)
    config = transformers.LlamaConfig(vocab_size=384, hidden_size=64, intermediate_size=96,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64,
                                      tie_word_embeddings=False)
    transformers.LlamaForCausalLM(config).save_pretrained(str(tmp_path / "hf"))
    from tools.checkpoint.convert_from_hf import main as import_main

    import_main(["--hf", str(tmp_path / "hf"), "--save", str(tmp_path / "imported")])
    proc = run_deepspeed("pretrain_gpt.py", [
        "--load", str(tmp_path / "imported"), "--finetune", "--use-checkpoint-args",
        "--tensor-model-parallel-size", "2",
        "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "4",
        "--train-iters", "1", "--lr", "0", "--hidden-dropout", "0", "--attention-dropout", "0",
        "--transformer-impl", "local", "--data-path", demo_data["web"], "--split", "98,1,1",
        "--data-cache-path", str(tmp_path / "cache"), "--eval-iters", "0", "--log-interval", "1",
        "--metrics-jsonl", str(tmp_path / "metrics.jsonl"), "--save", str(tmp_path / "out")])
    assert "--finetune: loaded the model weights" in proc.stdout
    assert "resharded " in proc.stdout and "tensor-parallel 1" in proc.stdout
    loss = read_jsonl(tmp_path / "metrics.jsonl")[0]["lm_loss"]
    assert 0 < loss < 10
    saved = json.loads((tmp_path / "out" / "iter_0000001" / "model_args.json").read_text())
    assert saved["model"]["num_query_groups"] == 2 and saved["model"]["swiglu"] is True
    assert saved["padded_vocab_size"] == 384
    tool = os.path.join(ROOT, "tools", "checkpoint", "convert_to_hf.py")
    out = subprocess.run([sys.executable, tool, "--load",
                          str(tmp_path / "out"), "--output", str(tmp_path / "back")],
                         capture_output=True, text=True, check=True).stdout
    assert "LlamaForCausalLM, iteration 1" in out
    original, back = read_safetensors(tmp_path / "hf"), read_safetensors(tmp_path / "back")
    assert original.keys() == back.keys()
    assert all(torch.equal(original[k], back[k]) for k in original)
