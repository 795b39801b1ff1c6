"""``--pack-documents best-fit`` (megatron/data/document_packing.py, best_fit_dataset.py): whole documents packed
best-fit decreasing into bins of ``seq_length + 1`` tokens, documents longer than that cut into
chunks, the bins one epoch.

The packing is checked against its definition (every document token in exactly one bin once per
epoch, no bin over the capacity, the bin count between the token lower bound and the any-fit
upper bound, independent of the seed, the same bins for the same seed), the samples against a
pure-Python packing of the same corpus with megatron-core's masks, and the flag end to end: from
the command line to the training data, the resume check and the T0 entry point's refusal. That a
different ``--pack-documents`` gives a different cache key: tests/unit/test_cache_keys.py."""
import json
import math

import numpy as np
import pytest
import torch

from helpers.curriculum import write_corpus
from helpers.flags import one_error_line, tiny_run_flags
from megatron.data import document_packing
from megatron.data.best_fit_dataset import BinShuffledSamples, PackingGPTDatasetConfig
from megatron.data.document_packing import (
    BINS_TAG,
    TIES_TAG,
    best_fit_bin_count,
    best_fit_bins,
    document_chunks,
)

SEQ = 16
CAP = SEQ + 1
EOD, PAD = 256, 257  # the byte-level tokenizer's


def long_tailed(n: int, seed: int, median: float = 9.0, sigma: float = 1.1) -> np.ndarray:
    """``n`` lognormal document lengths (tokens, at least 1): most shorter than a bin, a few
    several bins long."""
    rng = np.random.default_rng(seed)
    return np.maximum(1, rng.lognormal(math.log(median), sigma, n)).astype(np.int64)


