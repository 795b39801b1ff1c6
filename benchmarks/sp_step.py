"""Shared by benchmarks/ulysses_memory.py and benchmarks/context_length.py: one rank's training
step of the real model path under DeepSpeed-Ulysses (``--ds-sequence-parallel-size`` = the launch's
world size), measured. The rank parses and validates the flags for its world size
(``megatron.config.parser``), starts megatron-core's groups (``initialize_distributed``: the
context-parallel group is the Ulysses group), builds ``build_gpt_model``, and a step is
``megatron.train.steps.gpt_forward_step`` on one micro batch, backward, the gradients summed over
the sequence-parallel group (one ``all_reduce`` per parameter, what DeepSpeed's reduction over the
sequence-data-parallel group does) and a plain ``torch.optim.AdamW`` step (no DeepSpeed engine:
only the model's forward/backward and that reduction differ between settings)."""
import argparse
import os
import time
from statistics import median
from typing import Dict, List, Sequence

from memory import peak_rss_bytes, saved_for_backward


def add_worker_args(parser: argparse.ArgumentParser, timeout: int) -> None:
    """The flags both benchmarks take: the model (layers, hidden size, heads, vocabulary), the
    measurement (timed steps, torch threads per rank, interleaved rounds, seconds per launch) and
    the hidden ones of a worker launch."""
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--iters", type=int, default=3, help="timed steps per launch")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--repeats", type=int, default=1, help="Interleaved rounds (best kept).")
    parser.add_argument("--timeout", type=int, default=timeout, help="seconds per launch")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)


class SequenceParallelStep:
    """The model, optimizer and Ulysses group of one rank, built from ``flags`` (megatron flags
    of the model and batch; ``--ds-sequence-parallel-size`` and ``--seed 1234`` are added) with
    a vocabulary of ``vocab`` tokens and ``threads`` torch threads."""

    def __init__(self, flags: Sequence[str], vocab: int, threads: int):
        import torch
        from megatron.core import parallel_state

        from megatron.config.parser import parse_args
        from megatron.model.gpt_model import build_gpt_model
        from megatron.parallel.initialize import initialize_distributed, set_seeds

        torch.set_num_threads(threads)
        world = int(os.environ.get("WORLD_SIZE", "1"))
        self.args = parse_args([*flags, "--seed", "1234", "--ds-sequence-parallel-size", str(world)],
                               world_size=world, require_data=False)
        self.args.padded_vocab_size = vocab
        initialize_distributed(self.args.run_config.model.layout, self.args.distributed_backend)
        set_seeds(self.args.seed)
        self.model = build_gpt_model(self.args.run_config.transformer, self.args.run_config.model,
                                     vocab)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.group = parallel_state.get_context_parallel_group()
        self.sp = parallel_state.get_context_parallel_world_size()
        self.phases: Dict[str, List[float]] = {"reduce": [], "optimizer": []}
        model = self.model

        class Engine:  # what gpt_forward_step asks of an engine
            device = torch.device("cpu")

            def __call__(self, *a, **k):
                return model(*a, **k)

        self.engine = Engine()

    def _forward(self, batch):
        from megatron.train.steps import gpt_forward_step

        loss, _ = gpt_forward_step(self.engine, batch)
        return loss

    def _finish(self, loss) -> None:
        """Backward, the gradients summed over the sequence-parallel group, the optimizer step;
        the last two timed into ``phases`` (ms)."""
        import torch

        loss.backward()
        start = time.perf_counter()
        if self.sp > 1:  # summed over the sequence-parallel group, as DeepSpeed's reduction does
            for p in self.model.parameters():
                if p.grad is not None:
                    torch.distributed.all_reduce(p.grad, group=self.group)
        middle = time.perf_counter()
        self.optimizer.step()
        self.phases["reduce"].append(1000.0 * (middle - start))
        self.phases["optimizer"].append(1000.0 * (time.perf_counter() - middle))

    def step(self, batch) -> float:
        """One training step on ``batch``; returns its loss (nats per token, the whole
        sequence's)."""
        self.optimizer.zero_grad(set_to_none=True)
        loss = self._forward(batch)
        self._finish(loss)
        return loss.item()

    def measure(self, batch, iters: int) -> dict:
        """``first_loss`` (the warm-up step's), ``saved_bytes`` (what autograd keeps between one
        step's forward and backward, weights excluded), ``rss_growth`` (bytes of peak RSS from
        now to the end) and the medians over ``iters`` timed steps of ``ms`` (a step),
        ``reduce_ms`` and ``optimizer_ms``."""
        import torch

        torch.distributed.barrier()
        baseline = peak_rss_bytes()  # model, optimizer and process groups built, no activations
        first_loss = self.step(batch)  # warm-up (also allocates Adam's moments)
        self.optimizer.zero_grad(set_to_none=True)
        with saved_for_backward(self.model) as saved:
            loss = self._forward(batch)
        self._finish(loss)
        for values in self.phases.values():
            values.clear()
        times = []
        for _ in range(iters):
            torch.distributed.barrier()
            start = time.perf_counter()
            self.step(batch)
            times.append(1000.0 * (time.perf_counter() - start))
        return {"first_loss": first_loss, "saved_bytes": sum(saved.values()),
                "rss_growth": peak_rss_bytes() - baseline, "ms": median(times),
                "reduce_ms": median(self.phases["reduce"]),
                "optimizer_ms": median(self.phases["optimizer"])}
