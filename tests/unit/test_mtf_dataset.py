"""megatron/data/mtf_dataset.py: pairing, packing, truncation, masks, loss weights, caching."""
import os
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

from megatron.data.mtf_dataset import (
    MTFDataset,
    MTFDocumentPair,
    PackedSamplesOnly,
    document_range,
    pack_lengths,
    pack_sample,
    truncated_lengths,
)

PAD = 999


def write_docs(prefix, docs):
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=DType.optimal_dtype(1000))
    for d in docs:
        builder.add_document(np.asarray(d, dtype=np.int32), [len(d)])
    builder.finalize(prefix + ".idx")


def make_pairs(tmp_path, n=200, seed=0, max_in=60, max_tg=12, name="mtf"):
    """n pairs with distinct token contents (doc id encoded in the tokens); returns prefix, pairs."""
    rng = np.random.default_rng(seed)
    inputs, targets = [], []
    for _i in range(n):
        li, lt = int(rng.integers(0, max_in + 1)), int(rng.integers(1, max_tg + 1))
        inputs.append(rng.integers(0, 500, li).tolist())
        targets.append(rng.integers(500, 990, lt).tolist())
    prefix = str(tmp_path / name)
    write_docs(prefix + "_inputs_document", inputs)
    write_docs(prefix + "_targets_document", targets)
    return prefix, list(zip(inputs, targets, strict=True))


def reference_segment(inp, tgt, seq_length):
    """Naive truncation: keep the target (up to seq_length), then the input's last tokens."""
    tgt = list(tgt)[:seq_length]
    room = seq_length - len(tgt)
    inp = list(inp)[max(len(inp) - room, 0):] if room > 0 else []
    return inp, tgt


def segments_of(sample):
    """(segment id -> token list, is-input flags derived from positions) of a built sample."""
    seg = sample["segment_ids"].numpy()
    tok = sample["tokens"].numpy()
    return {int(k): tok[seg == k].tolist() for k in np.unique(seg) if k > 0}


# ---------------------------------------------------------------- pairing
def test_pair_count_mismatch_is_refused(tmp_path):
    write_docs(str(tmp_path / "bad_inputs_document"), [[1, 2], [3], [4, 5]])
    write_docs(str(tmp_path / "bad_targets_document"), [[6], [7]])
    with pytest.raises(ValueError) as err:
        MTFDocumentPair(str(tmp_path / "bad"))
    msg = str(err.value)
    assert "bad_inputs_document.idx" in msg and "bad_targets_document.idx" in msg
    assert "3" in msg and "2" in msg


def test_missing_file_is_named(tmp_path):
    write_docs(str(tmp_path / "half_inputs_document"), [[1]])
    with pytest.raises(FileNotFoundError, match="half_targets_document"):
        MTFDocumentPair(str(tmp_path / "half"))


def test_document_range_splits_without_overlap():
    for n in (1, 7, 100, 1001):
        a, b = document_range(n, 0.0, 0.9), document_range(n, 0.9, 1.0)
        assert a[0] == 0 and a[1] == b[0] and b[1] == n
    with pytest.raises(ValueError):
        document_range(10, 0.5, 0.2)


# ---------------------------------------------------------------- packing
@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 64), min_size=0, max_size=300))
def test_pack_lengths_is_a_valid_partition(lengths):
    items, offsets = pack_lengths(lengths, 64)
    assert sorted(items.tolist()) == list(range(len(lengths)))
    for b in range(len(offsets) - 1):
        assert 0 < sum(lengths[i] for i in items[offsets[b]:offsets[b + 1]]) <= 64



def _compiled_and_python_packs(lengths, seq_length):
    from megatron.data import mtf_dataset

    kernel = mtf_dataset._load_pack_kernel()
    if kernel is None:
        pytest.skip("the T0 packing kernel cannot be built here (no compiler)")
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(-lengths, kind="stable")
    items, offsets = np.empty(len(lengths), np.int64), np.empty(len(lengths) + 1, np.int64)
    bins = kernel.pack(lengths, order, seq_length, items, offsets)
    return (items, offsets[:bins + 1]), mtf_dataset._pack_in_python(lengths, order, seq_length)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 9000).flatmap(lambda s: st.tuples(
    st.just(s), st.lists(st.integers(1, s), min_size=0, max_size=400))))
