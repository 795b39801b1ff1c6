"""The pack of every dataset's GPTDataset indices (megatron/data/index_pack.py): the arrays and
samples are megatron-core's own, a build leaves one segment (two files) per cache directory, a
warm start builds nothing, a later build adds only what is missing, a failed build leaves
nothing."""
import os
import pickle

import numpy as np
import pytest
from megatron.core.datasets import helpers
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
from megatron.core.datasets.indexed_dataset import IndexedDataset
from megatron.core.datasets.utils import Split

from helpers.curriculum import write_corpus
from megatron.data.index_pack import SEGMENT_PREFIX, IndexPack, PackedGPTDataset
from megatron.tokenizer import ByteLevelTokenizer

SEQ = 16


def _config(cache, seed=1):
    return GPTDatasetConfig(random_seed=seed, sequence_length=SEQ, tokenizer=ByteLevelTokenizer(),
                            reset_position_ids=False, reset_attention_mask=False,
                            eod_mask_loss=False, path_to_cache=str(cache) if cache else None,
                            blend=None, blend_per_split=None, split="1,0,0")


@pytest.fixture(scope="module")
def prefixes(tmp_path_factory):
    root = tmp_path_factory.mktemp("pack")
    rng = np.random.default_rng(0)
    return [write_corpus(str(root / f"ds{k}_text_document"), rng.integers(5, 60, 30 + 7 * k), k)
            for k in range(4)]


def _dataset(cls, prefix, config, *extra, samples=None):
    low = IndexedDataset(prefix, multimodal=False, mmap=True)
    n = samples or (int(low.sequence_lengths.sum()) - 1) // SEQ
    return cls(*extra, low, prefix, np.arange(len(low.sequence_lengths), dtype=np.int32), n,
               Split.train, config)


def _files(cache):
    return sorted(n for n in os.listdir(cache))


def test_packed_indices_and_samples_are_megatron_cores(prefixes, tmp_path):
    pack = IndexPack()
    with pack.writing():
        packed = [_dataset(PackedGPTDataset, p, _config(tmp_path / "pack"), pack) for p in prefixes]
    for p, ours in zip(prefixes, packed, strict=True):
        peer = _dataset(GPTDataset, p, _config(tmp_path / "peer"))
        for name in ("document_index", "sample_index", "shuffle_index"):
            np.testing.assert_array_equal(getattr(ours, name), getattr(peer, name))
        for i in (0, len(peer) // 2, len(peer) - 1):
            np.testing.assert_array_equal(ours[i]["tokens"].numpy(), peer[i]["tokens"].numpy())
    # megatron-core: four files per dataset; the pack: one segment, two files, for all of them
    assert len(_files(tmp_path / "peer")) == 4 * len(prefixes)
    files = _files(tmp_path / "pack")
    assert len(files) == 2 and all(f.startswith(SEGMENT_PREFIX) for f in files), files
    assert files == sorted(os.path.basename(f) for f in pack.segment_files())


def test_a_warm_start_builds_nothing_and_a_later_build_adds_only_what_is_missing(
        prefixes, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    pack = IndexPack()
    with pack.writing():
        first = [_dataset(PackedGPTDataset, p, _config(cache), pack) for p in prefixes[:3]]
    assert len(_files(cache)) == 2

    def no_build(*args, **kwargs):
        raise AssertionError("an index was built on a warm start")

    monkeypatch.setattr(helpers, "build_sample_idx", no_build)
    warm = pickle.loads(pickle.dumps(IndexPack()))  # as a DataLoader worker gets it
    again = [_dataset(PackedGPTDataset, p, _config(cache), warm) for p in prefixes[:3]]
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a.shuffle_index, b.shuffle_index)
        assert isinstance(b.sample_index, np.ndarray) and not b.sample_index.flags.writeable
    monkeypatch.undo()
    with warm.writing():  # one more dataset, and another seed of a known one
        _dataset(PackedGPTDataset, prefixes[3], _config(cache), warm)
        _dataset(PackedGPTDataset, prefixes[0], _config(cache, seed=7), warm)
        _dataset(PackedGPTDataset, prefixes[1], _config(cache), warm)  # known: not added again
    files = _files(cache)
    assert len(files) == 4, files
    import json
    catalogs = [json.load(open(cache / f)) for f in files if f.endswith(".json")]
    assert sorted(len(c["entries"]) for c in catalogs) == [2, 3]


def test_a_reader_builds_a_miss_in_memory_and_writes_nothing(prefixes, tmp_path):
    cache = tmp_path / "cache"
    os.makedirs(cache)
    ours = _dataset(PackedGPTDataset, prefixes[0], _config(cache), IndexPack())
    peer = _dataset(GPTDataset, prefixes[0], _config(tmp_path / "peer"))
    np.testing.assert_array_equal(ours.shuffle_index, peer.shuffle_index)
    assert _files(cache) == []


def test_a_failed_build_publishes_nothing_and_leaves_nothing(prefixes, tmp_path):
    cache = tmp_path / "cache"
    pack = IndexPack()
    with pytest.raises(RuntimeError, match="stop"):
        with pack.writing():
            _dataset(PackedGPTDataset, prefixes[0], _config(cache), pack)
            raise RuntimeError("stop")
    assert _files(cache) == []
    assert pack.lookup(str(cache), "anything") is None


def test_without_a_cache_directory_megatron_core_builds_in_memory(prefixes, tmp_path):
    config = _config(None)
    assert config.mock  # no blend: megatron-core caches nothing, and neither does the pack
    pack = IndexPack()
    with pack.writing():
        ours = _dataset(PackedGPTDataset, prefixes[2], config, pack)
    peer = _dataset(GPTDataset, prefixes[2], config)
    np.testing.assert_array_equal(ours.document_index, peer.document_index)
    assert pack.segment_files() == []
