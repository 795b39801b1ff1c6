"""Torch optimizers for the DeepSpeed engine, with Megatron's weight-decay parameter groups."""
from typing import Dict, List

import torch
from megatron.core.optimizer import OptimizerConfig


def param_groups(model: torch.nn.Module) -> List[Dict]:
    """Two groups: weights with weight decay, and biases / norm parameters without
    (``wd_mult`` 0, the key the LR/WD scheduler multiplies the decay by); with expert-parallel
    experts, each also split into its dense and its expert (``moe``) part."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if param.ndim == 1 or name.endswith(".bias"):
            no_decay.append(param)
        else:
            decay.append(param)
    groups = [{"params": decay, "wd_mult": 1.0, "lr_mult": 1.0, "name": "decay"}]
    if no_decay:
        groups.append({"params": no_decay, "wd_mult": 0.0, "lr_mult": 1.0, "name": "no_decay"})
    from deepspeed.moe.utils import is_moe_param, split_params_into_different_moe_groups_for_optimizer

    if any(is_moe_param(p) for g in groups for p in g["params"]):
        # expert-parallel experts (megatron/parallel/experts.py): DeepSpeed's own split puts them
        # in groups marked moe, which ZeRO partitions over their expert-data-parallel group
        groups = split_params_into_different_moe_groups_for_optimizer(groups)
    return groups


def adamw_kernel() -> Dict[str, bool]:
    """torch AdamW's kernel choice: ``fused=True`` (one fused kernel over all tensors; no apex)
    when DeepSpeed's accelerator is CUDA, torch's default kernel elsewhere."""
    from deepspeed.accelerator import get_accelerator

    return {"fused": True} if get_accelerator().device_name() == "cuda" else {}


def build_optimizer(config: OptimizerConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    """The torch optimizer of megatron-core's ``OptimizerConfig`` (the run's, from the optimizer
    flags: megatron/config/run_config.py): ``--optimizer adam`` (AdamW: decoupled decay as Megatron; fused on CUDA, see
    :func:`adamw_kernel`), ``sgd`` or ``adafactor``. Under mixed precision DeepSpeed's wrapper
    hands it fp32 master weights (megatron/optim/precision.py). The learning rate and weight decay set
    here are placeholders; the scheduler drives both."""
    groups = param_groups(model)
    if config.optimizer == "adam":
        return torch.optim.AdamW(groups, lr=config.lr, weight_decay=config.weight_decay,
                                 betas=(config.adam_beta1, config.adam_beta2), eps=config.adam_eps,
                                 **adamw_kernel())
    if config.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=config.lr, weight_decay=config.weight_decay,
                               momentum=config.sgd_momentum)
    if config.optimizer == "adafactor":
        return torch.optim.Adafactor(groups, lr=config.lr, weight_decay=config.weight_decay)
    raise ValueError(f"--optimizer {config.optimizer}: expected one of adam, sgd, adafactor")