def test_compiled_packing_is_the_python_loop(case):
    """The compiled best-fit-decreasing loop (mtf_packing.cpp) places every item where the Python
    twin does (same bins, same order within each), for rooms across several bitset words and
    summary words (seq_length up to 9,000: rooms past 4,096)."""
    seq_length, lengths = case
    (items, offsets), (ref_items, ref_offsets) = _compiled_and_python_packs(lengths, seq_length)
    np.testing.assert_array_equal(offsets, ref_offsets)
    np.testing.assert_array_equal(items, ref_items)


def test_pack_lengths_compiled_on_many_items_equals_python():
    """pack_lengths on P3-like lengths (50,000 items: the compiled path) gives the Python loop's
    packs, with many equal lengths (ties in given order) and a few items of the full length."""
    from megatron.data import mtf_dataset

    lengths = p3_like_lengths(50000, 2048, seed=3)
    lengths[::997] = 2048
    assert len(lengths) >= mtf_dataset.PACK_KERNEL_MIN_ITEMS
    if mtf_dataset._load_pack_kernel() is None:
        pytest.skip("the T0 packing kernel cannot be built here (no compiler)")
    items, offsets = pack_lengths(lengths, 2048)
    order = np.argsort(-lengths, kind="stable")
    ref_items, ref_offsets = mtf_dataset._pack_in_python(lengths, order, 2048)
    np.testing.assert_array_equal(offsets, ref_offsets)
    np.testing.assert_array_equal(items, ref_items)


def test_pack_kernel_that_cannot_be_built_leaves_the_python_loop(monkeypatch):
    """Without the kernel (no compiler: the loader gives None) pack_lengths packs in Python, the
    same packs."""
    from megatron.data import mtf_dataset

    lengths = p3_like_lengths(3000, 512, seed=4)
    monkeypatch.setitem(mtf_dataset._PACK_KERNEL, "fn", None)
    items, offsets = pack_lengths(lengths, 512)
    ref_items, ref_offsets = mtf_dataset._pack_in_python(lengths, np.argsort(-lengths, kind="stable"), 512)
    np.testing.assert_array_equal(items, ref_items)
    np.testing.assert_array_equal(offsets, ref_offsets)

def naive_first_fit_decreasing(lengths, capacity):
    bins = []
    for length in sorted(lengths, reverse=True):
        for b in bins:
            if b[0] + length <= capacity:
                b[0] += length
                break
        else:
            bins.append([length])
    return len(bins)


def p3_like_lengths(n, seq_length, seed=0):
    rng = np.random.default_rng(seed)
    inputs = np.clip(rng.lognormal(np.log(150), 0.9, n), 1, None).astype(np.int64)
    targets = np.clip(rng.lognormal(np.log(4), 0.9, n), 1, 40).astype(np.int64)
    keep_in, keep_tg = truncated_lengths(inputs, targets, seq_length)
    return keep_in + keep_tg


def test_packing_efficiency_on_p3_like_lengths():
    lengths = p3_like_lengths(20000, 2048)
    items, offsets = pack_lengths(lengths, 2048)
    efficiency = lengths.sum() / ((len(offsets) - 1) * 2048)
    assert efficiency >= 0.97, efficiency
    small = lengths[:2000]
    _, small_offsets = pack_lengths(small, 2048)
    assert len(small_offsets) - 1 <= naive_first_fit_decreasing(small.tolist(), 2048)


def test_truncation_keeps_target_and_cuts_input_from_the_left():
    assert truncated_lengths(10, 3, 8) == (5, 3)
    assert truncated_lengths(2, 3, 8) == (2, 3)
    assert truncated_lengths(10, 12, 8) == (0, 8)
    keep_in, keep_tg = truncated_lengths(np.array([10, 1]), np.array([3, 1]), 8)
    assert keep_in.tolist() == [5, 1] and keep_tg.tolist() == [3, 1]


