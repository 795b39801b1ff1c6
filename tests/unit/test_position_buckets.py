"""Evaluation loss by position bucket (megatron/metrics/position_buckets.py, --eval-position-buckets):
positions and bucket sums against naive loops; the flags' checks; the record's TensorBoard/W&B
tags; and on a real model and DeepSpeed engine (one rank, packed T0 batches: documents masked from
each other, uneven loss masks), each bucket's loss and loss tokens against a naive reference
computed from the model's logits, token by token, under both position bases, and the buckets'
token-weighted mean equal to the group's loss (per-token normalisation). (Layouts:
tests/helpers/parallel.py evaluates the layout-comparison runs with --eval-position-buckets, so
TP 2, PP 2, Ulysses SP 2 and DP 2 are compared bucket by bucket with one rank.)"""
import dataclasses
import math

import pytest
import torch

from helpers.flags import parse
from megatron.errors import ArgumentError
from megatron.metrics.position_buckets import PositionBuckets, bucket_fields
from megatron.metrics.records import eval_scalars


def _naive_positions(segments, basis):
    """Position of each token: its index, or the tokens before it in its segment."""
    out = []
    for row in segments:
        positions = []
        for i, seg in enumerate(row):
            j = i
            while basis == "context" and j > 0 and row[j - 1] == seg:
                j -= 1
            positions.append(i - j if basis == "context" else i)
        out.append(positions)
    return out


def _naive_bucket(bounds, position):
    return max(i for i in range(len(bounds) - 1) if bounds[i] <= position)


@pytest.mark.parametrize("basis", ["context", "sequence"])
def test_positions_and_buckets_follow_the_documents_or_the_sequence(basis):
    segments = torch.tensor([[1, 1, 1, 2, 2, 2, 2, 2, 0, 0], [5, 5, 5, 5, 5, 5, 5, 5, 5, 5],
                             [1, 2, 3, 3, 1, 1, 1, 1, 1, 4]])
    buckets = PositionBuckets((0, 2, 5, 10), basis)
    want = _naive_positions(segments.tolist(), basis)
    assert buckets.positions((3, 10), segments).tolist() == want
    assert buckets.bucket_ids((3, 10), segments).tolist() == [
        [_naive_bucket(buckets.bounds, p) for p in row] for row in want]
    # without document masks both bases count within the sequence
    assert buckets.positions((2, 4)).tolist() == [[0, 1, 2, 3]] * 2


def test_bucket_sums_are_the_masked_loss_and_token_sums_of_each_bucket():
    torch.manual_seed(0)
    per_token = torch.rand(3, 12, dtype=torch.float64) * 5
    mask = (torch.rand(3, 12) > 0.3).double() * torch.tensor([1.0, 0.5, 2.0])[:, None]  # weighted masks
    buckets = PositionBuckets((0, 4, 8, 12))
    ids = buckets.bucket_ids((3, 12))
    got = buckets.sums(per_token, mask, ids)
    for k in range(3):
        cols = slice(4 * k, 4 * k + 4)
        assert float(got[0, k]) == pytest.approx(float((per_token[:, cols] * mask[:, cols]).sum()), rel=1e-12)
        assert float(got[1, k]) == pytest.approx(float(mask[:, cols].sum()), rel=1e-12)
    fields = bucket_fields(buckets, torch.tensor([[6.0, 0.0, 3.0], [3.0, 0.0, 2.0]]))
    assert fields == {"lm_loss_pos_0_4": 2.0, "tokens_pos_0_4": 3.0,  # the empty bucket left out
                      "lm_loss_pos_8_12": 1.5, "tokens_pos_8_12": 2.0}


def test_the_record_gives_each_bucket_a_tensorboard_and_wandb_tag():
    record = {"iteration": 4, "split": "valid", "group": "web", "lm_loss": 2.0, "ppl": math.exp(2.0),
              "lm_loss_pos_0_64": 2.5, "tokens_pos_0_64": 128.0, "lm_loss_pos_64_256": 1.5}
    assert eval_scalars(record) == {"valid/web/lm_loss": 2.0, "valid/web/ppl": math.exp(2.0),
                                    "valid/web/lm_loss_pos_0_64": 2.5,
                                    "valid/web/lm_loss_pos_64_256": 1.5}


@pytest.mark.parametrize("extra, bounds, basis", [
    ([], None, "context"),
    (["--eval-position-buckets", "8"], (0, 8, 16, 24, 32), "context"),
    (["--eval-position-buckets", "12"], (0, 12, 24, 32), "context"),  # the last range shorter
    (["--eval-position-buckets", "32"], (0, 32), "context"),
    (["--eval-position-bucket-edges", "8", "20", "--eval-position-bucket-basis", "sequence"],
     (0, 8, 20, 32), "sequence"),
])
def test_the_flags_give_the_bucket_bounds(extra, bounds, basis):
    args = parse(extra)
    assert args.eval_position_bounds == bounds
    buckets = args.run_config.loop.position_buckets
    assert (buckets is None) if bounds is None else (buckets == PositionBuckets(bounds, basis))


