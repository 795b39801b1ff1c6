"""Megatron-LM's spellings for big blends (issue 43): ``--data-args-path FILE`` (the
``--data-path`` words in a file) and ``--per-split-data-args-path JSON``; ``--data-path`` weights
checked; thousands of prefixes parsed and resolved, the missing ones named in one error."""
import json
import os

import pytest

from helpers.curriculum import write_corpus
from helpers.flags import parse, tiny_run_flags
from megatron.errors import ArgumentError, ConfigError

BASE = tiny_run_flags(data_path=None)


def _bad(extra, *needles):
    with pytest.raises(ArgumentError) as info:
        parse(extra, base=BASE)
    msg = str(info.value)
    assert "\n" not in msg, msg
    for needle in needles:
        assert needle in msg, msg
    return msg


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    d = tmp_path_factory.mktemp("dataargs")
    return [write_corpus(str(d / f"c{k}_text_document"), [20 + k, 30, 25 + 2 * k], seed=k)
            for k in range(3)]


def test_data_args_path_is_data_path(corpora, tmp_path):
    words = ["0.3", corpora[0], "0.5", corpora[1], "0.2", corpora[2]]
    path = tmp_path / "data_args.txt"
    path.write_text(f"{words[0]} {words[1]}\n\t{words[2]}  {words[3]}\n{words[4]}\n{words[5]}\n")
    from megatron.data.builder import data_path_blends

    by_file = parse(["--data-args-path", str(path)], base=BASE)
    by_flag = parse(["--data-path"] + words, base=BASE)
    assert by_file.data_path == by_flag.data_path == words
    assert data_path_blends(by_file.run_config.data) == data_path_blends(by_flag.run_config.data)


def test_data_args_path_errors(corpora, tmp_path):
    path = tmp_path / "data_args.txt"
    path.write_text(corpora[0])
    _bad(["--data-args-path", str(path), "--data-path", corpora[0]], "--data-path", "--data-args-path",
         "mutually exclusive")
    _bad(["--data-args-path", str(path), "--train-data-path", corpora[0]], "--data-args-path",
         "--train-data-path", "mutually exclusive")
    _bad(["--data-args-path", str(tmp_path / "nope.txt")], "--data-args-path", "nope.txt",
         "does not exist")
    (tmp_path / "empty.txt").write_text("  \n")
    _bad(["--data-args-path", str(tmp_path / "empty.txt")], "--data-args-path", "no word")
    (tmp_path / "nan.txt").write_text(f"1 {corpora[0]} nan {corpora[1]}")
    (tmp_path / "minf.txt").write_text(f"-inf {corpora[0]} 1 {corpora[1]}")
    _bad(["--data-args-path", str(tmp_path / "minf.txt")], "weight '-inf'", corpora[0])
    _bad(["--data-args-path", str(tmp_path / "nan.txt")], "--data-args-path", "nan.txt",
         "weight 'nan'", corpora[1], "finite and >= 0")


@pytest.mark.parametrize("weight", ["nan", "inf", "-1"])  # "-inf" reads as a flag; a file below
def test_data_path_weights_finite_and_non_negative(corpora, weight):
    _bad(["--data-path", "1", corpora[0], weight, corpora[1]], "--data-path", f"weight {weight!r}",
         corpora[1], "finite and >= 0")
    _bad(["--train-data-path", weight, corpora[1]], "--train-data-path", f"weight {weight!r}")


def test_data_path_weights_all_zero(corpora):
    _bad(["--data-path", "0", corpora[0], "0.0", corpora[1]], "--data-path", "every weight is zero")


def test_per_split_data_args_path(corpora, tmp_path):
    from megatron.data.builder import data_path_blends

    path = tmp_path / "per_split.json"
    path.write_text(json.dumps({"train": ["0.7", corpora[0], 0.3, corpora[1]],
                                "valid": f"1 {corpora[2]}", "test": None}))
    by_file = parse(["--per-split-data-args-path", str(path)], base=BASE)
    by_flag = parse(["--train-data-path", "0.7", corpora[0], "0.3", corpora[1],
                     "--valid-data-path", "1", corpora[2]], base=BASE)
    assert by_file.train_data_path == by_flag.train_data_path
    assert by_file.valid_data_path == ["1", corpora[2]] and by_file.test_data_path is None
    assert data_path_blends(by_file.run_config.data) == data_path_blends(by_flag.run_config.data)


