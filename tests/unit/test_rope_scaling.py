"""RoPE's scalings (docs/position_encodings.md): Megatron-LM's flags, megatron-core's formulas,
each equal to transformers' ``LlamaForCausalLM`` with the matching ``rope_parameters``.

In-process, fp32 on the CPU. The peer is transformers: a tiny Llama-style model with each
scaling is exported (tools/checkpoint/convert_to_hf.py) and its logits compared with ours on the
same weights at positions past the original length; transformers models with each scaling are
imported (convert_from_hf.py) and score as transformers does, and export back with the same rope
parameters. The pipe model (GPTModelPipe) equals GPTModel with each scaling. Flags that need
another position encoding, and values out of range, are refused in one line naming them.
"""
import json

import pytest
import torch

from helpers.flags import one_error_line
from helpers.hf import FAMILIES, VOCAB, export, our_args, our_logits, our_model, save_model, saved_perturbed, tokens
from megatron.config.parser import parse_args
from megatron.errors import ConfigError

# (flags, transformers' rope_type, sequence length, the original length it extends)
SCALINGS = {
    "default": ([], "default", 256, 64),
    "linear": (["--rotary-seq-len-interpolation-factor", "4"], "linear", 256, 64),
    # megatron-core's Llama 3.1 scaling keeps transformers' original length 8192
    "llama3": (["--use-rope-scaling", "--rope-scaling-factor", "16"], "llama3", 8192 + 128, 8192),
    "yarn": (["--position-embedding-type", "yarn", "--rotary-scaling-factor", "4",
              "--yarn-original-max-position-embeddings", "64"], "yarn", 256, 64),
    # DeepSeek-style mscale pair, other betas, fractional correction range
    "yarn-mscale": (["--position-embedding-type", "yarn", "--rotary-scaling-factor", "8",
                     "--yarn-original-max-position-embeddings", "32", "--yarn-beta-fast", "16",
                     "--yarn-beta-slow", "2", "--mscale", "0.7", "--mscale-all-dim", "0.3",
                     "--no-yarn-correction-range-round-to-int"], "yarn", 256, 32),
}


def scaled_args(name, length):
    flags, _, _, _ = SCALINGS[name]
    return our_args(FAMILIES["llama"] + ["--max-position-embeddings", str(length)] + flags)


def hf_model(directory):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32)
    assert type(model).__name__ == "LlamaForCausalLM"
    return model.eval()


@pytest.mark.parametrize("name", sorted(SCALINGS))
def test_exported_scaled_rope_gives_transformers_logits(tp1, tmp_path, name):
    """Our logits equal transformers' (1e-5) on the same weights, past the original length too;
    the scaling is in effect (the logits there differ from the unscaled model's)."""
    _, rope_type, length, original = SCALINGS[name]
    args = scaled_args(name, length)
    model = our_model(args)
    save_model(model, args, tmp_path / "ckpt")
    export(tmp_path / "ckpt", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["rope_parameters"]["rope_type"] == rope_type
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"] == 5000.0
    assert config.get("rope_scaling", {"rope_type": "default"})["rope_type"] == rope_type
    hf = hf_model(tmp_path / "hf")
    assert hf.config.rope_parameters["rope_type"] == rope_type
    x = tokens(batch=1, length=length)
    ours = our_logits(model, x)
    with torch.no_grad():
        theirs = hf(x).logits
    assert (ours - theirs).abs().max().item() < 1e-5
    assert (ours[:, original:] - theirs[:, original:]).abs().max().item() < 1e-5
    if name != "default":
        unscaled = our_model(scaled_args("default", length))
        assert (our_logits(unscaled, x)[:, original:] - ours[:, original:]).abs().max() > 1e-3


def random_llama(directory, rope_parameters, max_positions=256):
    """A transformers ``LlamaForCausalLM`` of a random tiny config with ``rope_parameters``,
    saved in ``directory``."""
    import transformers

    torch.manual_seed(7)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=max_positions,
                                      rope_parameters={"rope_theta": 20000.0, **rope_parameters},
                                      rms_norm_eps=1e-5, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config)
    return saved_perturbed(model, directory)