@pytest.mark.parametrize("extra, message", [
    (["--eval-position-buckets", "0"],
     "--eval-position-buckets 0: the bucket width must be between 1 and --seq-length 32 tokens"),
    (["--eval-position-buckets", "33"],
     "--eval-position-buckets 33: the bucket width must be between 1 and --seq-length 32 tokens"),
    (["--eval-position-bucket-edges", "8", "8"],
     "--eval-position-bucket-edges 8 8: the edges must increase strictly and lie between 0 and "
     "--seq-length 32, both excluded"),
    (["--eval-position-bucket-edges", "32"],
     "--eval-position-bucket-edges 32: the edges must increase strictly and lie between 0 and "
     "--seq-length 32, both excluded"),
    (["--eval-position-buckets", "8", "--eval-position-bucket-edges", "16"],
     "--eval-position-buckets 8 and --eval-position-bucket-edges 16 are mutually exclusive; give one"),
    (["--eval-position-bucket-basis", "sequence"],
     "--eval-position-bucket-basis sequence needs --eval-position-buckets or "
     "--eval-position-bucket-edges"),
    (["--eval-position-buckets", "1", "--seq-length", "300", "--max-position-embeddings", "300"],
     "--eval-position-buckets 1 gives 300 buckets over --seq-length 300; at most 256 are allowed"),
])
def test_bad_bucket_flags_are_refused_in_one_line(extra, message):
    with pytest.raises(ArgumentError) as err:
        parse(extra)
    assert str(err.value) == message


# ------------------------------------------------------------------ on a real engine
@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    from tools.make_toy_multitask import make_toy_multitask
    return make_toy_multitask(str(tmp_path_factory.mktemp("toy_buckets")), examples_per_task=60,
                              preprocess=True, rank_eval_per_task=2, pretrain_docs=5)


def _naive_reference(engine, batches, bounds, basis):
    """``[2, buckets]`` loss sums and loss tokens, token by token from the model's logits."""
    from megatron.model.masks import attention_structure_from_batch, with_segment_layout

    sums = torch.zeros(2, len(bounds) - 1, dtype=torch.float64)
    for batch in batches:
        laid_out = with_segment_layout(batch)
        with torch.no_grad():
            logits = engine.module(batch["tokens"], batch["position_ids"], None,
                                   packed_seq_params=attention_structure_from_batch(laid_out))
        log_probs = torch.log_softmax(logits.double(), dim=-1)
        positions = _naive_positions(batch["segment_ids"].tolist(), basis)
        for r in range(batch["tokens"].shape[0]):
            for i in range(batch["tokens"].shape[1]):
                weight = float(batch["loss_mask"][r, i])
                if weight == 0:
                    continue
                k = _naive_bucket(bounds, positions[r][i])
                sums[0, k] += -float(log_probs[r, i, batch["labels"][r, i]]) * weight
                sums[1, k] += weight
    return sums


def test_bucket_losses_equal_a_per_token_reference_and_average_to_the_group_loss(
        toy, tmp_path, one_rank_model_parallel):
    import finetune_t0
    from helpers.models import model_for_layout
    from megatron.config.tokenizer_flags import apply_tokenizer_setup
    from megatron.data.train_data import EvalGroup
    from megatron.train.engine_setup import loss_normalizer, setup_model_and_optimizer
    from megatron.train.evaluation import evaluate
    from megatron.train.loader import _loader
    from megatron.train.steps import gpt_forward_step, step_functions

    train = ", ".join(f"1 0:1 {toy['train_' + t]}" for t in ("sentiment", "copy", "addition"))
    args = finetune_t0.parse_t0_args([
        "--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2",
        "--seq-length", "96", "--transformer-impl", "local", "--hidden-dropout", "0",
        "--attention-dropout", "0", "--seed", "5", "--micro-batch-size", "2",
        "--global-batch-size", "8", "--train-iters", "2", "--lr", "1e-3",
        "--train-weighted-split-paths", f"TRAIN: {train}", "--data-cache-path", str(tmp_path),
        "--eval-iters", "1", "--calculate-per-token-loss", "--eval-position-buckets", "16"])
    apply_tokenizer_setup(args)
    data = finetune_t0.datasets_provider(args)
    engine, _, _ = setup_model_and_optimizer(args.run_config, model_for_layout(args),
                                             args.global_batch_size)
    steps = step_functions(engine, gpt_forward_step,
                           loss_normalizer(args.run_config.loss, data, args.data_parallel_size))
    loop = args.run_config.loop
    assert loop.position_buckets == PositionBuckets((0, 16, 32, 48, 64, 80, 96), "context")
    loader = _loader(data.train, 0, loop)
    batches = [next(loader) for _ in range(4)]  # one global batch of 8 in micro batches of 2
    assert all("segment_ids" in b for b in batches)
    results = {}
    for basis in ("context", "sequence"):
        buckets = dataclasses.replace(loop.position_buckets, basis=basis)
        result = evaluate(engine, dataclasses.replace(loop, position_buckets=buckets),
                          EvalGroup("train", data.train), steps, 0)
        want = _naive_reference(engine, batches, buckets.bounds, basis)
        fields = result.position_fields
        for k, (lo, hi) in enumerate(buckets.ranges):
            if want[1, k] == 0:
                assert f"lm_loss_pos_{lo}_{hi}" not in fields
                continue
            assert fields[f"tokens_pos_{lo}_{hi}"] == pytest.approx(float(want[1, k]), rel=1e-9)
            assert fields[f"lm_loss_pos_{lo}_{hi}"] == pytest.approx(float(want[0, k] / want[1, k]),
                                                                     rel=1e-5)
        # the buckets' token-weighted mean is the group's loss (per-token normalisation)
        tokens = sum(v for key, v in fields.items() if key.startswith("tokens_pos_"))
        mean = sum(fields[f"lm_loss_pos_{key[len('tokens_pos_'):]}"] * v
                   for key, v in fields.items() if key.startswith("tokens_pos_")) / tokens
        assert mean == pytest.approx(result.loss, rel=1e-6)
        assert tokens == float(sum(b["loss_mask"].sum() for b in batches))
        results[basis] = fields
    # documents are shorter than the sequence: counted within them, positions are smaller
    assert len(results["sequence"]) > len(results["context"]) >= 4
    assert results["context"] != results["sequence"]