@pytest.mark.parametrize("content, needles", [
    ({"train": ["x"], "valid": None}, ["missing key 'test'"]),
    ({"train": ["x"], "valid": None, "test": None, "vaild": ["y"]}, ["unknown key 'vaild'"]),
    ({"train": [{"p": 1}], "valid": None, "test": None}, ["train", "list of [WEIGHT] PREFIX words"]),
    ({"train": None, "valid": [], "test": ""}, ["gives no split any data"]),
    (["x"], ["JSON object with keys train, valid, test"]),
])
def test_per_split_data_args_path_errors(tmp_path, content, needles):
    path = tmp_path / "per_split.json"
    path.write_text(json.dumps(content))
    _bad(["--per-split-data-args-path", str(path)], "--per-split-data-args-path", *needles)


def test_per_split_data_args_path_exclusive(corpora, tmp_path):
    path = tmp_path / "per_split.json"
    path.write_text(json.dumps({"train": [corpora[0]], "valid": None, "test": None}))
    _bad(["--per-split-data-args-path", str(path), "--train-data-path", corpora[0]],
         "--train-data-path", "--per-split-data-args-path", "mutually exclusive")
    _bad(["--per-split-data-args-path", str(path), "--data-path", corpora[0]],
         "--data-path", "--per-split-data-args-path", "mutually exclusive")


def test_thousand_prefix_data_path(tmp_path):
    """1,024 ``W PREFIX`` pairs (given as --data-path and as a --data-args-path file): parsed, their
    weights kept, every prefix resolved to a constituent; the missing ones named in one error."""
    from megatron.data.builder import check_data_path_prefixes, data_path_blends
    from megatron.data.curriculum.constituents import resolve_constituents

    prefixes = [write_corpus(str(tmp_path / f"shard_{k:04d}_text_document"), [30, 40, 50], seed=k % 7)
                for k in range(1024)]
    words = [w for k, p in enumerate(prefixes) for w in (str(1 + k % 5), p)]
    (tmp_path / "args.txt").write_text("\n".join(f"{w} {p}" for w, p in zip(words[::2], words[1::2], strict=True)))
    args = parse(["--data-path"] + words, base=BASE)
    by_file = parse(["--data-args-path", str(tmp_path / "args.txt")], base=BASE)
    assert by_file.data_path == args.data_path == words
    check_data_path_prefixes(args.run_config.data)
    blend = data_path_blends(args.run_config.data)["train"]
    assert [e.weight for e in blend.stages[0].entries] == [float(1 + k % 5) for k in range(1024)]
    constituents = resolve_constituents(blend, 16)
    assert [c.path for c in constituents] == prefixes
    assert len({c.name for c in constituents}) == 1024
    for k in range(0, 1024, 3):
        for ext in (".bin", ".idx"):
            os.remove(prefixes[k] + ext)
    with pytest.raises(ConfigError) as info:
        check_data_path_prefixes(by_file.run_config.data)
    msg = str(info.value)
    assert msg.startswith(f"--data-args-path {tmp_path / 'args.txt'}: 342 dataset prefixes"), msg
    assert "shard_0000_text_document" in msg and "shard_0012_text_document" in msg
    assert "shard_0015" not in msg and msg.endswith("... and 337 more") and "\n" not in msg


def test_weighted_split_missing_prefixes_one_error(corpora, tmp_path):
    from megatron.data.builder import check_weighted_split_prefixes
    from megatron.data.weighted_splits import parse_weighted_split_paths

    gone = [str(tmp_path / f"gone{k}_text_document") for k in range(8)]
    train = parse_weighted_split_paths(["TRAIN: " + ", ".join(f"1 0:1 {p}" for p in gone[:4] + corpora)],
                                       "--train-weighted-split-paths", check_files=False)
    valid = parse_weighted_split_paths([f"V: 1 0:1 {p}" for p in gone[4:5]] + [f"W: 1 0:1 {gone[5]}"],
                                       "--valid-weighted-split-paths", check_files=False)
    with pytest.raises(ConfigError) as info:
        check_weighted_split_prefixes({"train": train, "valid": valid, "test": []})
    msg = str(info.value)
    assert "6 dataset prefixes" in msg and "--train-weighted-split-paths" in msg, msg
    assert "group V: dataset file" in msg and "group W" not in msg  # past the first 5
    assert "group TRAIN: dataset file" in msg and msg.endswith("... and 1 more")
    check_weighted_split_prefixes({"train": train[:0], "valid": [], "test": []})