@pytest.fixture
def pairs(tmp_path):
    return make_pairs(tmp_path)


def test_one_epoch_holds_every_pair_exactly_once(pairs, tmp_path):
    prefix, ref = pairs
    seq = 64
    ds = MTFDataset("t", prefix, seq, num_samples=1, seed=3, pad_id=PAD)
    assert ds.num_epochs == 1
    seen = []
    for i in range(len(ds)):
        sample = ds[i]
        docs = ds.documents_of_sample(i).tolist()
        segs = segments_of(sample)
        assert len(segs) == len(docs)
        for k, d in enumerate(docs, start=1):
            inp, tgt = reference_segment(*ref[d], seq)
            assert segs[k] == inp + tgt
        seen += docs
        assert (sample["tokens"][sample["segment_ids"] == 0] == PAD).all()
    assert sorted(seen) == [d for d in range(len(ref)) if ref[d][0] or ref[d][1]]
    # tokens in the epoch == tokens of the reference (nothing lost, nothing duplicated)
    total = sum(int((ds[i]["segment_ids"] > 0).sum()) for i in range(len(ds)))
    assert total == sum(sum(map(len, reference_segment(i, t, seq))) for i, t in ref)


def expected_allowed(seg, is_input, prefix_lm):
    """Which (query, key) pairs of real tokens may attend (padding rows/columns left out)."""
    s = len(seg)
    allowed = np.zeros((s, s), dtype=bool)
    for i in range(s):
        for j in range(s):
            if seg[i] == 0 or seg[i] != seg[j]:
                continue
            allowed[i, j] = j <= i or (prefix_lm and is_input[i] and is_input[j])
    return allowed


def model_allowed(sample):
    """[s, s] pairs the model lets attend, built from the sample's compact structure."""
    from megatron.model.masks import attention_structure, dense_allowed_mask
    seg, pre = sample["segment_ids"], sample.get("is_prefix")
    structure = attention_structure(seg[None], None if pre is None else pre[None])
    return dense_allowed_mask(structure, len(seg))[0, 0].numpy()


@pytest.mark.parametrize("prefix_lm", [False, True])
def test_masks_labels_and_loss_against_naive_reference(pairs, prefix_lm):
    prefix, ref = pairs
    seq = 48
    ds = MTFDataset("m", prefix, seq, num_samples=1, seed=5, pad_id=PAD, prefix_lm=prefix_lm)
    for i in range(0, len(ds), 7):
        sample = ds[i]
        seg = sample["segment_ids"].numpy()
        tokens = sample["tokens"].numpy()
        is_input = np.zeros(seq, dtype=bool)
        is_target = np.zeros(seq, dtype=bool)
        pos = 0
        for d in ds.documents_of_sample(i):
            inp, tgt = reference_segment(*ref[d], seq)
            is_input[pos:pos + len(inp)] = True
            is_target[pos + len(inp):pos + len(inp) + len(tgt)] = True
            assert sample["position_ids"][pos:pos + len(inp) + len(tgt)].tolist() == \
                list(range(len(inp) + len(tgt)))
            pos += len(inp) + len(tgt)
        # compact attention structure, no dense mask
        assert "attention_mask" not in sample and sample["segment_ids"].dtype == torch.int32
        assert ("is_prefix" in sample) == prefix_lm
        if prefix_lm:
            np.testing.assert_array_equal(sample["is_prefix"].numpy(), is_input)
        allowed = model_allowed(sample)
        real = (seg[:, None] > 0) & (seg[None, :] > 0)
        np.testing.assert_array_equal(allowed & real, expected_allowed(seg, is_input, prefix_lm))
        # segments never attend across; padding (segment 0) never reaches a real token
        assert not allowed[seg[:, None] != seg[None, :]].any()
        loss = sample["loss_mask"].numpy()
        labels = sample["labels"].numpy()
        for p in range(seq):
            same_next = p + 1 < seq and seg[p] > 0 and seg[p + 1] == seg[p]
            if same_next:
                assert labels[p] == tokens[p + 1]
            want = 1.0 if same_next and is_target[p + 1] else 0.0
            assert loss[p] == want, (p, loss[p], want)


