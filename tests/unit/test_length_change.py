"""The training data across a change of the sequence length (megatron/data/length_change.py, the
ledger's ``prior``): a 64 -> 256 extension over a blend of three real datasets continues each one
where it stopped, every input token of an epoch drawn exactly once over both lengths, against a
pure reference of the token streams (megatron-core's document order and reader); a resume inside
the long stage is bitwise; a second change (256 -> 128) too; the interval algebra against sets."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from megatron.core.datasets.gpt_dataset import GPTDatasetConfig
from megatron.core.datasets.indexed_dataset import IndexedDataset

from helpers.curriculum import write_corpus
from megatron.data.blend_config import parse_blend_config
from megatron.data.builder import gpt_mix_sources
from megatron.data.length_change import TokenRanges
from megatron.data.mix_ledger import MixRecord
from megatron.data.mix_resume import DataResume, continue_training_mix
from megatron.errors import ConfigError
from megatron.schedules.units import BatchSchedule
from megatron.tokenizer import ByteLevelTokenizer

SEED = 1234


# ---- the interval algebra -------------------------------------------------------------------

def _tokens(ranges: TokenRanges):
    return [t for s, n in zip(ranges.starts, ranges.lengths, strict=True) for t in range(s, s + n)]


@settings(max_examples=60, deadline=None)
@given(st.sets(st.integers(0, 60), min_size=1), st.integers(1, 7), st.integers(1, 9),
       st.data())
def test_token_ranges_against_sets(windows, L, L2, data):
    ranges = TokenRanges.of_windows(np.array(sorted(windows)), L)
    want = [t for j in sorted(windows) for t in range(j * L, j * L + L)]
    assert _tokens(ranges) == want and ranges.total == len(want)
    assert all(ranges.starts[1:] > ranges.starts[:-1] + ranges.lengths[:-1])  # merged, sorted
    m = -(-ranges.total // L2)
    slots = data.draw(st.sets(st.integers(0, m - 1)))
    rest = ranges.without_slots(np.array(sorted(slots), dtype=np.int64), L2)
    gone = {want[i] for q in slots for i in range(q * L2, min(q * L2 + L2, len(want)))}
    assert _tokens(rest) == [t for t in want if t not in gone]
    for q in range(m):  # a slot's pieces are its flat tokens
        lo, hi = q * L2, min(q * L2 + L2, ranges.total)
        assert [t for s, n in ranges.pieces(lo, hi) for t in range(s, s + n)] == want[lo:hi]


# ---- a 64 -> 256 extension over three datasets --------------------------------------------------

@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("length_change")
    rng = np.random.default_rng(5)
    return [write_corpus(str(root / name), rng.integers(20, 300, docs), seed=k)
            for k, (name, docs) in enumerate((("short", 14), ("mid", 30), ("long", 50)))]


def _sources(seq_length, cache):
    gpt_config = GPTDatasetConfig(random_seed=SEED, sequence_length=seq_length,
                                  tokenizer=ByteLevelTokenizer(), path_to_cache=cache,
                                  reset_position_ids=False, reset_attention_mask=False,
                                  eod_mask_loss=False, create_attention_mask=False,
                                  mid_level_dataset_surplus=0.005)
    config = SimpleNamespace(data_cache_path=cache, data_index_order="auto")
    return gpt_mix_sources(config, "blend_config", gpt_config)


def _blend(corpus):
    obj = {"train": {"blend": [{"path": p, "weight": w} for p, w in zip(corpus, (1, 2, 3), strict=True)]}}
    return parse_blend_config(obj, "extension.yaml").train


def _mix(corpus, cache, seq, gbs, num_samples, record=None, iteration=0):
    resume = None if record is None else DataResume("ckpt", iteration, MixRecord.from_json(
        record.to_json()))  # through JSON, as a checkpoint stores it
    return continue_training_mix(_sources(seq, cache), _blend(corpus), num_samples,
                                 BatchSchedule(gbs, None, seq), SEED, resume)


def _stream(prefix):
    """The pure reference: the dataset's documents in megatron-core's one-epoch order (a
    RandomState(seed) shuffle), read with megatron-core's reader, one after the other."""
    indexed = IndexedDataset(prefix, multimodal=False, mmap=True)
    order = np.arange(len(indexed), dtype=np.int32)
    np.random.RandomState(SEED).shuffle(order)
    return np.concatenate([indexed.get(int(d)) for d in order]).astype(np.int64)


