"""Overhead of our training loop against a bare torch loop on the same megatron-core model.

Both loops train the same GPTModel (same init, same fixed batch, same gradient accumulation and
clipping): ours through ``megatron.train.loop.train`` on the DeepSpeed engine with the LR scheduler,
the bare one with plain ``torch.optim.AdamW``. Prints ms/iteration of each and the ratio.
Goal: ours / bare < 1.05.

    DS_ACCELERATOR=cpu python benchmarks/train_step_overhead.py [--iters 30] [--hidden-size 256]
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir)))
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402


class FixedBatchDataset(torch.utils.data.Dataset):
    """``length`` copies of one GPT sample (tokens, labels, loss_mask, position_ids)."""

    def __init__(self, seq_length: int, vocab: int, length: int):
        g = torch.Generator().manual_seed(0)
        text = torch.randint(0, vocab, (seq_length + 1,), generator=g)
        self.sample = {"tokens": text[:-1], "labels": text[1:],
                       "loss_mask": torch.ones(seq_length), "position_ids": torch.arange(seq_length)}
        self.length = length

    def __len__(self):
        return self.length

    def __getitem__(self, idx):
        return self.sample


def model_flags(opts):
    return ["--num-layers", str(opts.num_layers), "--hidden-size", str(opts.hidden_size),
            "--num-attention-heads", str(opts.heads), "--seq-length", str(opts.seq_length),
            "--micro-batch-size", str(opts.micro_batch_size),
            "--global-batch-size", str(opts.micro_batch_size * opts.accumulation),
            "--train-iters", str(opts.iters + opts.warmup), "--lr", "1e-4", "--min-lr", "1e-5",
            "--lr-decay-style", "cosine", "--hidden-dropout", "0", "--attention-dropout", "0",
            "--log-interval", str(10 ** 6), "--eval-iters", "0", "--eval-interval", str(10 ** 6),
            "--data-path", "unused", "--zero-stage", "0"]


def time_ours(args, opts) -> float:
    import dataclasses

    from megatron.checkpoint.engine import TrainingState
    from megatron.config.checkpoint_args import model_args_from_args
    from megatron.data.train_data import TrainData
    from megatron.metrics.writers import MetricsWriter
    from megatron.model.gpt_model import build_gpt_model
    from megatron.train.engine_setup import setup_model_and_optimizer
    from megatron.train.loop import train
    from megatron.train.steps import gpt_forward_step, step_functions

    torch.manual_seed(0)
    run = args.run_config
    engine, optimizer, scheduler = setup_model_and_optimizer(
        run, build_gpt_model(run.transformer, run.model, args.padded_vocab_size),
        args.global_batch_size)
    dataset = FixedBatchDataset(args.seq_length, 256, args.global_batch_size * (args.train_iters + 1))
    metrics = MetricsWriter([])  # no outputs
    warm = TrainingState()
    run = args.run_config

    def run_to(iterations):
        """The run's typed configs with the loop ending at ``iterations``."""
        return dataclasses.replace(run, loop=dataclasses.replace(run.loop, train_iters=iterations))

    train(run_to(opts.warmup), engine, optimizer, scheduler, TrainData(dataset),
          step_functions(engine, gpt_forward_step), warm, metrics, model_args_from_args(args))
    start = time.perf_counter()
    train(run_to(opts.warmup + opts.iters), engine, optimizer, scheduler, TrainData(dataset),
          step_functions(engine, gpt_forward_step), warm, metrics, model_args_from_args(args))
    return (time.perf_counter() - start) / opts.iters


def time_bare(args, opts) -> float:
    from megatron.model.gpt_model import build_gpt_model

    torch.manual_seed(0)
    model = build_gpt_model(args.run_config.transformer, args.run_config.model, args.padded_vocab_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    sample = FixedBatchDataset(args.seq_length, 256, 1).sample
    batch = {k: v.unsqueeze(0).repeat(args.micro_batch_size, *([1] * v.dim())) for k, v in sample.items()}

    def step():
        for _ in range(opts.accumulation):
            per_token = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
            loss = (per_token * batch["loss_mask"]).sum() / batch["loss_mask"].sum()
            (loss / opts.accumulation).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(opts.warmup):
        step()
    start = time.perf_counter()
    for _ in range(opts.iters):
        step()
    return (time.perf_counter() - start) / opts.iters


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq-length", type=int, default=256)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--accumulation", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2, help="Alternate the two loops this often.")
    opts = parser.parse_args()

    from megatron.config.parser import parse_args
    from megatron.parallel.initialize import initialize_distributed

    args = parse_args(model_flags(opts), world_size=1)
    args.padded_vocab_size = 256
    initialize_distributed(args.run_config.model.layout, args.distributed_backend)
    ours, bare = [], []
    for _ in range(opts.repeats):  # alternate so drift on a shared machine hits both
        bare.append(time_bare(args, opts))
        args = parse_args(model_flags(opts), world_size=1)
        args.padded_vocab_size = 256
        ours.append(time_ours(args, opts))
    ours_ms, bare_ms = 1000 * min(ours), 1000 * min(bare)
    print(f"model: {opts.num_layers} layers x {opts.hidden_size} hidden, seq {opts.seq_length}, "
          f"micro batch {opts.micro_batch_size} x {opts.accumulation} accumulation, "
          f"torch threads {torch.get_num_threads()}")
    print(f"bare torch loop : {bare_ms:8.1f} ms/iteration (best of {opts.repeats})")
    print(f"our train loop  : {ours_ms:8.1f} ms/iteration (best of {opts.repeats})")
    print(f"ratio ours/bare : {ours_ms / bare_ms:8.3f}  (goal < 1.05)")


if __name__ == "__main__":
    main()