def test_loss_on_all_tokens_and_norm_target_loss(pairs):
    prefix, ref = pairs
    seq = 64
    causal_all = MTFDataset("a", prefix, seq, 1, seed=1, pad_id=PAD, loss_on_targets_only=False)
    sample = causal_all[0]
    seg = sample["segment_ids"].numpy()
    for k in np.unique(seg[seg > 0]):
        positions = np.nonzero(seg == k)[0]
        assert sample["loss_mask"].numpy()[positions[:-1]].tolist() == [1.0] * (len(positions) - 1)
        assert sample["loss_mask"][positions[-1]] == 0
    normed = MTFDataset("n", prefix, seq, 1, seed=1, pad_id=PAD, norm_target_loss=True)
    plain = MTFDataset("p", prefix, seq, 1, seed=1, pad_id=PAD)
    for i in range(len(normed)):
        a, b = normed[i], plain[i]
        seg = a["segment_ids"].numpy()
        for k in np.unique(seg[seg > 0]):
            w = a["loss_mask"].numpy()[seg == k]
            count = b["loss_mask"].numpy()[seg == k].sum()
            if count:
                assert abs(w.sum() - 1.0) < 1e-5
                np.testing.assert_allclose(w[w > 0], 1.0 / count, rtol=1e-6)
    with pytest.raises(ValueError, match="prefix_lm"):
        MTFDataset("x", prefix, seq, 1, seed=1, prefix_lm=True, loss_on_targets_only=False)


def test_long_pairs_are_truncated_with_a_count_not_dropped(tmp_path):
    prefix, ref = make_pairs(tmp_path, n=50, max_in=120, max_tg=20, name="long")
    seq = 32
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = MTFDataset("long", prefix, seq, 1, seed=0, pad_id=PAD)
    expected = sum(1 for i, t in ref if len(i) + len(t) > seq)
    assert ds.num_truncated == expected > 0
    assert any("truncated" in str(w.message) for w in caught)
    found = {}
    for s in range(len(ds)):
        segs = segments_of(ds[s])
        for k, d in enumerate(ds.documents_of_sample(s), start=1):
            found[int(d)] = segs[k]
    assert sorted(found) == list(range(50))
    for d, (inp, tgt) in enumerate(ref):
        assert found[d][-len(tgt[:seq]):] == tgt[:seq]  # the target survives
        assert found[d] == sum(reference_segment(inp, tgt, seq), [])


def test_empty_inputs_and_targets_are_reported_and_targetless_pairs_not_packed(tmp_path):
    inputs = [[1, 2, 3], [], [8, 9], [], [10], [12, 13], []]
    targets = [[4, 5], [6, 7], [], [], [11], [], [14]]
    prefix = str(tmp_path / "holes")
    write_docs(prefix + "_inputs_document", inputs)
    write_docs(prefix + "_targets_document", targets)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = MTFDataset("holes", prefix, 16, 3, seed=0, pad_id=PAD)
    messages = [str(w.message) for w in caught]
    assert ds.num_empty_targets == 3 and ds.num_empty_inputs == 2
    assert any("MTF dataset 'holes': 3 of 7 pairs have an empty target" in m and "skipped" in m
               for m in messages), messages
    assert any("MTF dataset 'holes': 2 of 7 pairs have an empty input" in m for m in messages), messages
    packed = sorted(set(np.concatenate([ds.documents_of_sample(i) for i in range(len(ds))]).tolist()))
    assert packed == [0, 1, 4, 6]  # pairs 2, 3, 5 (no target) take no position
    tokens = np.concatenate([ds[i]["tokens"].numpy() for i in range(len(ds))])
    assert not set(tokens.tolist()) & {8, 9, 12, 13}
    assert int((tokens != PAD).sum()) == 10 * len(ds)  # 5 + 2 + 2 + 1 tokens per epoch
    # per dataset: a document range reports its own counts; a clean range reports nothing
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        head = MTFDataset("head", prefix, 16, 1, seed=0, pad_id=PAD, doc_range=(0.0, 0.5))
        MTFDataset("tail", prefix, 16, 1, seed=0, pad_id=PAD, doc_range=(4 / 7, 5 / 7))
    messages = [str(w.message) for w in caught]
    assert (head.num_empty_targets, head.num_empty_inputs) == (2, 1)
    assert any("'head': 2 of 4 pairs have an empty target" in m for m in messages), messages
    assert not any("'tail'" in m for m in messages), messages
    with pytest.raises(ValueError, match=r"MTF dataset 'none' .* has no \(input, target\) pair with "
                                         r"a target"):
        MTFDataset("none", prefix, 16, 1, seed=0, doc_range=(2 / 7, 4 / 7))


