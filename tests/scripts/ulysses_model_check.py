"""Launched by tests/e2e/test_ulysses_e2e.py on 2 CPU ranks (not a test module itself).

For each case (a position embedding, a batch structure, query groups), builds the GPTModel at
DeepSpeed-Ulysses sequence-parallel size 2, runs one forward and backward of a micro batch (each
rank its slice of the sequence, through the training loop's slicing and loss), then rebuilds the
same model (same seed, so the same weights) without Ulysses and runs the whole sequence on each
rank. Records the losses, the per-sample losses, the largest difference of the gradients summed
over the sequence-parallel group (what DeepSpeed's reduction makes of them) from the reference's,
and the ALiBi slopes each rank's core attention holds. Writes ``OUT/rank{R}.json``.

    deepspeed --num_gpus 2 tests/scripts/ulysses_model_check.py OUT
"""
import dataclasses
import json
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

SEQ = 16
VOCAB = 128
BASE = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", str(SEQ), "--max-position-embeddings", str(SEQ), "--micro-batch-size", "2",
        "--train-iters", "1", "--lr", "0", "--hidden-dropout", "0", "--attention-dropout", "0",
        "--transformer-impl", "local", "--seed", "5", "--ds-sequence-parallel-size", "2"]
CASES = {  # name -> (extra flags, structured batch)
    "rope_packed_prefix": (["--position-embedding-type", "rope", "--swiglu",
                            "--normalization", "RMSNorm", "--disable-bias-linear"], True),
    "alibi_packed_prefix": (["--position-embedding-type", "alibi"], True),
    "rope_gqa_causal": (["--position-embedding-type", "rope",
                         "--num-query-groups", "2"], False),
    "learned_causal_selective_recompute": (["--recompute-granularity", "selective"], False),
    # YaRN extending 4 positions 4-fold: each rank's angles and the attention factor
    "yarn_packed_prefix": (["--position-embedding-type", "yarn", "--rotary-scaling-factor", "4",
                            "--yarn-original-max-position-embeddings", "4"], True),
}


def _batch(structured: bool):
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (2, SEQ), generator=g)
    batch = {"tokens": tokens, "labels": torch.roll(tokens, -1, 1),
             "loss_mask": (torch.rand(2, SEQ, generator=g) > 0.3).float(),
             "position_ids": torch.arange(SEQ).expand(2, SEQ).contiguous(),
             "dataset_id": torch.tensor([0, 1])}
    if structured:  # packed segments crossing the shard boundary, each with a prefix
        segments = torch.tensor([[1] * 5 + [2] * 7 + [3] * 4, [1] * 9 + [2] * 7])
        is_prefix = torch.zeros(2, SEQ, dtype=torch.bool)
        for b in range(2):
            for s in segments[b].unique():
                where = (segments[b] == s).nonzero().view(-1)
                is_prefix[b, where[: max(1, len(where) // 2)]] = True
        batch["segment_ids"] = segments.int()
        batch["is_prefix"] = is_prefix
        position = torch.zeros(2, SEQ, dtype=torch.long)
        for b in range(2):
            for s in segments[b].unique():
                where = (segments[b] == s).nonzero().view(-1)
                position[b, where] = torch.arange(len(where))
        batch["position_ids"] = position
    return batch


def _run(args, model_config, batch):
    """(loss, per-sample losses, {name: grad}, ALiBi slopes of layer 1) of one forward/backward
    of ``batch`` through the training loop's forward step on a plain module."""
    from megatron.model.gpt_model import build_gpt_model
    from megatron.parallel.initialize import set_seeds
    from megatron.parallel.topology import initialize_model_parallel
    from megatron.train.steps import gpt_forward_step

    initialize_model_parallel(model_config.layout)
    set_seeds(args.seed)
    model = build_gpt_model(args.run_config.transformer, model_config, VOCAB)

    class Engine:  # what gpt_forward_step asks of an engine
        device = torch.device("cpu")

        def __call__(self, *a, **k):
            return model(*a, **k)

    loss, per_sample = gpt_forward_step(Engine(), batch)
    loss.backward()
    core = model.decoder.layers[0].self_attention.core_attention
    local = getattr(core, "local_attention", core)
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return loss.item(), per_sample.tolist(), grads, local.alibi_slope_values


def main(out_dir: str) -> None:
    from megatron.core import parallel_state

    from megatron.config.parser import parse_args
    from megatron.parallel.initialize import initialize_distributed

    records = {}
    for name, (extra, structured) in CASES.items():
        args = parse_args(BASE + extra, world_size=2, require_data=False)
        args.padded_vocab_size = VOCAB
        if not torch.distributed.is_initialized():
            initialize_distributed(args.run_config.model.layout, args.distributed_backend)
        elif parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()
        batch = _batch(structured)
        model_config = args.run_config.model
        loss, per_sample, grads, slopes = _run(args, model_config, batch)
        group = parallel_state.get_context_parallel_group()
        for g in grads.values():  # DeepSpeed sums them over the sequence-data-parallel group
            torch.distributed.all_reduce(g, group=group)
        parallel_state.destroy_model_parallel()
        whole = dataclasses.replace(
            model_config, ds_sequence_parallel_size=1,
            layout=dataclasses.replace(model_config.layout, sp=1, dp=2),
            attention=dataclasses.replace(model_config.attention, ds_sequence_parallel_size=1))
        ref_loss, ref_per_sample, ref_grads, _ = _run(args, whole, batch)
        records[name] = {
            "loss": loss, "reference_loss": ref_loss, "per_sample": per_sample,
            "reference_per_sample": ref_per_sample,
            "grad_max_diff": max((grads[n] - ref_grads[n]).abs().max().item() for n in grads),
            "grad_max": max(g.abs().max().item() for g in ref_grads.values()),
            "alibi_slopes": slopes,
        }
    records["sequence_rank"] = torch.distributed.get_rank()
    with open(os.path.join(out_dir, f"rank{torch.distributed.get_rank()}.json"), "w") as f:
        json.dump(records, f)


if __name__ == "__main__":
    main([a for a in sys.argv[1:] if not a.startswith("--local_rank")][0])