def reference_bins(lengths, capacity: int, seed: int):
    """The packing by its definition, in plain Python: each document cut into chunks of
    ``capacity`` tokens (the last shorter), taken longest first (ties in the seed's order), each
    into the open bin with the least room that fits it (among equal rooms the one that reached it
    last), else a new bin. Returns the bins in creation order, each ``[(document, chunk), ...]``
    in placement order."""
    items = [(d, j, min(capacity, int(n) - j * capacity)) for d, n in enumerate(lengths)
             for j in range(-(-int(n) // capacity))]
    ties = np.random.default_rng([seed, TIES_TAG]).permutation(len(items))
    rank = {int(i): k for k, i in enumerate(ties)}
    order = sorted(range(len(items)), key=lambda i: (-items[i][2], rank[i]))
    bins = []  # [room, when it reached that room, [(document, chunk), ...]]
    for t, i in enumerate(order):
        d, j, n = items[i]
        fits = [b for b in bins if b[0] >= n]
        if fits:
            b = min(fits, key=lambda b: (b[0], -b[1]))
        else:
            b = [capacity, -1, []]
            bins.append(b)
        b[0], b[1] = b[0] - n, t
        b[2].append((d, j))
    return [b[2] for b in bins]


def _bins_of(documents, chunks, offsets):
    return [list(zip(documents[a:b].tolist(), chunks[a:b].tolist(), strict=True))
            for a, b in zip(offsets[:-1], offsets[1:], strict=True)]


# ------------------------------------------------------------------ the packing itself
@pytest.mark.parametrize("n, capacity", [(400, CAP), (5000, 129)])  # 5000 items: the compiled loop
def test_every_token_once_no_bin_over_the_capacity(n, capacity):
    lengths = long_tailed(n, seed=n, median=capacity / 2)
    lengths[::97] = 0  # empty documents make no item
    documents, chunks, offsets = best_fit_bins(lengths, capacity, seed=3)
    sizes = np.minimum(capacity, lengths[documents] - chunks * capacity)
    assert (sizes >= 1).all()
    assert (np.add.reduceat(sizes, offsets[:-1]) <= capacity).all()
    # each document's tokens [0, length) covered once: its chunks 0..ceil(length / capacity) - 1
    expected = {(d, j) for d, length in enumerate(lengths.tolist())
                for j in range(-(-length // capacity))}
    got = list(zip(documents.tolist(), chunks.tolist(), strict=True))
    assert len(got) == len(set(got)) and set(got) == expected
    assert sizes.sum() == lengths.sum()
    # only the documents longer than a bin are split (the declared chunking), and a full chunk
    # fills its bin alone: documents sharing a bin are whole or last chunks
    split = {d for d, j in got if j > 0}
    assert split == set(np.flatnonzero(lengths > capacity).tolist())
    for items in _bins_of(documents, chunks, offsets):
        if len(items) > 1:
            assert all((j + 1) * capacity >= lengths[d] for d, j in items)


def test_bin_count_bounds_seed_independence_and_determinism():
    lengths = long_tailed(3000, seed=7)
    total = int(lengths.sum())
    count = best_fit_bin_count(lengths, CAP)
    assert count >= -(-total // CAP)            # no packing beats the tokens' lower bound
    assert count <= 2 * total / CAP + 1         # any-fit: all bins but one more than half full
    runs = {seed: best_fit_bins(lengths, CAP, seed) for seed in (0, 1, 2)}
    for _, _, offsets in runs.values():
        assert len(offsets) - 1 == count        # ties reorder documents, never the bin count
    again = best_fit_bins(lengths, CAP, 1)
    for a, b in zip(runs[1], again, strict=True):
        np.testing.assert_array_equal(a, b)     # same seed, same bins
    assert _bins_of(*runs[0]) != _bins_of(*runs[1])
    # nearly every bin full on a long-tailed corpus (fewer than 1% more bins than the bound)
    assert count <= 1.01 * -(-total // CAP) + 1


def test_compiled_and_python_packing_equal_the_definition():
    for n, seed in ((60, 0), (2500, 5)):  # 2,500 items: pack_lengths' compiled loop
        lengths = long_tailed(n, seed=seed)
        assert _bins_of(*best_fit_bins(lengths, CAP, seed)) == reference_bins(lengths, CAP, seed)


def test_document_chunks_cut_at_the_capacity():
    documents, chunks, tokens = document_chunks(np.array([3, 17, 18, 0, 35]), 17)
    assert documents.tolist() == [0, 1, 2, 2, 4, 4, 4]
    assert chunks.tolist() == [0, 0, 0, 1, 0, 1, 2]
    assert tokens.tolist() == [3, 17, 17, 1, 17, 17, 1]


# ------------------------------------------------------------------ the samples
LENGTHS = [5, 40, 17, 3, 9, 33, 12, 1, 60, 8, 2, 16, 18, 7, 4, 25]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A corpus of documents ending in EOD, a few longer than a bin."""
    d = tmp_path_factory.mktemp("packing")
    return write_corpus(str(d / "c_text_document"), LENGTHS, seed=0, eod=EOD)


def _config(cache, masks: bool, seed: int = 1, packing: str = "best-fit"):
    from megatron.tokenizer import ByteLevelTokenizer

    return PackingGPTDatasetConfig(
        random_seed=seed, sequence_length=SEQ, tokenizer=ByteLevelTokenizer(),
        reset_position_ids=masks, reset_attention_mask=masks, eod_mask_loss=masks,
        path_to_cache=str(cache), blend=None, blend_per_split=None, split="1,0,0",
        create_attention_mask=False, pack_documents=packing)


def _dataset(corpus, config, num_samples):
    from megatron.data.blend_config import parse_blend_config
    from megatron.data.curriculum.dataset import build_curriculum_dataset
    from megatron.schedules.units import BatchSchedule

    blend = parse_blend_config({"valid": [{"name": "c", "path": corpus}]}, "v.yaml",
                               check_files=False).valid[0]
    return build_curriculum_dataset(blend, num_samples, config, BatchSchedule(2, None, SEQ), "valid")


def _expected_sample(text: torch.Tensor, masks: bool):
    """megatron-core's sample of the ``SEQ + 1`` tokens ``text`` (its ``GPTDataset.__getitem__``
    steps, with its ``_get_ltor_masks_and_position_ids``)."""
    from megatron.core.datasets.gpt_dataset import _get_ltor_masks_and_position_ids

    tokens, labels = text[:-1].clone(), text[1:].clone()
    _, loss_mask, position_ids = _get_ltor_masks_and_position_ids(tokens, EOD, masks, masks, masks,
                                                                  False)
    loss_mask[labels == PAD] = 0.0
    tokens[tokens == PAD] = 0
    labels[labels == PAD] = 0
    return {"tokens": tokens, "labels": labels, "loss_mask": loss_mask, "position_ids": position_ids}


@pytest.mark.parametrize("masks", [False, True], ids=["masks-off", "document-masks"])
def test_samples_equal_a_python_packing_with_megatron_cores_masks(corpus, tmp_path, masks):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    from megatron.data.document_segments import segment_ids_after_eod

    seed = 1
    bins = reference_bins(LENGTHS, CAP, seed)
    order = np.random.default_rng([seed, BINS_TAG]).permutation(len(bins))
    ds = _dataset(corpus, _config(tmp_path / "cache", masks, seed), 2 * len(bins))
    (c,) = ds.constituents
    assert c.packing == "best-fit" and c.samples_per_epoch == len(bins) and c.passes == 1
    source = ds.datasets[0].open()  # the pool's lazily opened source
    assert isinstance(source, BinShuffledSamples)
    docs = IndexedDataset(corpus)
    for p in range(len(bins)):  # epoch 0: the bins in the seed's order
        items = bins[order[p]]
        parts = [docs[d][j * CAP:(j + 1) * CAP] for d, j in items]
        filled = sum(len(x) for x in parts)
        text = torch.from_numpy(np.concatenate(parts + [np.full(CAP - filled, PAD)]).astype(np.int64))
        sample = source[p]
        expected = _expected_sample(text, masks)
        assert set(sample) == set(expected)
        for key, value in expected.items():
            assert sample[key].dtype == value.dtype, key
            assert torch.equal(sample[key], value), (p, key)
        # --reset-attention-mask: each document of the bin is its own segment (each ends in EOD;
        # the pads after the last EOD are one more, without loss)
        segments = segment_ids_after_eod(sample["tokens"][None], EOD)[0]
        ends = np.cumsum([len(x) for x in parts])
        if all(x[-1] == EOD for x in parts):  # (a document's first token may be the last label)
            starts = [s for s in [0] + [int(e) for e in ends[:-1]] if s < SEQ]
            assert [int(segments[s]) for s in starts] == list(range(1, len(starts) + 1))
            assert len(set(segments[:min(filled, SEQ)].tolist())) == len(starts)
        assert sample["loss_mask"][filled - 1:].sum() == 0  # labels of pads take no loss
        assert source.sample_documents(p) == [[d, j * CAP, j * CAP + len(x) - 1]
                                              for (d, j), x in zip(items, parts, strict=True)]
    # epoch 1 shows the same bins in another order
    epoch0 = sorted(str(source.sample_documents(p)) for p in range(len(bins)))
    epoch1 = [str(source.sample_documents(len(bins) + p)) for p in range(len(bins))]
    assert sorted(epoch1) == epoch0 and epoch1 != [str(source.sample_documents(p))
                                                  for p in range(len(bins))]


def test_provenance_names_every_token_once_per_epoch(corpus, tmp_path):
    """tools/data_provenance.py's fields of a bin: its documents' token ranges cover each document
    once per epoch, and its range of the token stream (``--coverage``) makes an epoch one
    contiguous range, none drawn twice."""
    from megatron.data.provenance import token_coverage

    ds = _dataset(corpus, _config(tmp_path / "cache", masks=False), 60)
    source, n = ds.datasets[0], ds.constituents[0].samples_per_epoch
    records = [{"dataset": "c", "seq_length": SEQ, "epoch": e, "tokens": ranges}
               for e, ranges in (source.token_ranges(k) for k in range(2 * n))]
    coverage = token_coverage(records)["c"]
    assert sorted(coverage) == [0, 1]
    for epoch in (0, 1):
        assert coverage[epoch]["ranges"] == [[0, sum(LENGTHS)]] and not coverage[epoch]["repeated"]
    for epoch in (0, 1):
        covered = {}
        for k in range(epoch * n, (epoch + 1) * n):
            for d, first, last in source.sample_documents(k):
                covered.setdefault(d, []).append((first, last))
        for d, length in enumerate(LENGTHS):
            spans = sorted(covered[d])
            assert spans[0][0] == 0 and spans[-1][1] == length - 1
            assert all(a[1] + 1 == b[0] for a, b in zip(spans, spans[1:], strict=False))


def test_bins_are_built_once_and_read_from_the_index_pack(corpus, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    first = _dataset(corpus, _config(cache, masks=False), 20)
    files = sorted(p.name for p in cache.iterdir())
    assert any(name.startswith("index-pack-") for name in files)

    def no_packing(*args, **kwargs):
        raise AssertionError("packed again instead of read from the index pack")

    monkeypatch.setattr(document_packing, "best_fit_bins", no_packing)
    again = _dataset(corpus, _config(cache, masks=False), 20)
    assert sorted(p.name for p in cache.iterdir()) == files
    for k in range(20):
        assert torch.equal(first[k]["tokens"], again[k]["tokens"])


# ------------------------------------------------------------------ the flag, end to end
def _data_flags(prefix, cache, extra=()):
    return tiny_run_flags(data_path=None, train_iters=4, global_batch_size=4) + [
        "--data-path", prefix, "--split", "98,2,0", "--data-cache-path", str(cache), "--eval-iters",
        "1", "--eval-interval", "2", *extra]


def test_the_flag_reaches_the_training_data_from_the_command_line(demo_data, tmp_path):
    from helpers.flags import parse
    from megatron.data.builder import build_pretraining_data
    from megatron.tokenizer import ByteLevelTokenizer

    built = {}
    for mode in ("concat", "best-fit"):
        config = parse(_data_flags(demo_data["web"], tmp_path / "cache",
                                   ["--pack-documents", mode]), base=[]).run_config.data
        assert config.pack_documents == mode
        built[mode] = build_pretraining_data(config, ByteLevelTokenizer())
    packed, windows = built["best-fit"], built["concat"]
    (c,) = packed.train.constituents
    assert c.packing == "best-fit" and windows.train.constituents[0].packing == "concat"
    source = packed.train.datasets[0].open()
    assert isinstance(source, BinShuffledSamples)
    assert c.samples_per_epoch == len(source.epoch_dataset) == best_fit_bin_count(
        source.epoch_dataset.dataset.sequence_lengths[c.doc_begin:c.doc_end], 33)
    assert c.samples_per_epoch >= -(-c.tokens // 33)  # bins of 33 tokens (windows: 32 new ones)
    sample, window = packed.train[0], windows.train[0]
    assert set(sample) == set(window)
    assert all(sample[k].dtype == window[k].dtype and sample[k].shape == window[k].shape
               for k in sample if k != "dataset_id")
    # validation is packed the same way
    (group,) = packed.eval_groups
    assert isinstance(group.dataset.datasets[0].open(), BinShuffledSamples)
    # a resume through the data ledger (the same mix: the recorded phase) draws the same bins
    from megatron.data.mix_ledger import MixRecord
    from megatron.data.mix_resume import DataResume

    record = MixRecord.from_json(json.loads(json.dumps(packed.mix.record(2, 8).to_json())))
    assert record.ledger[0].samples_per_epoch == c.samples_per_epoch
    resumed = build_pretraining_data(config, ByteLevelTokenizer(), DataResume("ckpt", 2, record))
    assert len(resumed.mix.phases) == 1 and not resumed.mix.notes
    for i in range(8, 16):
        assert torch.equal(resumed.train[i]["tokens"], packed.train[i]["tokens"])


def _checkpoint(tmp_path, flags):
    """A --load directory whose latest checkpoint (iteration 6) records the run of ``flags``."""
    from helpers.flags import parse
    from megatron.config.checkpoint_args import model_args_from_args

    directory = tmp_path / "ckpt" / "iter_0000006"
    directory.mkdir(parents=True)
    (directory / "model_args.json").write_text(json.dumps(model_args_from_args(parse(flags))))
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("6")
    return str(tmp_path / "ckpt")


def test_a_resume_keeps_the_packing_and_a_best_fit_resume_its_length(tmp_path, capsys):
    from helpers.flags import parse

    best_fit = ["--pack-documents", "best-fit"]
    load = _checkpoint(tmp_path, best_fit)
    record = json.loads((tmp_path / "ckpt" / "iter_0000006" / "model_args.json").read_text())
    assert record["run"]["pack_documents"] == "best-fit"
    err = one_error_line(tiny_run_flags() + ["--load", load], capsys)
    assert "--pack-documents best-fit -> concat:" in err and "--reset-progress" in err
    err = one_error_line(tiny_run_flags(seq_length=64) + ["--load", load, *best_fit,
                                                          "--extend-context"], capsys)
    assert "--pack-documents best-fit: --seq-length 32 -> 64:" in err
    # the same packing and length continue; --reset-progress starts the data afresh
    assert parse(["--load", load, *best_fit]).pack_documents == "best-fit"
    assert parse(["--load", load, "--reset-progress"]).pack_documents == "concat"


def test_finetune_t0_refuses_best_fit(capsys):
    from finetune_t0 import parse_t0_args
    from megatron.errors import ArgumentError

    with pytest.raises(ArgumentError, match="--pack-documents best-fit: finetune_t0.py packs"):
        parse_t0_args(tiny_run_flags(data_path=None) + [
            "--train-weighted-split-paths", "T: 1 0:1 some/prefix", "--pack-documents", "best-fit"])