def test_deterministic_cached_resumable_and_multi_epoch(pairs, tmp_path):
    prefix, ref = pairs
    cache = tmp_path / "cache"
    a = MTFDataset("c", prefix, 64, num_samples=200, seed=11, cache_dir=str(cache), pad_id=PAD)
    files = sorted(os.listdir(cache))
    assert files and all(f.endswith(".npy") for f in files) and not any(".tmp" in f for f in files)
    b = MTFDataset("c", prefix, 64, num_samples=200, seed=11, cache_dir=str(cache), pad_id=PAD)
    c = MTFDataset("c", prefix, 64, num_samples=200, seed=11, cache_dir=None, pad_id=PAD)
    assert len(a) >= 200 and a.num_epochs >= 2
    for i in (0, 17, len(a) - 1):  # a pure function of the index, cached or not
        for key in ("tokens", "labels", "loss_mask", "segment_ids"):
            assert torch.equal(a[i][key], b[i][key]) and torch.equal(a[i][key], c[i][key])
    # every epoch holds every pair once, each with a fresh shuffle
    epochs = []
    for e in range(a.num_epochs):
        docs = np.concatenate([a.documents_of_sample(i) for i in
                               range(a.epoch_starts[e], a.epoch_starts[e + 1])])
        assert sorted(docs.tolist()) == sorted(a.documents.tolist())
        epochs.append(docs.tolist())
    assert epochs[0] != epochs[1]
    other_seed = MTFDataset("c", prefix, 64, num_samples=200, seed=12, cache_dir=str(cache))
    assert not np.array_equal(np.asarray(other_seed.items), np.asarray(a.items))


def test_pack_indices_go_into_one_index_pack_segment(pairs, tmp_path):
    from megatron.data.index_pack import IndexPack

    prefix, _ = pairs
    cache = str(tmp_path / "cache")
    pack = IndexPack()
    with pack.writing():
        packed = [MTFDataset(f"c{k}", prefix, 64, num_samples=200, seed=11 + k, cache_dir=cache,
                             pad_id=PAD, index_pack=pack) for k in range(3)]
    assert sorted(f.rsplit(".", 1)[1] for f in os.listdir(cache)) == ["bin", "json"]  # not 3 x 3
    reader = IndexPack()  # another rank: reads the segment, builds nothing
    for k, a in enumerate(packed):
        plain = MTFDataset("p", prefix, 64, num_samples=200, seed=11 + k, cache_dir=None, pad_id=PAD)
        again = MTFDataset(f"c{k}", prefix, 64, num_samples=200, seed=11 + k, cache_dir=cache,
                           pad_id=PAD, index_pack=reader)
        for name in ("items", "offsets", "epoch_starts"):
            np.testing.assert_array_equal(getattr(a, name), getattr(plain, name))
            assert not getattr(again, name).flags.writeable  # a view of the segment
            np.testing.assert_array_equal(getattr(again, name), getattr(plain, name))
    assert len(os.listdir(cache)) == 2


def test_document_range_limits_the_pairs(pairs):
    prefix, ref = pairs
    head = MTFDataset("h", prefix, 64, 1, seed=0, doc_range=(0.0, 0.8))
    tail = MTFDataset("t", prefix, 64, 1, seed=0, doc_range=(0.8, 1.0))
    h = set(np.concatenate([head.documents_of_sample(i) for i in range(len(head))]).tolist())
    t = set(np.concatenate([tail.documents_of_sample(i) for i in range(len(tail))]).tolist())
    assert not h & t and max(h) < 160 <= min(t)