def _check_samples(mix, lo, hi, streams, seq, seen):
    """Each global sample of ``[lo, hi)``: its tokens and labels are the stream's at the input
    ranges its source names; collects ``seen[(dataset, epoch)] += ranges``."""
    ds = mix.dataset
    for i in range(lo, hi):
        d, k = ds.locate(i)
        name = ds.constituents[d].name
        epoch, ranges = ds.datasets[d].token_ranges(k)
        sample = ds[i]
        stream = streams[name]
        idx = np.concatenate([np.arange(a, b) for a, b in ranges])
        real = len(idx)
        assert real <= seq and sample["tokens"].shape == (seq,)
        assert torch.equal(sample["tokens"][:real], torch.from_numpy(stream[idx]))
        assert torch.equal(sample["labels"][:real], torch.from_numpy(stream[idx + 1]))
        assert float(sample["loss_mask"][:real].min()) == 1.0
        assert float(sample["loss_mask"][real:].sum()) == 0.0  # padding, only in a last transition
        seen.setdefault((name, epoch), []).extend(ranges)


def _coverage(seen):
    """{(dataset, epoch): (tokens drawn, union as merged ranges)}; asserts no token is drawn
    twice."""
    out = {}
    for key, ranges in seen.items():
        ranges = sorted(ranges)
        for (a0, b0), (a1, _) in zip(ranges, ranges[1:], strict=False):
            assert a1 >= b0, f"{key}: token range [{a1}, ...) drawn twice (after [{a0}, {b0}))"
        merged = []
        for a, b in ranges:
            if merged and merged[-1][1] == a:
                merged[-1][1] = b
            else:
                merged.append([a, b])
        out[key] = merged
    return out


def test_an_extension_continues_every_dataset_where_it_stopped(corpus, tmp_path):
    cache = str(tmp_path / "cache")
    streams = {name: _stream(p) for name, p in zip(("short", "mid", "long"), corpus, strict=True)}
    # stage 1: 6 iterations of 16 x 64 tokens; stage 2 keeps the tokens per step: 4 x 256
    first = _mix(corpus, cache, 64, 16, 96)
    seen = {}
    _check_samples(first, 0, 96, streams, 64, seen)
    record = first.record(6, 96)
    at_change = {e.name: e.drawn for e in record.ledger}
    assert all(0 < n for n in at_change.values())
    second = _mix(corpus, cache, 256, 4, 96 + 4 * 40, record, 6)
    assert any("continues at --seq-length 256" in n for n in second.notes)
    _check_samples(second, 96, 96 + 160, streams, 256, seen)
    cover = _coverage(seen)
    per_epoch64 = {c.name: c.samples_per_epoch for c in first.dataset.constituents}
    per_epoch256 = {c.name: c.samples_per_epoch for c in second.dataset.constituents}
    ledger = {e.name: e for e in second.record(46, 96 + 160).ledger}
    for name in streams:
        # epoch 0 began at 64 tokens: over both lengths it is [0, n64 * 64), each token once
        assert cover[(name, 0)] == [[0, per_epoch64[name] * 64]], name
        entry = ledger[name]
        assert [(s.seq_length, s.drawn) for s in entry.prior] == [(64, at_change[name])]
        if entry.epoch > 1:  # epochs that began at 256 tokens cover [0, n256 * 256)
            assert cover[(name, 1)] == [[0, per_epoch256[name] * 256]], name
    assert {e for _, e in cover} >= {0, 1} and max(e.epoch for e in ledger.values()) > 1

    # an unchanged resume inside the long stage continues bitwise
    mid = second.record(26, 96 + 80)
    again = _mix(corpus, cache, 256, 4, 96 + 160, mid, 26)
    assert len(again.phases) == len(second.phases) and not again.notes
    for i in range(96 + 80, 96 + 160):
        assert again.dataset.locate(i) == second.dataset.locate(i)
        a, b = again.dataset[i], second.dataset[i]
        assert all(torch.equal(a[key], b[key]) for key in b if key != "dataset_id")

    # a second change (256 -> 128) inside the epochs that began at 256: still each token once
    third = _mix(corpus, cache, 128, 8, 96 + 80 + 8 * 30, mid, 26)
    seen2 = {}
    _check_samples(first, 0, 96, streams, 64, seen2)
    _check_samples(second, 96, 96 + 80, streams, 256, seen2)
    _check_samples(third, 96 + 80, 96 + 80 + 240, streams, 128, seen2)
    cover2 = _coverage(seen2)
    for name in streams:
        assert cover2[(name, 0)] == [[0, per_epoch64[name] * 64]], name
    entry = {e.name: e for e in third.record(56, 96 + 80 + 240).ledger}["long"]
    assert [s.seq_length for s in entry.prior] == [64, 256]


