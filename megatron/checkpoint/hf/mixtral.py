"""Mixtral (``MixtralForCausalLM``: the Llama layers with every MLP a top-k softmax-routed set of
SwiGLU experts), chosen by ``--position-embedding-type rope`` with ``--num-experts``: its adapter
(Llama's, megatron/checkpoint/hf/llama.py, extended), :data:`MIXTRAL` and :func:`per_expert_view`.

- The Hub's per-expert names (which transformers' ``save_pretrained`` writes and loads):
  ``mlp.router.weight`` is ``block_sparse_moe.gate.weight``; expert E's (the global id)
  ``linear_fc1`` is ``[w1; w3]`` (gate; up) of ``block_sparse_moe.experts.E``, its ``linear_fc2``
  is ``w2``. transformers >= 5 holds the experts fused in memory (``mlp.experts.gate_up_proj``
  ``[E, 2 x ffn, hidden]`` = every expert's ``[w1; w3]``, ``mlp.experts.down_proj``); files in that
  form are read through :func:`per_expert_view`.
"""
import functools
import re
from typing import Callable, Dict, List, Optional, Set, Tuple

import torch

from megatron.checkpoint.hf.adapter import Getter, Refuse, layer_parts, moe_ffn_size, moe_pattern
from megatron.checkpoint.hf.llama import LlamaFamily

_MIXTRAL_LAYER = {"input_layernorm": "input_layernorm",
                  "pre_mlp_layernorm": "post_attention_layernorm",
                  "self_attention.linear_proj": "self_attn.o_proj",
                  "mlp.router": "block_sparse_moe.gate"}

# An expert's linear layer inside a layer (module path after ``decoder.layers.N.``): global id, layer.
_EXPERT = re.compile(r"mlp\.experts\.local_experts\.(\d+)\.(linear_fc1|linear_fc2)")


class MixtralFamily(LlamaFamily):
    """``MixtralForCausalLM``: Llama's layers (no biases) with every MLP routed experts."""

    name, architecture, model_type = "Mixtral", "MixtralForCausalLM", "mixtral"
    chosen_by = "--position-embedding-type rope with --num-experts"
    moe = True
    tied_by_default = False  # transformers' default: Mixtral unties, the older classes tie
    layer_table = _MIXTRAL_LAYER

    def check(self, flags: dict) -> None:
        """Llama's checks, then the first MoE flag ``MixtralForCausalLM`` cannot represent:
        Mixtral's router takes a softmax over every expert's logit, keeps the top-k and
        renormalises them to sum 1 (megatron-core's softmax over the top-k logits), every layer
        is MoE, every routed token is computed, no shared expert, no biases."""
        super().check(flags)
        experts, topk = flags["num_experts"], flags.get("moe_router_topk", 2)
        if not flags["disable_bias_linear"]:
            self.refuse("no --disable-bias-linear", "its linear layers and router have no biases")
        if not all(moe_pattern(flags)):
            self.refuse(f"--moe-layer-freq {flags.get('moe_layer_freq')}", "every layer of it is "
                        "MoE (--moe-layer-freq 1); it has no dense MLP layers")
        shared = flags.get("moe_shared_expert_intermediate_size")
        if shared:
            self.refuse(f"--moe-shared-expert-intermediate-size {shared}", "it has no shared expert")
        score = flags.get("moe_router_score_function", "softmax")
        if score != "softmax":
            self.refuse(f"--moe-router-score-function {score}", "its router scores the experts "
                        "with a softmax")
        if flags.get("moe_router_pre_softmax") and topk < experts:
            self.refuse("--moe-router-pre-softmax", f"its router renormalises the top-{topk} "
                        "probabilities to sum 1 (megatron-core's softmax over the top-k logits, without "
                        "--moe-router-pre-softmax); pre-softmax gates of the top "
                        f"{topk} of {experts} experts are the probabilities, not renormalised"
                        + (" (a top-1 Mixtral gate is always 1)" if topk == 1 else ""))
        capacity = flags.get("moe_expert_capacity_factor")
        if capacity is not None:
            self.refuse(f"--moe-expert-capacity-factor {capacity}", "its experts compute every "
                        "token routed to them (dropless); token dropping changes the outputs")
        balancing = flags.get("moe_router_load_balancing_type")
        if balancing == "sinkhorn":
            self.refuse("--moe-router-load-balancing-type sinkhorn", "Sinkhorn routing gates top-1 "
                        "by a sigmoid, its router by a renormalised softmax")

    def config_keys(self, flags: dict) -> dict:
        return {**self.llama_style_config(flags), "intermediate_size": moe_ffn_size(flags),
                "num_local_experts": flags["num_experts"],
                "num_experts_per_tok": flags["moe_router_topk"], "sliding_window": None,
                "router_jitter_noise": 0.0, "output_router_logits": False}

    def flags_from_config(self, config: dict, refuse: Refuse, base: dict) -> dict:
        """Model flags of a Mixtral ``config.json``: Llama's layers (no biases) with every MLP
        ``num_local_experts`` SwiGLU experts of ``intermediate_size``, top-``num_experts_per_tok``
        softmax routing renormalised over the chosen (megatron-core's softmax over the top-k
        logits), dropless, no shared expert. Defaults are transformers' ``MixtralConfig``'s."""
        window = config.get("sliding_window")
        if window is not None and window < config["max_position_embeddings"]:
            refuse("sliding_window", "attention here is over the whole sequence (no sliding window)")
        for key in ("attention_bias", "mlp_bias"):
            if config.get(key):
                refuse(key, "Mixtral has no biases")
        experts, topk = config.get("num_local_experts", 8), config.get("num_experts_per_tok", 2)
        if not 1 <= topk <= experts:
            refuse("num_experts_per_tok", f"must be between 1 and num_local_experts={experts}")
        if topk == 1:
            refuse("num_experts_per_tok", "a top-1 Mixtral gate is always 1, so its router learns "
                   "nothing; this project's top-1 router (--moe-router-topk 1 "
                   "--moe-router-pre-softmax) gates by the probability, another model")
        flags = self.llama_flags(config, refuse, base, theta_default=1e6, eps_default=1e-5)
        ffn = config["intermediate_size"]
        return {**flags, "ffn_hidden_size": ffn, "disable_bias_linear": True,
                "num_experts": experts, "moe_router_topk": topk, "moe_ffn_hidden_size": ffn,
                "moe_layer_freq": 1, "moe_shared_expert_intermediate_size": None,
                "moe_router_pre_softmax": False, "moe_router_score_function": "softmax",
                "moe_router_dtype": None, "moe_expert_capacity_factor": None,
                "moe_token_drop_policy": "probs"}

    def gated_fc1(self, name: str) -> Optional[List[str]]:
        """``[w1, w3]`` names (gate, up) of the Mixtral expert whose canonical ``linear_fc1`` is
        ``name``; None when ``name`` is not an expert's ``linear_fc1``."""
        layer, module, leaf = layer_parts(name)
        expert = _EXPERT.fullmatch(module) if layer is not None else None
        if not expert or expert.group(2) != "linear_fc1":
            return None
        prefix = f"{self.layers}.{layer}.block_sparse_moe.experts.{expert.group(1)}"
        return [f"{prefix}.w1.{leaf}", f"{prefix}.w3.{leaf}"]

    def one_to_one(self, name: str) -> Tuple[str, bool]:
        layer, module, leaf = layer_parts(name)
        expert = _EXPERT.fullmatch(module) if layer is not None else None
        if expert and expert.group(2) == "linear_fc2":
            return f"{self.layers}.{layer}.block_sparse_moe.experts.{expert.group(1)}.w2.{leaf}", False
        return super().one_to_one(name)