def _t0_args(tmp_path, train_paths, valid_paths=None):
    from finetune_t0 import parse_t0_args

    flags = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2",
             "--seq-length", "64", "--micro-batch-size", "1", "--global-batch-size", "4",
             "--train-iters", "10", "--lr", "1e-3", "--data-cache-path", str(tmp_path / "cache"),
             "--train-weighted-split-paths", train_paths]
    if valid_paths:
        flags += ["--valid-weighted-split-paths", valid_paths]
    args = parse_t0_args(flags)
    args.tokenizer = type("Tok", (), {"pad": PAD, "eod": PAD})()
    return args


def test_t0_blend_follows_megatron_cores_rule_and_tags_dataset_id(tmp_path, dist_group):
    """The T0 training blend is megatron-core's BlendedDataset rule (build_blending_indices on
    the normalised weights) index for index, its samples are each dataset's packed samples in
    order, and every sample carries its dataset id."""
    from helpers.curriculum import megatron_blend_indices
    from megatron.data.mtf_builder import build_mtf_data

    a, _ = make_pairs(tmp_path, name="a")
    b, _ = make_pairs(tmp_path, seed=1, name="b")
    args = _t0_args(tmp_path, f"T: 1 0:1 {a}, 3 0:1 {b}")
    data = build_mtf_data(args.run_config.data, args.tokenizer)
    train = data.train
    assert len(train) == 40 and data.dataset_names == ["a", "b"]
    ref_index, ref_sample = megatron_blend_indices([1, 3], 40)
    got = [train.dataset.locate(i) for i in range(40)]
    assert [d for d, _ in got] == ref_index.tolist()
    assert [k for _, k in got] == ref_sample.tolist()
    alone = MTFDataset("b", b, 64, 30, seed=1234, pad_id=PAD)
    for i in range(40):
        sample = train[i]
        assert int(sample["dataset_id"]) == ref_index[i]
        if ref_index[i] == 1:
            assert torch.equal(sample["tokens"], alone[int(ref_sample[i])]["tokens"])


def test_t0_sample_documents_are_its_packed_pairs(tmp_path):
    """documents(k) names the pairs packed into sample k, with the token ranges kept: the input
    (truncated from the left) then the target, exactly the sample's non-padding tokens."""
    prefix, ref = make_pairs(tmp_path, max_in=80)
    ds = MTFDataset("p", prefix, 64, 30, seed=0)
    for k in range(len(ds)):
        tokens = []
        for doc, first, last in ds.sample_documents(k):
            inp, tgt = ref[doc]
            tokens += (list(inp) + list(tgt))[first:last + 1]
        sample = ds[k]
        n = int((sample["segment_ids"] > 0).sum())
        assert sample["tokens"][:n].tolist() == tokens
        epoch, position = ds.epoch_and_position(k)
        assert ds.epoch_starts[epoch] + position == k


@pytest.mark.parametrize("position", ["learned_absolute", "alibi", "rope"])
def test_packed_segments_do_not_see_each_other_in_the_model(dist_group, position):
    """Logits of a segment inside a packed sample equal those of the segment alone (compact
    attention structure -> the model's SDPA backend), with and without --prefix-lm."""
    from megatron.core import parallel_state

    from helpers.models import gpt_model
    from megatron.config.parser import parse_args
    from megatron.model.masks import attention_structure_from_batch

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1)
    args = parse_args(["--num-layers", "2", "--hidden-size", "48", "--num-attention-heads", "6",
                       "--seq-length", "40", "--micro-batch-size", "1", "--train-iters", "1",
                       "--lr", "0", "--transformer-impl", "local", "--hidden-dropout", "0",
                       "--attention-dropout", "0", "--position-embedding-type", position],
                      require_data=False)
    args.padded_vocab_size = 1024
    torch.manual_seed(0)
    model = gpt_model(args).eval()

    def logits(sample):
        batch = {k: v[None] for k, v in sample.items()}
        return model(batch["tokens"], batch["position_ids"], None,
                     packed_seq_params=attention_structure_from_batch(batch))

    rng = np.random.default_rng(0)
    pairs = [(rng.integers(0, 500, 9), rng.integers(500, 990, 4)),
             (rng.integers(0, 500, 12), rng.integers(500, 990, 3)),
             (rng.integers(0, 500, 5), rng.integers(500, 990, 2))]
    for prefix_lm in (False, True):
        packed = pack_sample(pairs, 40, PAD, prefix_lm=prefix_lm)
        with torch.no_grad():
            out = logits(packed)
            pos = 0
            for p in pairs:
                single = logits(pack_sample([p], len(p[0]) + len(p[1]), PAD, prefix_lm=prefix_lm))
                n = single.shape[1]
                torch.testing.assert_close(out[0, pos:pos + n], single[0], rtol=1e-5, atol=1e-5)
                pos += n
            if prefix_lm:  # the structure matters: plain causal attention gives other logits
                causal = model(packed["tokens"][None], packed["position_ids"][None], None)
                assert not torch.allclose(causal[0, :13], out[0, :13], atol=1e-3)
        assert torch.isfinite(out).all()


