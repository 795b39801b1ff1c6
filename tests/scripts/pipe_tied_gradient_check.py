"""Launched by tests/e2e/test_pipeline_parallel.py on 2 CPU ranks (not a test module itself).

One PP 2 iteration of GPTModelPipe on DeepSpeed's pipe engine with a tied embedding. Each rank
records the tied weight's gradient as its own stage produced it (after the backward pass, before
DeepSpeed's tied-gradient all-reduce) and as the optimizer step sees it, and computes the reference:
the one-stage GPTModel's gradient of its shared weight on the same micro batch, from the same
initial weights. Writes ``OUT/rank{R}.json``; the test compares.

    deepspeed --num_gpus 2 tests/scripts/pipe_tied_gradient_check.py OUT
"""
import json
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

FLAGS = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
         "--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "2",
         "--train-iters", "1", "--lr", "0", "--hidden-dropout", "0", "--attention-dropout", "0",
         "--transformer-impl", "local", "--pipeline-model-parallel-size", "2", "--seed", "5"]
VOCAB = 128


def main(out_dir: str) -> None:
    import deepspeed

    from megatron.config.parser import parse_args
    from megatron.model.gpt_model import build_gpt_model
    from megatron.model.gpt_model_pipe import build_gpt_model_pipe
    from megatron.model.lm_loss import masked_lm_loss
    from megatron.model.pipe_io import pipe_batch
    from megatron.parallel.initialize import initialize_distributed, set_seeds

    args = parse_args(FLAGS, world_size=2, require_data=False)
    args.padded_vocab_size = VOCAB
    run = args.run_config
    initialize_distributed(run.model.layout, args.distributed_backend)
    set_seeds(args.seed)
    rank = torch.distributed.get_rank()

    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (2, 16), generator=g)
    batch = {"tokens": tokens, "labels": torch.roll(tokens, -1, 1), "loss_mask": torch.ones(2, 16),
             "position_ids": torch.arange(16).expand(2, 16).contiguous()}

    # The reference: the one-stage model from the same canonical initial weights.
    reference_model = build_gpt_model(run.transformer, run.model, VOCAB)
    per_token = reference_model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
    masked_lm_loss(per_token, batch["loss_mask"])[0].backward()
    reference = reference_model.embedding.word_embeddings.weight.grad

    pipe = build_gpt_model_pipe(run.transformer, run.model, VOCAB)
    tied = pipe.tied_modules["embed"].word_embeddings.weight
    captured = {}
    tied.register_post_accumulate_grad_hook(lambda p: captured.__setitem__("stage", p.grad.clone()))
    optimizer = torch.optim.SGD(pipe.parameters(), lr=0.0)
    real_step = optimizer.step

    def step(*a, **k):  # the optimizer sees the gradient after DeepSpeed's tied all-reduce
        captured["step"] = tied.grad.clone()
        return real_step(*a, **k)

    optimizer.step = step
    config = {"train_micro_batch_size_per_gpu": 2, "train_batch_size": 2,
              "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
              "zero_optimization": {"stage": 0}, "steps_per_print": 10 ** 9}
    engine, _, _, _ = deepspeed.initialize(model=pipe, optimizer=optimizer, config=config,
                                           dist_init_required=False)
    engine.train_batch(data_iter=iter([pipe_batch(batch)]))
    stage_sum = captured["stage"].clone()
    torch.distributed.all_reduce(stage_sum)  # both stages' own contributions, added here
    record = {
        "rank": rank,
        "stage_vs_reference": (captured["stage"] - reference).abs().max().item(),
        "stage_norm": captured["stage"].norm().item(),
        "reference_norm": reference.norm().item(),
        "step_vs_reference": (captured["step"] - reference).abs().max().item(),
        "stage_sum_vs_reference": (stage_sum - reference).abs().max().item(),
    }
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main([a for a in sys.argv[1:] if not a.startswith("--local_rank")][0])