def test_an_epochized_stage_across_a_length_change_is_one_error(corpus, tmp_path):
    cache = str(tmp_path / "cache")
    obj = {"train": {"sequential": [{"epochized_blend": [{"path": corpus[0], "repetitions": 3}]},
                                    {"blend": [{"path": corpus[1], "weight": 1}]}]}}
    blend = parse_blend_config(obj, "e.yaml").train
    first = continue_training_mix(_sources(64, cache), blend, 96, BatchSchedule(16, None, 64),
                                  SEED, None)
    record = MixRecord.from_json(first.record(2, 32).to_json())
    with pytest.raises(ConfigError, match=r"--seq-length 64 -> 256 at global sample 32: "
                                          r"e.yaml: train.* is an epochized_blend stage"):
        continue_training_mix(_sources(256, cache), blend, 96, BatchSchedule(4, None, 256), SEED,
                              DataResume("ckpt", 2, record))


def test_a_declared_replay_draws_again_only_what_was_drawn(corpus, tmp_path):
    """Stage 2 adds ``replay: true`` of ``short``: its samples (a ledger dataset of its own,
    ``short_replay``) are cut at 256 tokens from exactly the tokens ``short`` gave at 64, each once
    per replay epoch; ``short`` itself still finishes its epoch from the tokens it had not given."""
    cache = str(tmp_path / "cache")
    streams = {name: _stream(p) for name, p in zip(("short", "mid", "long"), corpus, strict=True)}
    first = _mix(corpus, cache, 64, 16, 96)
    seen = {}
    _check_samples(first, 0, 96, streams, 64, seen)
    at_64 = _coverage(seen)[("short", 0)]  # what short gave at 64 tokens
    record = first.record(6, 96)
    obj = {"train": {"blend": [{"path": p, "weight": w} for p, w in zip(corpus, (1, 2, 3), strict=True)]
                     + [{"path": corpus[0], "weight": 2, "replay": True}]}}
    blend = parse_blend_config(obj, "replay.yaml").train
    resume = DataResume("ckpt", 6, MixRecord.from_json(record.to_json()), override=True)
    second = continue_training_mix(_sources(256, cache), blend, 96 + 160,
                                   BatchSchedule(4, None, 256), SEED, resume)
    streams["short_replay"] = streams["short"]
    _check_samples(second, 96, 96 + 160, streams, 256, seen)
    replay = _coverage({k: v for k, v in seen.items() if k[0] == "short_replay"})
    assert len(replay) > 2  # several replay epochs, each all of what short gave, once
    for epoch in sorted(e for _, e in replay)[:-1]:
        assert replay[("short_replay", epoch)] == at_64, epoch
    entry = {e.name: e for e in second.record(46, 96 + 160).ledger}
    assert [(s.seq_length, s.drawn) for s in entry["short_replay"].seen] == [
        (64, {e.name: e.drawn for e in record.ledger}["short"])]
    assert entry["short_replay"].drawn > 0
    per_epoch64 = {c.name: c.samples_per_epoch for c in first.dataset.constituents}
    assert _coverage({("short", 0): seen[("short", 0)]})[("short", 0)] == [[0, per_epoch64["short"] * 64]]
    # refused: a replay in a run that starts, and a replay of a dataset never drawn
    with pytest.raises(ConfigError, match="short_replay \\(replay: true\\) needs a resumed run"):
        continue_training_mix(_sources(64, cache), blend, 96, BatchSchedule(16, None, 64), SEED, None)
    other = write_corpus(str(tmp_path / "other"), [100] * 20)
    obj["train"]["blend"].append({"path": other, "weight": 1, "replay": True})
    with pytest.raises(ConfigError, match="other_replay \\(replay: true\\) replays other, of which "
                                          "the run drew nothing before global sample 96"):
        continue_training_mix(_sources(256, cache), parse_blend_config(obj, "r.yaml").train,
                              96 + 160, BatchSchedule(4, None, 256), SEED, resume)
