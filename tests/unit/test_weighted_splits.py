"""megatron/data/weighted_splits.py: BigScience weighted split paths (flags and files)."""

import numpy as np
import pytest
import torch
from megatron.core.datasets.gpt_dataset import GPTDatasetConfig
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

from helpers.flags import parsed
from megatron.config.data_flags import weighted_split_groups_from_args
from megatron.data.weighted_splits import (
    WeightedSplitError,
    build_weighted_split_datasets,
    parse_weighted_split_group,
    parse_weighted_split_paths,
    read_weighted_split_paths_file,
)
from megatron.schedules.units import BatchSchedule
from megatron.tokenizer import ByteLevelTokenizer

SEQ = 8


@pytest.fixture(scope="session", autouse=True)
def gloo_group(tmp_path_factory):
    if not torch.distributed.is_initialized():
        init = tmp_path_factory.mktemp("gloo") / "init"
        torch.distributed.init_process_group("gloo", init_method=f"file://{init}", rank=0,
                                             world_size=1)
    yield


def _make(prefix, ndocs, seed):
    """Document k holds tokens of value k + 1 (so the documents a sample came from are visible)."""
    rng = np.random.default_rng(seed)
    b = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for k in range(ndocs):
        n = int(rng.integers(4, 20))
        b.add_document(np.full(n, k + 1, dtype=np.uint16), [n])
    b.finalize(prefix + ".idx")
    return prefix


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("wsp")
    return {"A": _make(str(d / "A_text_document"), 100, 0), "B": _make(str(d / "B_text_document"), 50, 1)}


def test_parse_bigscience_syntax(data):
    g = parse_weighted_split_group(f"TRAIN: 0.3 0:0.95 {data['A']}, 0.7 0:0.95 {data['B']}")
    assert g.name == "TRAIN"
    assert [(i.weight, i.start, i.end, i.prefix) for i in g.items] == [
        (0.3, 0.0, 0.95, data["A"]), (0.7, 0.0, 0.95, data["B"])]
    groups = parse_weighted_split_paths(
        [f"VALID_A: 1 0.95:1 {data['A']}", f"VALID_B: 1 0.95:1 {data['B']}"], "--valid-weighted-split-paths")
    assert [g.name for g in groups] == ["VALID_A", "VALID_B"]


def test_group_name_is_the_text_before_the_first_colon(data):
    """As BigScience's parser (``v.split(":")[0]``): no space needed after the colon, spaces
    allowed in the name."""
    g = parse_weighted_split_group(f"train:0.3 0:0.95 {data['A']}, 0.7 0:0.95 {data['B']}")
    assert g.name == "train"
    assert [(i.weight, i.start, i.end, i.prefix) for i in g.items] == [
        (0.3, 0.0, 0.95, data["A"]), (0.7, 0.0, 0.95, data["B"])]
    groups = parse_weighted_split_paths([f"VALID A: 1 0.95:1 {data['A']}",
                                         f"  VALID B :1 0.9:1 {data['B']}"],
                                        "--valid-weighted-split-paths")
    assert [g.name for g in groups] == ["VALID A", "VALID B"]
    assert groups[1].items[0].prefix == data["B"] and groups[1].items[0].start == 0.9
    # a forgotten colon still says so, though the range's colon is there
    for text in ("web 1 0:1 data/web", "web 1 0.95:1 data/web, 1 0:1 data/code"):
        with pytest.raises(WeightedSplitError, match=r"missing ':' after the group name: the text "
                                                     r"before the first ':' \('web 1 0(\.95)?'\)"):
            parse_weighted_split_group(text, check_files=False)


def test_unquoted_file_line_with_an_apostrophe(tmp_path):
    prefix = str(tmp_path / "it's_text_document")
    _make(prefix, 20, 0)
    per_line = tmp_path / "lines.txt"
    per_line.write_text(f"VALID_A: 1 0:1 {prefix}\n\"VALID_B: 1 0.5:1 {prefix}\"\n")
    texts = read_weighted_split_paths_file(str(per_line), "--valid-weighted-split-paths-path")
    groups = parse_weighted_split_paths(texts, "--valid-weighted-split-paths-path")
    assert [(g.name, g.items[0].prefix) for g in groups] == [("VALID_A", prefix), ("VALID_B", prefix)]


