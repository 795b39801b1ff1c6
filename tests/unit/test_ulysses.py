"""DeepSpeed-Ulysses sequence parallelism (--ds-sequence-parallel-size): the sequence slicing of
every batch field, the ALiBi heads of each sequence-parallel rank, the refused layouts. The model
at SP 2 against the whole sequence on one rank (2 CPU ranks through the launcher):
tests/e2e/test_ulysses_e2e.py."""
import json

import pytest
import torch

from helpers.flags import parse

ULYSSES = ["--ds-sequence-parallel-size"]


# ------------------------------------------------------------------ slicing the batch
def _packed_batch(b=2, s=8):
    from megatron.model.masks import with_segment_layout

    tokens = torch.arange(b * s).view(b, s)
    batch = {"tokens": tokens, "labels": tokens + 100, "loss_mask": torch.rand(b, s),
             "position_ids": torch.arange(s).expand(b, s).contiguous(),
             "segment_ids": torch.tensor([[1, 1, 1, 2, 2, 2, 2, 0], [1, 1, 1, 1, 1, 2, 2, 2]]).int(),
             "is_prefix": torch.tensor([[1, 0, 0, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 1, 0, 0]]).bool(),
             "dataset_id": torch.tensor([3, 1])}
    return with_segment_layout(batch)


def test_each_rank_keeps_its_slice_of_every_per_token_field():
    """tokens, labels, loss mask and position ids are cut to the rank's contiguous quarter; the
    attention structure (segment ids, prefix flags, cu_seqlens, gather index, host layout) and the
    per-sample dataset ids stay whole; the slices put back together are the batch."""
    from megatron.parallel.ulysses import slice_batch_for_sequence_rank

    batch = _packed_batch()
    slices = [slice_batch_for_sequence_rank(batch, 4, r) for r in range(4)]
    for key in ("tokens", "labels", "loss_mask", "position_ids"):
        assert all(s[key].shape == (2, 2) for s in slices), key
        assert torch.equal(torch.cat([s[key] for s in slices], dim=1), batch[key]), key
    assert torch.equal(slices[1]["tokens"], batch["tokens"][:, 2:4])
    for key in ("segment_ids", "is_prefix", "cu_seqlens", "segment_gather_index", "dataset_id"):
        assert all(s[key] is batch[key] for s in slices), key
    assert all(s["segment_layout"] is batch["segment_layout"] for s in slices)
    per_token_ids = dict(batch, dataset_id=torch.zeros(2, 8, dtype=torch.long))
    assert slice_batch_for_sequence_rank(per_token_ids, 2, 1)["dataset_id"].shape == (2, 4)
    assert slice_batch_for_sequence_rank(batch, 1, 0) == batch


def test_a_sequence_that_does_not_split_is_an_error():
    from megatron.parallel.ulysses import sequence_shard

    assert sequence_shard(12, 3, 2) == slice(8, 12)
    with pytest.raises(ValueError, match="12 tokens does not split over 5 ranks"):
        sequence_shard(12, 5, 0)