IMPORTED = {
    "linear": ({"rope_type": "linear", "factor": 2.5},
               {"position_embedding_type": "rope", "rotary_seq_len_interpolation_factor": 2.5}),
    "llama3": ({"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
               {"position_embedding_type": "rope", "use_rope_scaling": True,
                "rope_scaling_factor": 32.0}),
    # Qwen2.5-style: factor and original length only
    "yarn": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
             {"position_embedding_type": "yarn", "rotary_scaling_factor": 4.0,
              "yarn_original_max_position_embeddings": 64, "mscale": 1.0, "mscale_all_dim": 0.0}),
    # DeepSeek-V3-style: mscale = mscale_all_dim (attention factor 1), betas given
    "yarn-deepseek": ({"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 32,
                       "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
                      {"position_embedding_type": "yarn", "rotary_scaling_factor": 40.0,
                       "mscale": 1.0, "mscale_all_dim": 1.0}),
}


@pytest.mark.parametrize("name", sorted(IMPORTED))
def test_imported_scaled_rope_scores_as_transformers_and_exports_back(tp1, tmp_path, name):
    from megatron.checkpoint.reader import load_full_state_dict
    from tools.checkpoint.convert_from_hf import convert as import_hf

    rope, expected_flags = IMPORTED[name]
    hf = random_llama(tmp_path / "hf", rope)
    import_hf(str(tmp_path / "hf"), str(tmp_path / "ckpt"))
    args = our_args([], load=str(tmp_path / "ckpt"))  # --use-checkpoint-args
    for dest, value in expected_flags.items():
        assert getattr(args, dest) == value, dest
    model = our_model(args)
    state, _ = load_full_state_dict(str(tmp_path / "ckpt"))
    model.load_state_dict(state, strict=False)
    x = tokens(batch=1, length=256)
    with torch.no_grad():
        theirs = hf(x).logits
    assert (our_logits(model, x) - theirs).abs().max().item() < 1e-5
    export(tmp_path / "ckpt", tmp_path / "out")
    back = json.loads((tmp_path / "out" / "config.json").read_text())["rope_parameters"]
    assert back["rope_type"] == rope["rope_type"] and back["rope_theta"] == 20000.0
    for key, value in rope.items():
        if key not in ("mscale", "mscale_all_dim"):  # transformers' defaults written out
            assert back[key] == value, key
    with torch.no_grad():
        assert (hf_model(tmp_path / "out")(x).logits - theirs).abs().max().item() < 1e-5


@pytest.mark.parametrize("rope,message", [
    ({"rope_type": "dynamic", "factor": 2.0}, "rope_type 'dynamic': supported are default, linear, llama3 and yarn"),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 2.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192},
     "llama3 low_freq_factor 2.0: megatron-core's Llama 3.1 scaling has 1"),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 4096},
     "llama3 original_max_position_embeddings 4096: megatron-core's Llama 3.1 scaling has 8192"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
      "attention_factor": 1.0}, "yarn attention_factor 1.0 is not the 1.13863 megatron-core computes"),
])
def test_import_refuses_rope_parameters_megatron_core_cannot_compute(tmp_path, rope, message):
    from tools.checkpoint.convert_from_hf import convert as import_hf

    (tmp_path / "hf").mkdir()
    config = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
              "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 256,
              "vocab_size": VOCAB, "rope_parameters": {"rope_theta": 10000.0, **rope}}
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="config.json rope_parameters=") as e:
        import_hf(str(tmp_path / "hf"), str(tmp_path / "ckpt"))
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("name", ["llama3", "yarn-mscale"])
def test_pipe_model_equals_gpt_model_with_scaled_rope(one_rank_model_parallel, name):
    """GPTModelPipe (one stage) builds the same rotary embedding per layer as GPTModel: the same
    loss on the same weights (YaRN's attention factor applied by the attention in both)."""
    from helpers.models import gpt_model, gpt_model_pipe
    from megatron.model.lm_loss import masked_lm_loss
    from megatron.model.pipe_io import pipe_batch

    args = scaled_args(name, 64)
    reference = gpt_model(args).eval()
    pipe = gpt_model_pipe(args).eval()
    pipe.load_canonical_state_dict(dict(reference.named_parameters()))
    x = tokens(batch=2, length=64)
    data = {"tokens": x, "labels": torch.roll(x, -1, 1),
            "position_ids": torch.arange(64).expand(2, 64).contiguous(),
            "loss_mask": torch.ones(2, 64), "dataset_id": torch.tensor([0, 0])}
    with torch.no_grad():
        per_token = reference(x, data["position_ids"], None, labels=data["labels"])
        expected, _ = masked_lm_loss(per_token, data["loss_mask"])
        inputs, labels = pipe_batch(data)
        got = pipe.loss_fn(pipe(inputs), labels)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    pipe.loss_function.pop_records()