def test_file_quoted_groups_on_one_line_and_one_per_line(data, tmp_path):
    one_line = tmp_path / "xp3.txt"
    one_line.write_text(f'"VALID_A: 1 0.95:1 {data["A"]}" "VALID_B: 0.5 0.95:1 {data["B"]}, 0.5 0.9:1 {data["A"]}"\n')
    per_line = tmp_path / "lines.txt"
    per_line.write_text(f"# comment\nVALID_A: 1 0.95:1 {data['A']}\n\n\"VALID_B: 0.5 0.95:1 {data['B']}, 0.5 0.9:1 {data['A']}\"\n")
    for path in (one_line, per_line):
        texts = read_weighted_split_paths_file(str(path), "--valid-weighted-split-paths-path")
        groups = parse_weighted_split_paths(texts, "--valid-weighted-split-paths-path")
        assert [g.name for g in groups] == ["VALID_A", "VALID_B"]
        assert [i.prefix for i in groups[1].items] == [data["B"], data["A"]]
    args = parsed(["--train-weighted-split-paths", f"TRAIN: 1 0:0.9 {data['A']}",
                   "--valid-weighted-split-paths-path", str(one_line),
                   "--test-weighted-split-paths", f"TEST: 1 0.9:1 {data['B']}"])
    out = weighted_split_groups_from_args(args)
    assert [g.name for g in out["train"]] == ["TRAIN"]
    assert [g.name for g in out["valid"]] == ["VALID_A", "VALID_B"]
    assert [g.name for g in out["test"]] == ["TEST"]
    args.valid_weighted_split_paths = [f"V: 1 0:1 {data['A']}"]
    with pytest.raises(WeightedSplitError, match="mutually exclusive"):
        weighted_split_groups_from_args(args)


@pytest.mark.parametrize("text,needle", [
    ("TRAIN 1 0:1 {A}", "missing ':'"),
    ("TRAIN: 1 0:1.5 {A}", "outside [0, 1]"),
    ("TRAIN: 1 0.5:0.5 {A}", "empty range"),
    ("TRAIN: 1 0.7:0.2 {A}", "empty range"),
    ("TRAIN: 1 0-1 {A}", "bad range"),
    ("TRAIN: x 0:1 {A}", "bad weight 'x'"),
    ("TRAIN: -1 0:1 {A}", "bad weight '-1'"),
    ("TRAIN: 1 0:1", "WEIGHT START:END PREFIX"),
    ("TRAIN: 1 0:1 {A},", "empty item"),
    ("TRAIN: 1 0:1 {A}_missing", "does not exist"),
    ("TRAIN: 1 0:1 {A}, 2 0:1 {A}", "listed twice"),
])
def test_bad_groups_name_flag_and_text(data, text, needle):
    text = text.format(A=data["A"])
    with pytest.raises(WeightedSplitError) as info:
        parse_weighted_split_paths([text], "--train-weighted-split-paths")
    msg = str(info.value)
    assert "--train-weighted-split-paths" in msg and needle in msg and repr(text) in msg, msg


def test_group_name_twice_and_missing_file(data, tmp_path):
    with pytest.raises(WeightedSplitError, match="'V' is used twice"):
        parse_weighted_split_paths([f"V: 1 0:1 {data['A']}", f"V: 1 0:1 {data['B']}"],
                                   "--valid-weighted-split-paths")
    with pytest.raises(WeightedSplitError, match="--test-weighted-split-paths-path: file .* does not exist"):
        read_weighted_split_paths_file(str(tmp_path / "nope.txt"), "--test-weighted-split-paths-path")
    bad = tmp_path / "bad.txt"
    bad.write_text('"V: 1 0:1 A')
    with pytest.raises(WeightedSplitError, match="bad.txt:1"):
        read_weighted_split_paths_file(str(bad), "--valid-weighted-split-paths-path")


def test_build_one_dataset_per_group(data, tmp_path):
    gc = GPTDatasetConfig(random_seed=3, sequence_length=SEQ, tokenizer=ByteLevelTokenizer(),
                          reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
                          path_to_cache=str(tmp_path / "cache"), blend=None, blend_per_split=None,
                          split="1,0,0")
    groups = parse_weighted_split_paths(
        [f"HEAD: 0.3 0:0.9 {data['A']}, 0.7 0:0.9 {data['B']}", f"TAIL: 1 0.9:1 {data['A']}"],
        "--valid-weighted-split-paths")
    built = build_weighted_split_datasets(groups, 100, gc, BatchSchedule(4, None, SEQ), "valid")
    (n1, head), (n2, tail) = built
    assert (n1, n2) == ("HEAD", "TAIL") and len(head) == len(tail) == 100
    assert head.counts.tolist() == [30, 70]
    # TAIL only sees documents 90..99 of A (token values 91..100), HEAD only 0..89 of A
    tail_tokens = np.concatenate([tail[i]["tokens"].numpy() for i in range(100)])
    assert tail_tokens.min() >= 91
    head_a = np.concatenate([head[i]["tokens"].numpy() for i in range(100)
                             if int(head[i]["dataset_id"]) == 0])
    assert head_a.max() <= 90
