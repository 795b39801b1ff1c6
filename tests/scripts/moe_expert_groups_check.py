"""Launched by tests/e2e/test_moe_e2e.py on 4 CPU ranks (not a test module itself).

Builds the MoE model and DeepSpeed engine of the training loop (``setup_model_and_optimizer``) at
data-parallel 4 x expert-parallel 2 (so each expert lives on 2 ranks: its expert-data-parallel
group) and ZeRO stage 1, trains three steps on micro-batches that differ on every rank, and writes
for every parameter this rank holds its canonical name, its value's sum and its bytes' SHA-256,
plus this rank's expert-parallel and expert-data-parallel ranks, to ``OUT/rank{R}.json``.

    deepspeed --num_gpus 4 tests/scripts/moe_expert_groups_check.py OUT
"""
import hashlib
import json
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

SEQ, VOCAB = 16, 128
FLAGS = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
         "--seq-length", str(SEQ), "--micro-batch-size", "2", "--global-batch-size", "8",
         "--train-iters", "3", "--lr", "1e-2", "--hidden-dropout", "0", "--attention-dropout", "0",
         "--transformer-impl", "local", "--swiglu", "--normalization", "RMSNorm",
         "--position-embedding-type", "rope", "--disable-bias-linear", "--seed", "3",
         "--num-experts", "4", "--moe-router-topk", "2", "--moe-aux-loss-coeff", "0.01",
         "--expert-model-parallel-size", "2", "--zero-stage", "1"]


def main(out_dir: str) -> None:
    from megatron.core import parallel_state

    from megatron.checkpoint.engine_index import canonical_namer
    from megatron.config.parser import parse_args
    from megatron.metrics.moe import moe_training
    from megatron.model.gpt_model_pipe import gpt_model_for_layout
    from megatron.parallel.initialize import initialize_distributed, set_seeds
    from megatron.train.engine_setup import setup_model_and_optimizer
    from megatron.train.steps import gpt_forward_step

    args = parse_args(FLAGS, world_size=4, require_data=False)
    args.padded_vocab_size = VOCAB
    run = args.run_config
    initialize_distributed(run.model.layout, args.distributed_backend)
    set_seeds(args.seed)
    engine, _, _ = setup_model_and_optimizer(run, gpt_model_for_layout(run.transformer, run.model, VOCAB),
                                             args.global_batch_size)
    moe = moe_training(engine.module, run.model.moe)
    rank = torch.distributed.get_rank()
    g = torch.Generator().manual_seed(100 + rank)  # every rank its own data
    for _ in range(args.train_iters):
        moe.begin_iteration(engine)
        for _ in range(engine.gradient_accumulation_steps()):
            tokens = torch.randint(0, VOCAB, (2, SEQ), generator=g)
            batch = {"tokens": tokens, "labels": torch.roll(tokens, -1, 1),
                     "loss_mask": torch.ones(2, SEQ),
                     "position_ids": torch.arange(SEQ).expand(2, SEQ).contiguous()}
            loss, _ = gpt_forward_step(engine, batch)
            engine.backward(loss)
            engine.step()
    canonical = canonical_namer(engine.module)
    params = {}
    for name, p in engine.module.named_parameters():
        data = p.detach().float().contiguous()
        params[canonical(name)] = {"sum": data.sum().item(),
                                   "sha": hashlib.sha256(data.numpy().tobytes()).hexdigest()}
    record = {"rank": rank, "ep_rank": parallel_state.get_expert_model_parallel_rank(),
              "edp_rank": parallel_state.get_expert_data_parallel_rank(),
              "expert_flags": sorted(n for n, p in engine.module.named_parameters()
                                     if getattr(p, "group_name", None)),
              "params": params}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main([a for a in sys.argv[1:] if not a.startswith("--local_rank")][0])