# ------------------------------------------------------------------ ALiBi heads per rank
@pytest.mark.parametrize("heads, tp, sp", [(8, 1, 2), (8, 2, 2), (16, 2, 4), (12, 3, 2)])
def test_alibi_slopes_of_each_sequence_parallel_rank(heads, tp, sp):
    """Each (TP rank, SP rank) takes heads / (TP x SP) consecutive slopes, in the order DeepSpeed's
    head all-to-all deals the TP rank's heads out: put together over the SP ranks they are the TP
    rank's slopes, and over the TP ranks the model's."""
    from megatron.model.alibi import alibi_slope_list, alibi_slope_list_for_partition

    full = alibi_slope_list(heads)
    for t in range(tp):
        per_tp = [x for r in range(sp) for x in alibi_slope_list_for_partition(heads, tp, t, sp, r)]
        assert per_tp == alibi_slope_list_for_partition(heads, tp, t)
        assert per_tp == full[t * heads // tp:(t + 1) * heads // tp]
    assert alibi_slope_list_for_partition(heads, tp, tp - 1, sp, sp - 1) == full[-heads // (tp * sp):]
    with pytest.raises(ValueError, match="do not split"):
        alibi_slope_list_for_partition(6, 2, 0, 2, 0)


# ------------------------------------------------------------------ layouts
def test_data_parallel_size_is_world_over_tp_pp_sp():
    args = parse(ULYSSES + ["2", "--tensor-model-parallel-size", "2"], world_size=8)
    assert (args.data_parallel_size, args.ds_sequence_parallel_size) == (2, 2)
    assert args.run_config.model.layout.describe() == (
        "tensor-parallel 2, pipeline-parallel 1, Ulysses sequence-parallel 2, data-parallel 2")
    assert parse([], world_size=8).data_parallel_size == 8


@pytest.mark.parametrize("extra, world, fragments", [
    (["3"], 6, ["--num-attention-heads 4 gives 4 per tensor-parallel rank",
                "not divisible by --ds-sequence-parallel-size 3", "sizes that divide heads, "
                "query groups and --seq-length: 1, 2, 4"]),
    (["4", "--tensor-model-parallel-size", "2"], 8,
     ["--num-attention-heads 4 gives 2 per tensor-parallel rank (--tensor-model-parallel-size 2)",
      "not divisible by --ds-sequence-parallel-size 4"]),
    (["2", "--num-query-groups", "1"], 2,
     ["--num-query-groups 1 gives 1 per tensor-parallel rank", "sizes that divide heads, query "
      "groups and --seq-length: 1"]),
    (["2", "--seq-length", "33", "--max-position-embeddings", "33"], 2,
     ["--seq-length 33 is not divisible by --ds-sequence-parallel-size 2"]),
    (["2", "--pipeline-model-parallel-size", "2"], 4,
     ["--ds-sequence-parallel-size 2 with --pipeline-model-parallel-size 2: DeepSpeed's pipe "
      "engine reduces gradients over the data-parallel group only",
      "use --pipeline-model-parallel-size 1"]),
    (["2", "--tensor-model-parallel-size", "2", "--sequence-parallel", "--seq-length", "6",
      "--max-position-embeddings", "6", "--num-attention-heads", "4", "--hidden-size", "64"], 4,
     ["--seq-length 6 / --ds-sequence-parallel-size 2 = 3 tokens per rank is not divisible by "
      "--tensor-model-parallel-size 2 (needed by --sequence-parallel)"]),
    (["2"], 3, ["world size 3 is not divisible by --tensor-model-parallel-size 1 x "
                "--pipeline-model-parallel-size 1 x --ds-sequence-parallel-size 2 (= 2)"]),
    (["0"], 2, ["--ds-sequence-parallel-size 0 must be positive"]),
    (["2", "--zero-stage", "3"], 2, ["--ds-sequence-parallel-size 2 with ZeRO stage 3: DeepSpeed's "
                                     "ZeRO-3 reduce-scatter averages the gradients over the "
                                     "sequence-parallel ranks", "use --zero-stage 1 or 2"]),
], ids=["heads", "heads-per-tp-rank", "query-groups", "seq-length", "pipeline", "with-megatron-sp",
        "world", "zero", "zero-3"])
def test_impossible_ulysses_layouts_are_refused_naming_the_values(extra, world, fragments):
    from megatron.errors import ArgumentError

    with pytest.raises(ArgumentError) as info:
        parse(ULYSSES + extra, world_size=world)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)


def test_transformer_engine_attention_is_refused_under_ulysses_and_auto_passes_it_over():
    """TE's attention does not run inside the all-to-all: an explicit te is refused naming what
    runs; auto on a GPU with TE installed takes SDPA (causal) or FlexAttention (packed) instead."""
    from megatron.errors import ArgumentError
    from megatron.model.attention_backends import resolve_attention_backend

    common = dict(device_type="cuda", te_available=True, transformer_impl="transformer_engine",
                  attention_dropout=0.0, te_version=(2, 12), flash_attn=("flash-attn==2.7",))
    with pytest.raises(ArgumentError, match="--attention-backend te: Transformer Engine's "
                                            "attention does not run inside the DeepSpeed-Ulysses"):
        resolve_attention_backend("te", structured_batches=False, sequence_parallel_size=2, **common)
    assert resolve_attention_backend("auto", structured_batches=False, sequence_parallel_size=1,
                                     **common).name == "te"
    assert resolve_attention_backend("auto", structured_batches=False, sequence_parallel_size=2,
                                     **common).name == "sdpa"
    assert resolve_attention_backend("auto", structured_batches=True, sequence_parallel_size=2,
                                     **common).name == "flex"


def test_deepspeed_json_sequence_parallel_size_must_agree_with_the_flag(tmp_path):
    """A --deepspeed_config naming another sequence_parallel_size than the flag is an error that
    names both; agreeing values pass."""
    from megatron.errors import ArgumentError

    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"sequence_parallel_size": 2}))
    assert parse(ULYSSES + ["2", "--deepspeed_config", str(path)],
                 world_size=2).ds_sequence_parallel_size == 2
    with pytest.raises(ArgumentError, match=r"sequence_parallel_size=2 disagrees with "
                                            r"--ds-sequence-parallel-size 1 .*give "
                                            r"--ds-sequence-parallel-size 2"):
        parse(["--deepspeed_config", str(path)], world_size=2)