def test_prefix_lm_mask_small_case():
    seg = torch.tensor([1, 1, 1, 1, 2, 2, 0], dtype=torch.int32)
    inp = torch.tensor([1, 1, 0, 0, 1, 0, 0], dtype=torch.bool)
    allowed = model_allowed({"segment_ids": seg, "is_prefix": inp})
    assert allowed[0, 1] and allowed[1, 0]          # inputs see each other both ways
    assert not allowed[0, 2] and not allowed[1, 3]  # inputs never see targets
    assert allowed[3, 0] and allowed[3, 2] and not allowed[2, 3]  # targets causal
    assert not allowed[4, 3] and not allowed[3, 4] and allowed[5, 4]
    assert not allowed[6, :6].any() and not allowed[:6, 6].any()  # padding: only itself

def test_blend_refuses_samples_without_segment_ids():
    """The T0 blend (what every layout reads, pipe engine included) refuses a sample that does
    not carry segment_ids, so attention can never cross packed segments unnoticed."""
    plain = [{"tokens": torch.zeros(4, dtype=torch.long), "dataset_id": 0}] * 4
    with pytest.raises(ValueError, match=r"T0 samples must carry segment_ids \(blend sample 0, "
                                         r"dataset 0\)"):
        PackedSamplesOnly(plain)[0]
    packed = [dict(plain[0], segment_ids=torch.ones(4, dtype=torch.int32))] * 4
    assert PackedSamplesOnly(packed)[3]["segment_ids"].tolist() == [1] * 4


def test_mtf_fingerprint_from_the_open_pair_is_the_headers(tmp_path):
    """The T0 ledger's fingerprint, taken from the pair's open indices, is the one read from the
    two .idx headers."""
    from megatron.data.mix_ledger import gpt_files_fingerprint
    from megatron.data.mtf_builder import mtf_fingerprint

    prefix, _ = make_pairs(tmp_path, n=30)
    pair = MTFDocumentPair(prefix)
    assert mtf_fingerprint(pair) == (f"inputs: {gpt_files_fingerprint(pair.inputs_path)}; "
                                     f"targets: {gpt_files_fingerprint(pair.targets_path)}")


def test_mtf_constituents_take_distinct_names(tmp_path):
    """A T0 prefix listed at two document ranges, and another of the same short name in another
    directory, are three datasets named after the prefix, the later ones with _2 and _3."""
    from megatron.data.mtf_builder import items_blend, resolve_mtf_constituents

    a, _ = make_pairs(tmp_path, n=20, name="task")
    (tmp_path / "other").mkdir()
    b, _ = make_pairs(tmp_path / "other", n=20, name="task")
    blend = items_blend([(1.0, 0.0, 0.5, a), (1.0, 0.5, 1.0, a), (2.0, 0.0, 1.0, b)], "T", "test")
    cons = resolve_mtf_constituents(blend, 64, {})
    assert [c.name for c in cons] == ["task", "task_2", "task_3"]
    assert [(c.doc_begin, c.doc_end) for c in cons] == [(0, 10), (10, 20), (0, 20)]