BASE = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", "16", "--micro-batch-size", "2", "--train-iters", "1", "--lr", "1e-3"]


@pytest.mark.parametrize("flags,message", [
    (["--rotary-seq-len-interpolation-factor", "2"],
     "--rotary-seq-len-interpolation-factor 2 configure RoPE scaling (YaRN scales by "
     "--rotary-scaling-factor), but --position-embedding-type is learned_absolute; they need "
     "--position-embedding-type rope"),
    (["--position-embedding-type", "yarn", "--use-rope-scaling"],
     "--use-rope-scaling configure RoPE scaling (YaRN scales by --rotary-scaling-factor), but "
     "--position-embedding-type is yarn"),
    (["--position-embedding-type", "rope", "--rotary-scaling-factor", "4", "--mscale", "0.5"],
     "--rotary-scaling-factor 4, --mscale 0.5 configure YaRN, but --position-embedding-type is "
     "rope; they need --position-embedding-type yarn"),
    (["--rotary-base", "500000"], "--rotary-base 500000 configure rotary position embeddings, "
     "but --position-embedding-type is learned_absolute; they need --position-embedding-type "
     "rope or yarn"),
    (["--position-embedding-type", "rope", "--rope-scaling-factor", "4"],
     "--rope-scaling-factor 4 needs --use-rope-scaling"),
    (["--position-embedding-type", "rope", "--use-rope-scaling",
      "--rotary-seq-len-interpolation-factor", "2"], "choose one RoPE scaling"),
    (["--position-embedding-type", "rope", "--rotary-seq-len-interpolation-factor", "0.5"],
     "--rotary-seq-len-interpolation-factor 0.5: must be >= 1"),
    (["--position-embedding-type", "rope", "--use-rope-scaling", "--rope-scaling-factor", "0"],
     "--rope-scaling-factor 0: must be >= 1"),
    (["--position-embedding-type", "rope", "--rotary-base", "0"],
     "--rotary-base 0: must be a positive integer"),
    (["--position-embedding-type", "yarn", "--rotary-scaling-factor", "0.5"],
     "--rotary-scaling-factor 0.5: must be >= 1"),
    (["--position-embedding-type", "yarn", "--yarn-original-max-position-embeddings", "0"],
     "--yarn-original-max-position-embeddings 0: must be >= 1"),
    (["--position-embedding-type", "yarn", "--yarn-beta-fast", "1", "--yarn-beta-slow", "2"],
     "--yarn-beta-fast 1: must be > --yarn-beta-slow 2"),
    (["--position-embedding-type", "yarn", "--mscale-all-dim", "-1"],
     "--mscale-all-dim -1: must be >= 0"),
    (["--position-embedding-type", "yarn", "--rotary-percent", "0.5"],
     "--rotary-percent 0.5 with --position-embedding-type yarn: megatron-core's YaRN rotates "
     "every channel of each head"),
])
def test_position_encoding_flags_are_refused_in_one_line(flags, message, capsys):
    assert message in one_error_line(BASE + flags, capsys, require_data=False)


def test_yarn_flags_reach_megatron_cores_config_and_records(tmp_path):
    """YaRN's flags are the TransformerConfig's yarn_* attributes megatron-core reads (only for
    yarn), compared by the config's equality, and recorded in model_args.json."""
    from megatron.config.checkpoint_args import model_args_from_args

    yarn = ["--position-embedding-type", "yarn", "--rotary-scaling-factor", "4",
            "--yarn-beta-fast", "16"]
    args = parse_args(BASE + yarn, world_size=1, require_data=False)
    config = args.run_config.transformer
    assert (config.yarn_rotary_scaling_factor, config.yarn_beta_fast, config.yarn_beta_slow,
            config.yarn_original_max_position_embeddings, config.yarn_mscale,
            config.yarn_mscale_all_dim, config.yarn_correction_range_round_to_int) == (
        4.0, 16.0, 1.0, 4096, 1.0, 0.0, True)
    other = parse_args(BASE + yarn[:-1] + ["32"], world_size=1, require_data=False)
    assert config != other.run_config.transformer
    assert config == parse_args(BASE + yarn, world_size=1, require_data=False).run_config.transformer
    rope = parse_args(BASE + ["--position-embedding-type", "rope"], world_size=1,
                      require_data=False).run_config.transformer
    assert not hasattr(rope, "yarn_rotary_scaling_factor")
    record = model_args_from_args(args)["model"]
    assert record["rotary_scaling_factor"] == 4.0 and record["yarn_beta_fast"] == 16.0
