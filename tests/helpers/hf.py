"""Tiny models, checkpoints and exports of the Hugging Face conversion tests (tests/unit/
test_hf_conversion.py, test_hf_mixtral.py, test_checkpoint_package.py, tests/e2e/test_moe_e2e.py):
in-process, fp32 on the CPU; the model-parallel state comes from the ``tp1`` fixture (conftest)."""
import os

import torch

from helpers.flags import TINY_MODEL
from megatron.config.parser import parse_args

BASE = ["--seq-length", "16", "--micro-batch-size", "2", "--train-iters", "1", "--lr", "1e-3",
        "--hidden-dropout", "0", "--attention-dropout", "0", "--transformer-impl", "local"]
SHAPE = TINY_MODEL
FAMILIES = {
    "gpt2": SHAPE + ["--openai-gelu"],
    "llama": SHAPE + ["--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
                      "--num-query-groups", "2", "--untie-embeddings-and-output-weights",
                      "--disable-bias-linear", "--rotary-base", "5000", "--norm-epsilon", "1e-6"],
    "bloom": SHAPE + ["--position-embedding-type", "alibi", "--embed-layernorm", "--openai-gelu"],
}
VOCAB = 256


def our_args(flags, load=None):
    """Validated args of ``flags``; with ``load``, ``--load load --use-checkpoint-args``."""
    args = parse_args(BASE + flags + (["--load", load, "--use-checkpoint-args"] if load else []),
                      world_size=1, require_data=False)
    if getattr(args, "checkpoint_model_args", None):
        args.padded_vocab_size = args.checkpoint_model_args["padded_vocab_size"]
    else:
        args.padded_vocab_size = VOCAB
    return args


def our_model(args, seed=0):
    """GPTModel of ``args`` with every weight perturbed (norm weights and biases included)."""
    from helpers.models import gpt_model

    model = gpt_model(args)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model.eval()


def saved_perturbed(model, directory):
    """``model`` (a transformers model) with every weight moved by 0.05 x noise (norms and biases
    away from their ones and zeros), saved to ``directory``; returned in eval mode."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(str(directory))
    return model.eval()


def our_logits(model, tokens):
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    with torch.no_grad():
        return model(tokens, positions, None).float()


def tokens(batch=2, length=16, vocab=VOCAB, seed=1):
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def save_model(model, args, directory, tp=1, pp=1):
    from megatron.checkpoint.writer import write_checkpoint
    from megatron.config.checkpoint_args import model_args_from_args

    full = {n: p.detach().clone() for n, p in model.named_parameters()}
    return write_checkpoint(str(directory), full, model_args_from_args(args), tp=tp, pp=pp)


def export(load, output, **kw):
    from tools.checkpoint.convert_to_hf import convert

    return convert(str(load), str(output), **kw)


def read_safetensors(directory):
    from safetensors.torch import load_file

    out = {}
    for f in sorted(os.listdir(directory)):
        if f.endswith(".safetensors"):
            out.update(load_file(os.path.join(directory, f)))
    return out


def hf_mixtral(directory):
    """``MixtralForCausalLM`` loaded from ``directory`` in fp32, and the keys it missed."""
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32,
                                                       output_loading_info=True)
    assert type(model).__name__ == "MixtralForCausalLM"
    return model.eval(), info["missing_keys"] | set(info["unexpected_keys"])
