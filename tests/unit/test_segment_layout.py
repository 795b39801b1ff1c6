"""The segment layout the loader's collate computes on the host (cu_seqlens, longest segment, prefix
lengths, SDPA's buckets) against the rule written out per token, its device-side twin, and the
one-copy transfer of a batch."""
import numpy as np
import pytest
import torch

from helpers.flags import parse


def random_batch(seed, b=3, s=53):
    """Random segments (padding 0 at the end of some samples) with random prefixes."""
    rng = np.random.default_rng(seed)
    seg, pre = np.zeros((b, s), np.int32), np.zeros((b, s), bool)
    for n in range(b):
        pos, k, end = 0, 1, s - int(rng.integers(0, 8))
        while pos < end:
            length = min(int(rng.integers(1, 40)), end - pos)
            seg[n, pos:pos + length] = k
            pre[n, pos:pos + int(rng.integers(0, length + 1))] = True
            pos, k = pos + length, k + 1
    return torch.from_numpy(seg), torch.from_numpy(pre)


@pytest.mark.parametrize("seed", range(4))
def test_layout_equals_the_segments_written_out(seed):
    from megatron.model.segment_layout import BUCKET_GRANULE, padded_cu_seqlens, segment_layout
    seg, pre = random_batch(seed)
    b, s = seg.shape
    layout, cu_seqlens, gather = segment_layout(seg, pre)
    runs = []  # (flat start, length, prefix tokens) per maximal run, from the tokens one by one
    for n in range(b):
        for i in range(s):
            if i == 0 or seg[n, i] != seg[n, i - 1]:
                runs.append([n * s + i, 0, 0])
            runs[-1][1] += 1
            runs[-1][2] += int(pre[n, i])
    assert list(zip(layout.starts, layout.lengths, layout.prefix_lengths, strict=True)) == [tuple(r) for r in runs]
    assert layout.max_seqlen == max(r[1] for r in runs) and layout.num_segments == len(runs)
    starts = [r[0] for r in runs]
    assert cu_seqlens.dtype == torch.int32
    assert cu_seqlens.tolist() == starts + [b * s] * (b * s + 1 - len(starts))
    assert torch.equal(padded_cu_seqlens(seg), cu_seqlens)  # what a device computes without a sync
    # the buckets: every token read by exactly one slot, of a bucket at least as long as its segment
    assert sum(count * length for length, count, _ in layout.buckets) == gather.numel()
    assert sorted(gather[gather >= 0].tolist()) == list(range(b * s))
    offset = 0
    for length, count, has_prefix in layout.buckets:
        assert length % BUCKET_GRANULE == 0 or length == s
        for row in gather[offset:offset + count * length].view(count, length):
            real = row[row >= 0]
            first = starts.index(int(real[0]))
            assert real.tolist() == list(range(runs[first][0], runs[first][0] + runs[first][1]))
            assert (row[len(real):] == -1).all()
            real_length = runs[first][1]  # padded by less than a granule or a quarter
            assert real_length <= length < real_length + max(BUCKET_GRANULE, real_length / 4)
            assert has_prefix == (runs[first][2] > 0)
        offset += count * length


def test_collate_adds_the_layout_and_the_structure_takes_it():
    from megatron.model.masks import AttentionStructure, attention_structure_from_batch, collate_with_segment_layout
    seg, pre = random_batch(9, b=2)
    samples = [{"tokens": torch.arange(53), "segment_ids": seg[n], "is_prefix": pre[n]} for n in range(2)]
    batch = collate_with_segment_layout(samples)
    assert set(batch) == {"tokens", "segment_ids", "is_prefix", "cu_seqlens", "segment_gather_index",
                          "segment_layout"}
    structure = attention_structure_from_batch(batch)
    assert structure.layout is batch["segment_layout"] and structure.cu_seqlens is batch["cu_seqlens"]
    # a structure of device tensors only (a pipeline stage) derives the same cu_seqlens itself
    assert torch.equal(AttentionStructure(segment_ids=seg, is_prefix=pre).cu_seqlens, batch["cu_seqlens"])
    plain = collate_with_segment_layout([{"tokens": torch.arange(4)}] * 2)
    assert set(plain) == {"tokens"} and attention_structure_from_batch(plain) is None


def test_loader_batches_carry_the_layout(dist_group):
    """megatron.train.loader._loader's collate adds the layout to every micro batch."""
    from megatron.core import parallel_state

    from megatron.model.masks import collate_with_segment_layout
    from megatron.train.loader import _loader
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1)
    seg, pre = random_batch(3, b=4)
    data = [{"tokens": torch.arange(53), "segment_ids": seg[n], "is_prefix": pre[n]} for n in range(4)]
    loop = parse(["--seed", "1"]).run_config.loop  # micro batches of 2, no workers
    first = next(_loader(data, 0, loop))
    assert first["segment_layout"].batch_size == 2
    assert torch.equal(first["cu_seqlens"], collate_with_segment_layout(data[:2])["cu_seqlens"])


def test_one_copy_transfer_round_trips_every_dtype_bit_for_bit():
    from megatron.data.device_transfer import ALIGNMENT, batch_to_device, pack_tensors, unpack_tensors
    tensors = [torch.randn(3, 5), torch.arange(7, dtype=torch.int32), torch.tensor([True, False, True]),
               torch.arange(6, dtype=torch.int64).view(2, 3).t(),  # not contiguous
               torch.tensor(2.5, dtype=torch.float64), torch.empty(0, dtype=torch.int32),
               torch.randn(4, dtype=torch.bfloat16), torch.tensor([1, 2], dtype=torch.uint8)]
    buffer, slots = pack_tensors(tensors, pin_memory=False)
    assert buffer.dtype == torch.uint8 and all(start % ALIGNMENT == 0 for start, *_ in slots)
    for got, want in zip(unpack_tensors(buffer.clone(), slots), tensors, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    batch = {"tokens": tensors[1], "layout": ("host", 3)}
    moved = batch_to_device(batch, "cpu")  # nothing to copy on the CPU
    assert moved["tokens"] is tensors[1] and moved["layout"] == ("host", 3)