MIXTRAL = MixtralFamily()


# transformers >= 5's in-memory Mixtral experts: every expert of a layer in one 3-D tensor.
_FUSED_EXPERTS = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)")
_FUSED_GATE = re.compile(r"model\.layers\.(\d+)\.mlp\.gate\.weight")


def per_expert_view(names: Set[str], get: Getter, num_experts: int) -> Tuple[Set[str], Getter]:
    """``(names, get)`` of Mixtral weights with transformers' fused in-memory tensors
    (``model.layers.N.mlp.gate.weight``, ``mlp.experts.gate_up_proj`` ``[E, 2 x ffn, hidden]``,
    ``mlp.experts.down_proj`` ``[E, hidden, ffn]``, as ``state_dict()`` holds them in
    transformers >= 5) seen under the Hub's per-expert names (``block_sparse_moe.gate.weight``,
    ``block_sparse_moe.experts.E.w1/w3/w2.weight``) that :func:`hf_sources` asks for; the other
    names as they are (``num_experts``: the fused tensors' first dimension). A fused tensor is
    read once while the experts are taken in order (the last two read are kept)."""
    fused = functools.lru_cache(maxsize=2)(get)
    view: Dict[str, Callable[[], torch.Tensor]] = {}
    for name in names:
        gate, experts = _FUSED_GATE.fullmatch(name), _FUSED_EXPERTS.fullmatch(name)
        if gate:
            view[f"model.layers.{gate.group(1)}.block_sparse_moe.gate.weight"] = \
                functools.partial(get, name)
        elif experts:
            prefix = f"model.layers.{experts.group(1)}.block_sparse_moe.experts"
            for e in range(num_experts):
                if experts.group(2) == "down_proj":
                    view[f"{prefix}.{e}.w2.weight"] = functools.partial(_expert_slice, fused, name, e, None)
                else:
                    for half, w in enumerate(("w1", "w3")):
                        view[f"{prefix}.{e}.{w}.weight"] = functools.partial(
                            _expert_slice, fused, name, e, half)
        else:
            view[name] = functools.partial(get, name)
    return set(view), lambda name: view[name]()


def _expert_slice(fused: Getter, name: str, expert: int, half: Optional[int]) -> torch.Tensor:
    """Expert ``expert`` of the fused tensor ``name`` (a copy); ``half`` 0/1: the gate/up rows of
    ``gate_up_proj``, None: the whole matrix."""
    tensor = fused(name)[expert]
    if half is not None:
        tensor = torch.chunk(tensor, 2, dim=0)[half]
    return tensor.clone()
