"""Bad inputs and the errors they get: one test (or one parametrized case) per row of
docs/robustness.md.

Every error here is a :class:`megatron.errors.ConfigError` (entry points print ``error: MESSAGE``
and exit 1; flag errors from ``parse_args`` print argparse's ``PROG: error: MESSAGE`` and exit 2)
whose message names the flag, the file, the key and the value. Most cases call the validating
function directly; two run ``pretrain_gpt.py`` to show the user-facing form.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

from helpers.flags import tiny_run_flags
from helpers.paths import ROOT
from megatron.config.arguments import validate_args
from megatron.config.data_flags import weighted_split_groups_from_args
from megatron.config.parser import get_parser, parse_args
from megatron.data.blend_config import load_blend_config, parse_blend_config
from megatron.data.weighted_splits import (
    parse_weighted_split_group,
    parse_weighted_split_paths,
)
from megatron.errors import ArgumentError, ConfigError


def _make(prefix, ndocs=20, length=12):
    b = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for k in range(ndocs):
        b.add_document(np.full(length, k % 250 + 1, dtype=np.uint16), [length])
    b.finalize(prefix + ".idx")
    return prefix


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad_inputs_data")
    out = {name: _make(str(d / f"{name}_text_document")) for name in ("web", "code")}
    # damaged copies of "web"
    raw_idx = open(out["web"] + ".idx", "rb").read()
    raw_bin = open(out["web"] + ".bin", "rb").read()
    for name, idx, bin_ in (("trunc_idx", raw_idx[:60], raw_bin),
                            ("header_only", raw_idx[:20], raw_bin),
                            ("garbage_idx", b"this is not an index file\n", raw_bin),
                            ("trunc_bin", raw_idx, raw_bin[:100])):
        prefix = str(d / f"{name}_text_document")
        open(prefix + ".idx", "wb").write(idx)
        open(prefix + ".bin", "wb").write(bin_)
        out[name] = prefix
    only_bin = str(d / "only_bin_text_document")
    open(only_bin + ".bin", "wb").write(raw_bin)
    out["only_bin"] = only_bin
    out["dir"] = str(d)
    return out


def _fragments(message, fragments):
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def _raises(exc_type, fn, *fragments):
    with pytest.raises(exc_type) as info:
        fn()
    assert isinstance(info.value, ConfigError), type(info.value)
    _fragments(str(info.value), fragments)
    return str(info.value)


# ================================================================================== flags
BASE = tiny_run_flags(data_path=None)
DATA = ["--data-path", "some/prefix"]


def _validate(argv, world_size=1):
    return validate_args(get_parser().parse_args(argv), world_size)


def _drop(argv, flag, nvalues=1):
    i = argv.index(flag)
    return argv[:i] + argv[i + 1 + nvalues:]


FLAG_CASES = {
    "missing-required": (_drop(BASE, "--num-layers") + DATA, 1,
                         ["missing required flag(s): --num-layers"]),
    "no-data": (BASE, 1, ["no training data", "--data-path", "--data-blend-config"]),
    "two-data-sources": (BASE + DATA + ["--data-blend-config", "b.yaml"], 1,
                         ["--data-path and --data-blend-config are mutually exclusive"]),
    "no-train-length": (_drop(BASE, "--train-iters") + DATA, 1,
                        ["one of --train-iters or --train-samples is required"]),
    "iters-and-samples": (BASE + DATA + ["--train-samples", "100"], 1,
                          ["--train-iters 10 and --train-samples 100 are mutually exclusive"]),
    "negative-train-iters": (_drop(BASE, "--train-iters") + DATA + ["--train-iters", "-5"], 1,
                             ["--train-iters -5 must be non-negative"]),
    "no-lr": (_drop(BASE, "--lr") + DATA, 1, ["--lr is required"]),
    "min-lr-above-lr": (BASE + DATA + ["--min-lr", "1"], 1, ["--min-lr 1.0 is above --lr 0.001"]),
    "fp16-and-bf16": (BASE + DATA + ["--fp16", "--bf16"], 1, ["--fp16 and --bf16"]),
    "batch-not-divisible": (BASE + DATA + ["--global-batch-size", "6"], 2,
                            ["--global-batch-size 6", "--micro-batch-size 2", "data-parallel size 2"]),
    "world-not-divisible-by-tp": (BASE + DATA + ["--tensor-model-parallel-size", "2"], 3,
                                  ["world size 3", "--tensor-model-parallel-size 2"]),
    "rampup-not-integers": (BASE + DATA + ["--rampup-batch-size", "a", "b", "c"], 1,
                            ["--rampup-batch-size a b c", "three integers"]),
    "rampup-bad-increment": (BASE + DATA + ["--rampup-batch-size", "2", "4", "100",
                                            "--global-batch-size", "8"], 1,
                             ["--rampup-batch-size 2 4 100", "--global-batch-size 8", "multiple of INCR"]),
    "hidden-not-divisible-by-heads": (BASE + DATA + ["--hidden-size", "66"], 1,
                                      ["--hidden-size 66", "--num-attention-heads 4"]),
    "heads-not-divisible-by-query-groups": (BASE + DATA + ["--num-query-groups", "3"], 1,
                                            ["--num-attention-heads 4", "--num-query-groups 3"]),
    "seq-longer-than-positions": (BASE + DATA + ["--max-position-embeddings", "16"], 1,
                                  ["--seq-length 32", "--max-position-embeddings 16"]),
    "dropout-out-of-range": (BASE + DATA + ["--hidden-dropout", "1.5"], 1,
                             ["--hidden-dropout 1.5 must be in [0, 1)"]),
    "eval-interval-zero": (BASE + DATA + ["--eval-interval", "0"], 1,
                           ["--eval-interval 0 must be positive"]),
    "eval-iters-negative": (BASE + DATA + ["--eval-iters", "-1"], 1,
                            ["--eval-iters -1 must be non-negative"]),
    "samples-flag-with-iters": (BASE + DATA + ["--lr-decay-samples", "100"], 1,
                                ["--lr-decay-samples 100 given with --train-iters 10"]),
    "iters-flag-with-samples": (_drop(BASE, "--train-iters") + DATA
                                + ["--train-samples", "100", "--lr-warmup-iters", "2"], 1,
                                ["--lr-warmup-iters 2 given with --train-samples 100"]),
    "warmup-fraction-and-iters": (BASE + DATA + ["--lr-warmup-fraction", "0.1",
                                                 "--lr-warmup-iters", "2"], 1,
                                  ["--lr-warmup-fraction 0.1 and --lr-warmup-iters 2 both set the "
                                   "LR warmup length"]),
    "warmup-tokens-and-samples": (_drop(BASE, "--train-iters") + DATA
                                  + ["--train-samples", "100", "--lr-warmup-tokens", "64",
                                     "--lr-warmup-samples", "2"], 1,
                                  ["--lr-warmup-samples 2 and --lr-warmup-tokens 64 both set"]),
    "lr-flag-not-finite": (BASE + DATA + ["--min-lr", "nan"], 1,
                           ["--min-lr nan is not a finite number"]),
    "power-scheduler-b-not-negative": (BASE + DATA + ["--lr-decay-style", "power",
                                                      "--power-scheduler-b", "0.5"], 1,
                                       ["--power-scheduler-b 0.5 must be negative"]),
    "power-decay-end-without-decay-phase": (BASE + DATA + ["--lr-decay-style", "power",
                                                           "--lr-decay-iters", "8"], 1,
                                            ["--lr-decay-iters 8 with --lr-decay-style power has "
                                             "no effect", "--power-scheduler-decay-iters"]),
    "warmup-fraction-out-of-range": (BASE + DATA + ["--lr-warmup-fraction", "1.5"], 1,
                                     ["--lr-warmup-fraction 1.5 must be in [0, 1)"]),
    "warmup-not-shorter-than-decay": (BASE + DATA + ["--lr-warmup-iters", "10"], 1,
                                      ["the warmup (--lr-warmup-iters 10: 20 samples) must be "
                                       "shorter than the decay span (--train-iters 10: 20 samples)"]),
    "wsd-without-decay-length": (BASE + DATA + ["--lr-decay-style", "WSD"], 1,
                                 ["--lr-decay-style WSD needs --lr-wsd-decay-iters"]),
    "warmup-init-above-lr": (BASE + DATA + ["--lr-warmup-init", "1"], 1,
                             ["--lr-warmup-init 1.0 must be in [0, --lr 0.001]"]),
    "constant-wd-with-different-ends": (BASE + DATA + ["--start-weight-decay", "0",
                                                       "--end-weight-decay", "0.1"], 1,
                                        ["--weight-decay-incr-style constant",
                                         "--start-weight-decay 0.0", "--end-weight-decay 0.1"]),
    "power-scheduler-a-not-positive": (BASE + DATA + ["--lr-decay-style", "power",
                                                      "--power-scheduler-a", "0"], 1,
                                       ["--power-scheduler-a 0.0 must be positive"]),
    "override-and-use-checkpoint-scheduler": (
        BASE + DATA + ["--override-opt_param-scheduler", "--use-checkpoint-opt_param-scheduler"], 1,
        ["--override-opt_param-scheduler and --use-checkpoint-opt_param-scheduler"]),
    "gpt2-bpe-without-files": (BASE + DATA + ["--tokenizer-type", "GPT2BPETokenizer"], 1,
                               ["--tokenizer-type GPT2BPETokenizer needs --vocab-file and "
                                "--merge-file"]),
    "hf-without-model": (BASE + DATA + ["--tokenizer-type", "HuggingFaceTokenizer"], 1,
                         ["--tokenizer-type HuggingFaceTokenizer needs --tokenizer-model"]),
    "num-workers-negative": (BASE + DATA + ["--num-workers", "-1"], 1,
                             ["--num-workers -1 must be non-negative"]),
    "weighted-split-flag-and-file": (BASE + ["--train-weighted-split-paths", "A: 1 0:1 a",
                                             "--train-weighted-split-paths-path", "f.txt"], 1,
                                     ["--train-weighted-split-paths and "
                                      "--train-weighted-split-paths-path are mutually exclusive"]),
}


@pytest.mark.parametrize("case", list(FLAG_CASES))
def test_flag(case):
    argv, world_size, fragments = FLAG_CASES[case]
    _raises(ConfigError, lambda: _validate(argv, world_size), *fragments)


@pytest.mark.parametrize("argv, fragments", [
    (BASE + DATA + ["--num-layers", "two"], ["argument --num-layers: invalid int value: 'two'"]),
    (BASE + DATA + ["--lr-decay-style", "cosinus"],
     ["argument --lr-decay-style: invalid choice: 'cosinus'"]),
    (BASE + DATA + ["--global-batch-size", "6"], ["error: --global-batch-size 6"]),
], ids=["not-an-int", "not-a-choice", "bad-combination"])
def test_flag_parse_args_exits_2(argv, fragments, capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(argv, world_size=2)
    assert info.value.code == 2
    _fragments(capsys.readouterr().err, fragments)


def test_flag_deepspeed_config(tmp_path):
    missing = str(tmp_path / "nope.json")
    _raises(ArgumentError, lambda: _validate(BASE + DATA + ["--deepspeed_config", missing]),
            f"--deepspeed_config {missing}: no such file")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    _raises(ArgumentError, lambda: _validate(BASE + DATA + ["--deepspeed_config", str(bad)]),
            f"--deepspeed_config {bad}: not valid JSON")
    disagree = tmp_path / "ds.json"
    disagree.write_text(json.dumps({"train_batch_size": 16}))
    _raises(ArgumentError, lambda: _validate(BASE + DATA + ["--global-batch-size", "2",
                                                            "--deepspeed_config", str(disagree)]),
            "train_batch_size=16 disagrees with the flags", "--micro-batch-size 2",
            "--global-batch-size 2")


# ============================================================================= blend files
def _entry(data, name="web", weight=1, **kw):
    return dict(path=data[name], weight=weight, **kw)


BLEND_CASES = {
    # id: (config or callable(data) -> config, fragments (may use {web}/{code}/... placeholders))
    "unknown-top-level-key": (lambda d: {"trian": {"blend": [_entry(d)]}},
                              ["unknown key 'trian'", "allowed keys: train, valid, test"]),
    "unknown-entry-key": (lambda d: {"train": {"blend": [{"path": d["web"], "wieght": 1}]}},
                          ["train.blend[0]: unknown key 'wieght' (value 1)"]),
    "missing-weight": (lambda d: {"train": {"blend": [{"path": d["web"]}]}},
                       ["train.blend[0]: missing key 'weight'"]),
    "missing-path": (lambda d: {"train": {"blend": [{"weight": 1}]}},
                     ["train.blend[0]: missing key 'path'"]),
    "no-blend-form": (lambda d: {"train": {"mix": [_entry(d)]}},
                      ["train: give exactly one of blend, epochized_blend, sequential (got {'mix'"]),
    "two-blend-forms": (lambda d: {"train": {"blend": [_entry(d)], "epochized_blend": [_entry(d)]}},
                        ["train: give exactly one of blend, epochized_blend, sequential"]),
    "negative-weight": (lambda d: {"train": {"blend": [_entry(d, weight=-1)]}},
                        ["train.blend[0].weight: weight -1 is negative"]),
    "weight-not-a-number": (lambda d: {"train": {"blend": [_entry(d, weight="lots")]}},
                            ["train.blend[0].weight: weight 'lots' must be a number"]),
    "weight-not-finite": (lambda d: {"train": {"blend": [_entry(d, weight=".nan")]}},
                          ["train.blend[0].weight: weight nan is not finite"]),
    "unsorted-points": (lambda d: {"train": {"blend": [_entry(d, weight={
        "type": "linear", "points": [[0, 1], [100, 2], [50, 3]]})]}},
                        ["train.blend[0].weight.points: points are not sorted", "50 comes after 100"]),
    "negative-point-weight": (lambda d: {"train": {"blend": [_entry(d, weight={
        "type": "step", "points": {0: 1, 10: -2}})]}},
                              ["train.blend[0].weight.points[10]: weight -2 is negative"]),
    "schedule-without-type": (lambda d: {"train": {"blend": [_entry(d, weight={"points": {0: 1}})]}},
                              ["train.blend[0].weight: weight schedule", "has no 'type'"]),
    "unknown-schedule-type": (lambda d: {"train": {"blend": [_entry(d, weight={"type": "wiggly"})]}},
                              ["train.blend[0].weight.type: unknown schedule type 'wiggly'",
                               "known types"]),
    "unknown-schedule-key": (lambda d: {"train": {"blend": [_entry(d, weight={
        "type": "linear", "from": 1, "too": 0})]}},
                             ["train.blend[0].weight: unknown key 'too' (value 0) for schedule "
                              "type 'linear'"]),
    "unknown-unit": (lambda d: {"train": {"blend": [_entry(d, weight={
        "type": "step", "unit": "epochs", "points": {0: 1}})]}},
                     ["train.blend[0].weight.unit: unknown unit 'epochs'"]),
    "all-weights-zero": (lambda d: {"train": {"blend": [_entry(d, weight=0),
                                                        _entry(d, "code", weight=0)]}},
                         ["train.blend: all weights are zero: a stage with nothing to draw"]),
    "empty-blend": (lambda d: {"train": {"blend": []}},
                    ["train.blend: blend is empty: a stage with nothing to draw"]),
    "missing-bin-and-idx": (lambda d: {"train": {"blend": [{"path": d["dir"] + "/nothing",
                                                           "weight": 1}]}},
                            ["train.blend[0].path: dataset file", "nothing.bin' does not exist"]),
    "missing-idx": (lambda d: {"train": {"blend": [_entry(d, "only_bin")]}},
                    ["train.blend[0].path: dataset file", "only_bin_text_document.idx' does not "
                                                          "exist"]),
    "truncated-idx": (lambda d: {"train": {"blend": [_entry(d, "trunc_idx")]}},
                      ["train.blend[0].path: dataset index", "trunc_idx_text_document.idx' is "
                                                             "truncated: 60 bytes"]),
    "split-outside-0-1": (lambda d: {"train": {"blend": [_entry(d, split="0.5:1.5")]}},
                          ["train.blend[0].split: split '0.5:1.5' lies outside [0, 1]"]),
    "split-empty": (lambda d: {"train": {"blend": [_entry(d, split="0.7:0.2")]}},
                    ["train.blend[0].split: split '0.7:0.2' is empty (START must be < END)"]),
    "split-malformed": (lambda d: {"train": {"blend": [_entry(d, split="first half")]}},
                        ["train.blend[0].split: split 'first half' is not of the form"]),
    "duplicate-dataset": (lambda d: {"train": {"blend": [_entry(d), _entry(d, weight=2)]}},
                          ["train.blend[1].path: dataset", "is listed twice in this blend",
                           "also at", "train.blend[0]"]),
    "until-not-after-previous": (lambda d: {"train": {"sequential": [
        {"blend": [_entry(d)], "until": {"samples": 100}},
        {"blend": [_entry(d, "code")], "until": {"samples": 50}},
        {"blend": [_entry(d)]}]}},
                                 ["train.sequential[1].until: until samples=50 is not after the "
                                  "previous stage's samples=100: a stage with nothing to draw"]),
    "blend-stage-without-until": (lambda d: {"train": {"sequential": [
        {"blend": [_entry(d)]}, {"blend": [_entry(d, "code")]}]}},
                                  ["train.sequential[0]: a blend stage other than the last needs "
                                   "'until"]),
    "until-on-epochized-stage": (lambda d: {"train": {"sequential": [
        {"epochized_blend": [{"path": d["web"], "repetitions": 1}], "until": {"samples": 3}}]}},
                                 ["train.sequential[0].until: an epochized_blend stage ends when "
                                  "its repetitions are done"]),
    "until-bad-unit": (lambda d: {"train": {"sequential": [
        {"blend": [_entry(d)], "until": {"epochs": 3}}, {"blend": [_entry(d)]}]}},
                       ["train.sequential[0].until: unknown key 'epochs'"]),
    "repetitions-zero": (lambda d: {"train": {"epochized_blend": [{"path": d["web"],
                                                                   "repetitions": 0}]}},
                         ["train.epochized_blend[0].repetitions: repetitions 0 must be > 0"]),
    "duplicate-group-name": (lambda d: {"valid": [{"name": "a", "path": d["web"]},
                                                  {"name": "a", "path": d["code"]}]},
                             ["valid[1].name: group name 'a' is used twice (also at",
                              "valid[0])"]),
    "group-without-name": (lambda d: {"test": [{"path": d["web"]}]},
                           ["test[0]: a test group needs a non-empty 'name' (got None)"]),
}


@pytest.mark.parametrize("case", list(BLEND_CASES))
def test_blend_file(case, data, tmp_path):
    make, fragments = BLEND_CASES[case]
    path = str(tmp_path / "blend.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(make(data), f, sort_keys=False)
    if case == "weight-not-finite":  # yaml.safe_dump would quote the string
        with open(path, "w") as f:
            f.write(f"train:\n  blend:\n  - {{path: {data['web']}, weight: .nan}}\n")
    msg = _raises(ConfigError, lambda: load_blend_config(path), *fragments)
    assert msg.startswith(path + ":") or path in msg


def test_blend_file_unreadable(tmp_path):
    missing = str(tmp_path / "missing.yaml")
    _raises(ConfigError, lambda: load_blend_config(missing),
            f"--data-blend-config: file {missing!r} does not exist")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  blend: [{path: a, weight: 1}\n")
    _raises(ConfigError, lambda: load_blend_config(str(bad)), f"{bad}: cannot parse:")
    bad_json = tmp_path / "bad.json"
    bad_json.write_text('{"train": ')
    _raises(ConfigError, lambda: load_blend_config(str(bad_json)), f"{bad_json}: cannot parse:")
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    _raises(ConfigError, lambda: load_blend_config(str(empty)), f"{empty}: the file is empty")
    not_mapping = tmp_path / "list.yaml"
    not_mapping.write_text("- train\n")
    _raises(ConfigError, lambda: load_blend_config(str(not_mapping)),
            f"{not_mapping}: expected a mapping, got list")


def test_blend_file_through_validate_args(data, tmp_path):
    path = tmp_path / "b.yaml"
    path.write_text(f"train:\n  blend:\n  - {{path: {data['web']}, weight: -3}}\n")
    _raises(ConfigError, lambda: _validate(BASE + ["--data-blend-config", str(path)]),
            f"{path}: train.blend[0].weight: weight -3 is negative")


def _curriculum_index(blend, num_samples, global_batch_size=4):
    from helpers.curriculum import fake_index
    return fake_index(blend, num_samples, global_batch_size)


def test_blend_file_all_weights_zero_at_some_point():
    _raises(ConfigError, lambda: _curriculum_index(
        {"blend": [{"path": "a", "weight": {"type": "step", "points": {0: 1, 10: 0}}},
                   {"path": "b", "weight": {"type": "linear", "points": {0: 1, 10: 0}}}]}, 100),
        "t.yaml: train.blend: all weights are zero at sample 40 (iteration 10) of a run of 100 "
        "samples: nothing to draw there")


def test_blend_file_stages_too_short_for_the_run():
    _raises(ConfigError, lambda: _curriculum_index(
        {"epochized_blend": [{"path": "a", "repetitions": 1e-5}]}, 100),
        "t.yaml: train", "the stages provide 10 samples but the run needs 100")


def test_blend_file_split_selects_no_document(data):
    from megatron.data.curriculum.constituents import resolve_constituents

    cfg = parse_blend_config({"train": {"blend": [_entry(data, split="0:0.01")]}}, "b.yaml")
    _raises(ConfigError, lambda: resolve_constituents(cfg.train, 16),
            "b.yaml: train.blend[0].split: range 0:0.01", "(20 documents) selects no document")


# ======================================================================== weighted splits
WSP_FLAG = "--valid-weighted-split-paths"
WSP_CASES = {
    "missing-colon": ("web 1 0:1 data/web", ["missing ':' after the group name"]),
    "empty-name": (": 1 0:1 data/web", ["empty group name"]),
    "no-dataset": ("web:", ["group 'web' lists no dataset"]),
    "stray-comma": ("web: 1 0:1 data/web,", ["empty item in group 'web' (stray comma?)"]),
    "item-not-three-fields": ("web: 1 data/web", ["item '1 data/web' must be 'WEIGHT START:END "
                                                  "PREFIX'"]),
    "bad-weight": ("web: heavy 0:1 data/web", ["bad weight 'heavy' in item 'heavy 0:1 data/web'"]),
    "zero-weight": ("web: 0 0:1 data/web", ["bad weight '0'", "must be positive and finite"]),
    "bad-range": ("web: 1 0-1 data/web", ["bad range '0-1'", "expected START:END"]),
    "range-bound-not-a-number": ("web: 1 a:1 data/web", ["range bound 'a' is not a number"]),
    "range-outside-0-1": ("web: 1 0:1.5 data/web", ["range bound '1.5' lies outside [0, 1]"]),
    "range-empty": ("web: 1 0.5:0.5 data/web", ["empty range '0.5:0.5'", "START must be < END"]),
    "item-twice": ("web: 1 0:1 data/web, 2 0:1 data/web",
                   ["data/web 0:1 is listed twice in group 'web'"]),
}


@pytest.mark.parametrize("case", list(WSP_CASES))
def test_weighted_split_string(case):
    text, fragments = WSP_CASES[case]
    msg = _raises(ConfigError, lambda: parse_weighted_split_group(text, WSP_FLAG, check_files=False),
                  *fragments)
    assert msg.startswith(WSP_FLAG + ":") and repr(text) in msg


def test_weighted_split_duplicate_group_name():
    _raises(ConfigError, lambda: parse_weighted_split_paths(["V: 1 0:1 a", "V: 1 0:1 b"], WSP_FLAG,
                                                            check_files=False),
            f"{WSP_FLAG}: group name 'V' is used twice ('V: 1 0:1 a' and 'V: 1 0:1 b')")


def test_weighted_split_missing_dataset_file(data):
    text = f"web: 1 0:1 {data['dir']}/nothing"
    _raises(ConfigError, lambda: parse_weighted_split_group(text, WSP_FLAG),
            f"{WSP_FLAG}: dataset file '{data['dir']}/nothing.bin' does not exist")


def _wsp_args(**kw):
    """The parsed (not yet validated) flags of these weighted split paths (dest: value)."""
    from helpers.flags import parsed

    return parsed([arg for dest, value in kw.items() for arg in ("--" + dest.replace("_", "-"), value)])


def test_weighted_split_file_variant(tmp_path):
    flag = "--train-weighted-split-paths-path"
    missing = str(tmp_path / "missing.txt")
    _raises(ConfigError, lambda: weighted_split_groups_from_args(
        _wsp_args(train_weighted_split_paths_path=missing), check_files=False),
        f"{flag}: file {missing!r} does not exist")
    empty = tmp_path / "empty.txt"
    empty.write_text("# only a comment\n\n")
    _raises(ConfigError, lambda: weighted_split_groups_from_args(
        _wsp_args(train_weighted_split_paths_path=str(empty)), check_files=False),
        f"{flag}: file {str(empty)!r} holds no group")
    quote = tmp_path / "quote.txt"
    quote.write_text('"A: 1 0:1 a" "B: 1 0:1 b\n')
    _raises(ConfigError, lambda: weighted_split_groups_from_args(
        _wsp_args(train_weighted_split_paths_path=str(quote)), check_files=False),
        f"{flag}: {quote}:1: No closing quotation")
    bad_group = tmp_path / "bad.txt"
    bad_group.write_text("A: 1 0:1 a\nB 1 0:1 b\n")
    _raises(ConfigError, lambda: weighted_split_groups_from_args(
        _wsp_args(train_weighted_split_paths_path=str(bad_group)), check_files=False),
        f"{flag}: missing ':' after the group name", "'B 1 0:1 b'")


def test_weighted_split_two_training_groups():
    from helpers.flags import parse as parse_flags
    from helpers.flags import tiny_run_flags
    from megatron.data.builder import build_pretraining_data
    from megatron.data.weighted_splits import parse_weighted_split_paths as parse

    args = parse_flags(["--train-weighted-split-paths", "A: 1 0:1 a", "B: 1 0:1 b"],
                       base=tiny_run_flags(data_path=None))
    assert [g.name for g in args.weighted_split_groups["train"]] == \
        [g.name for g in parse(["A: 1 0:1 a", "B: 1 0:1 b"], "--train-weighted-split-paths",
                               check_files=False)]
    _raises(ConfigError, lambda: build_pretraining_data(args.run_config.data, None),
            "--train-weighted-split-paths: give one training group (got 2: A, B)")


# ============================================================================== data files
def test_data_path_missing_prefix(data):
    from megatron.data.builder import check_prefixes_exist

    nothing = data["dir"] + "/nothing"
    _raises(ConfigError, lambda: check_prefixes_exist("--data-path", ["0.5", nothing,
                                                                      "0.5", data["web"]]),
            f"--data-path: dataset file '{nothing}.bin' does not exist, nor '{nothing}.idx' (the "
            f"prefix {nothing!r} needs {nothing}.bin and {nothing}.idx, from tools/preprocess_data.py)")
    _raises(ConfigError, lambda: check_prefixes_exist("--train-data-path", [data["only_bin"]]),
            f"--train-data-path: dataset file '{data['only_bin']}.idx' does not exist (the prefix")


@pytest.mark.parametrize("damage, fragments", [
    ("trunc_idx", ["trunc_idx_text_document.idx' is truncated: 60 bytes", "(20 sequences, 21 documents) needs 442",
                   "rebuild it with tools/preprocess_data.py"]),
    ("header_only", ["header_only_text_document.idx' is truncated or not a Megatron .idx file "
                     "(20 bytes, no valid header)"]),
    ("garbage_idx", ["garbage_idx_text_document.idx' is truncated or not a Megatron .idx file"]),
    ("trunc_bin", ["trunc_bin_text_document.bin' is truncated: 100 bytes", "indexes 480"]),
], ids=["truncated-idx", "idx-shorter-than-header", "idx-not-an-index", "truncated-bin"])
def test_data_path_corrupt_file(damage, fragments, data):
    from megatron.data.builder import check_prefixes_exist

    _raises(ConfigError, lambda: check_prefixes_exist("--data-path", [data[damage]]),
            "--data-path: ", *fragments)


def _mtf(tmp_path, name, n_inputs, n_targets):
    for key, n in (("inputs", n_inputs), ("targets", n_targets)):
        _make(str(tmp_path / f"{name}_{key}_document"), ndocs=n, length=4)
    return str(tmp_path / name)


def test_mtf_inputs_targets_count_mismatch(tmp_path):
    from megatron.data.mtf_dataset import MTFDocumentPair

    prefix = _mtf(tmp_path, "t0", 5, 3)
    _raises(ConfigError, lambda: MTFDocumentPair(prefix),
            f"MTF dataset {prefix!r}: {prefix}_inputs_document.idx holds 5 documents but "
            f"{prefix}_targets_document.idx holds 3")


def test_mtf_missing_and_truncated_files(tmp_path):
    from megatron.data.mtf_dataset import MTFDocumentPair

    prefix = _mtf(tmp_path, "t0", 4, 4)
    os.remove(prefix + "_targets_document.bin")
    msg = _raises(FileNotFoundError, lambda: MTFDocumentPair(prefix),
                  f"{prefix}_targets_document.bin does not exist")
    assert "--json-keys inputs targets" in msg
    prefix = _mtf(tmp_path, "t1", 4, 4)
    path = prefix + "_inputs_document.idx"
    raw = open(path, "rb").read()
    open(path, "wb").write(raw[:-10])
    _raises(ConfigError, lambda: MTFDocumentPair(prefix),
            f"MTF dataset {prefix!r}: dataset index {path!r} is truncated")


PRE_CASES = {
    "missing-input": (None, {}, ["--input", "no such file"]),
    "bad-json-line": ('{"text": "a"}\n{"text": \n', {}, ["in.jsonl line 2: not valid JSON"]),
    "not-an-object": ('["text"]\n', {}, ["in.jsonl line 1: expected a JSON object, got list"]),
    "missing-json-key": ('{"text": "a"}\n{"body": "b"}\n', {},
                         ["in.jsonl line 2: missing json key 'text' (keys present: ['body'])"]),
    "value-not-a-string": ('{"text": 3}\n', {}, ["in.jsonl line 1: json key 'text' holds int, "
                                                 "expected a string"]),
    "not-utf8": (b'{"text": "a"}\n{"text": "\xff"}\n', {}, ["in.jsonl' line 2: not UTF-8 text"]),
    "duplicate-json-keys": ('{"text": "a"}\n', {"json_keys": ["text", "text"]},
                            ["--json-keys has duplicates: ['text', 'text']"]),
    "no-json-keys": ('{"text": "a"}\n', {"json_keys": []}, ["--json-keys needs at least one key"]),
}


@pytest.mark.parametrize("case", list(PRE_CASES))
def test_preprocess_input(case, tmp_path):
    from megatron.data.preprocess import preprocess_jsonl

    content, kw, fragments = PRE_CASES[case]
    path = tmp_path / "in.jsonl"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(ValueError) as info:
        preprocess_jsonl(str(path), str(tmp_path / "out"), log_interval=0, **kw)
    _fragments(str(info.value), fragments)
    assert not [p for p in os.listdir(tmp_path) if p.startswith("out")]  # nothing half-written


# ========================================================================= tokenizer files
def _choice(**flags):
    """The TokenizerConfig of these tokenizer flag values (megatron/tokenizer/types.py)."""
    from megatron.tokenizer.types import tokenizer_config

    return tokenizer_config(**flags)


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    """A hand-written GPT-2 style vocab/merges pair, with and without <|endoftext|>, and the
    tokenizer.json of each."""
    from tokenizers import Tokenizer, models

    d = tmp_path_factory.mktemp("bad_inputs_bpe")
    out = {}
    for name, vocab in (("ok", {"a": 0, "b": 1, "ab": 2, "<|endoftext|>": 3}),
                        ("noeod", {"a": 0, "b": 1, "ab": 2})):
        sub = d / name
        sub.mkdir()
        (sub / "vocab.json").write_text(json.dumps(vocab))
        (sub / "merges.txt").write_text("#version: 0.2\na b\n")
        tok = Tokenizer(models.BPE.from_file(str(sub / "vocab.json"), str(sub / "merges.txt")))
        tok.save(str(sub / "tokenizer.json"))
        out[name] = sub
    return out


def test_tokenizer_missing_files(bpe, tmp_path):
    from megatron.tokenizer import build_tokenizer

    ok = bpe["ok"]
    _raises(ConfigError, lambda: build_tokenizer(_choice(tokenizer_type="GPT2BPETokenizer")),
            "--tokenizer-type GPT2BPETokenizer needs --vocab-file and --merge-file")
    missing = str(tmp_path / "vocab.json")
    _raises(ConfigError, lambda: build_tokenizer(_choice(tokenizer_type="GPT2BPETokenizer",
                                                     vocab_file=missing,
                                                     merge_file=str(ok / "merges.txt"))),
            f"--vocab-file {missing!r}: no such file (GPT2BPETokenizer vocab.json)")
    missing = str(tmp_path / "merges.txt")
    _raises(ConfigError, lambda: build_tokenizer(_choice(tokenizer_type="GPT2BPETokenizer",
                                                     vocab_file=str(ok / "vocab.json"),
                                                     merge_file=missing)),
            f"--merge-file {missing!r}: no such file (GPT2BPETokenizer merges.txt)")
    missing = str(tmp_path / "tokenizer.json")
    _raises(ConfigError, lambda: build_tokenizer(_choice(tokenizer_type="HuggingFaceTokenizer",
                                                     tokenizer_model=missing)),
            f"--tokenizer-model {missing!r}: no such file or directory")


def test_tokenizer_corrupt_files(bpe, tmp_path):
    from megatron.tokenizer import build_tokenizer

    ok = bpe["ok"]
    bad_vocab = tmp_path / "vocab.json"
    bad_vocab.write_text("{not json")
    _raises(ConfigError, lambda: build_tokenizer(_choice(tokenizer_type="GPT2BPETokenizer",
                                                     vocab_file=str(bad_vocab),
                                                     merge_file=str(ok / "merges.txt"))),
            f"could not read GPT-2 BPE from --vocab-file {str(bad_vocab)!r} and --merge-file")
    bad_json = tmp_path / "tokenizer.json"
    bad_json.write_text('{"version": "1.0", "model": ')
    _raises(ConfigError, lambda: build_tokenizer(_choice(tokenizer_type="HuggingFaceTokenizer",
                                                     tokenizer_model=str(bad_json))),
            f"--tokenizer-model {str(bad_json)!r} is not a tokenizers JSON file")
    cfg_dir = tmp_path / "with_cfg"
    cfg_dir.mkdir()
    (cfg_dir / "tokenizer.json").write_text((ok / "tokenizer.json").read_text())
    (cfg_dir / "tokenizer_config.json").write_text("{eos_token: </s>")
    model = str(cfg_dir / "tokenizer.json")
    _raises(ConfigError, lambda: build_tokenizer(_choice(tokenizer_type="HuggingFaceTokenizer",
                                                     tokenizer_model=model)),
            f"--tokenizer-model {model!r}: ", "tokenizer_config.json' beside it is not valid JSON")


def test_tokenizer_without_end_of_document_token(bpe):
    from megatron.tokenizer import build_tokenizer

    noeod = bpe["noeod"]
    _raises(ConfigError, lambda: build_tokenizer(_choice(tokenizer_type="GPT2BPETokenizer",
                                                     vocab_file=str(noeod / "vocab.json"),
                                                     merge_file=str(noeod / "merges.txt"))),
            f"--vocab-file {str(noeod / 'vocab.json')!r} has no '<|endoftext|>' token")
    model = str(noeod / "tokenizer.json")
    _raises(ConfigError, lambda: build_tokenizer(_choice(tokenizer_type="HuggingFaceTokenizer",
                                                     tokenizer_model=model)),
            f"--tokenizer-model {model!r} has no end-of-document token", "</s>")


def test_tokenizer_unknown_type():
    from megatron.tokenizer import build_tokenizer

    _raises(ConfigError, lambda: build_tokenizer(_choice(tokenizer_type="SentencePiece")),
            "unknown --tokenizer-type 'SentencePiece'", "ByteLevelTokenizer")


# ======================================================================= LR schedule config
LR_BASE = tiny_run_flags(seq_length=16, global_batch_size=4, train_iters=1000, lr="3e-4",
                         data_path=None)


def _stages(*starts):
    return [{"start": s, "schedule": 1e-4} for s in starts]


LR_CASES = {
    "not-a-mapping": ([1, 2], ["expected a mapping with key 'lr_schedule'"]),
    "unknown-top-level-key": ({"lr_schedule": 1e-4, "lr_shedule": 1},
                              ["unknown key 'lr_shedule'", "lr_schedule, weight_decay_schedule"]),
    "missing-lr-schedule": ({"weight_decay_schedule": 0.1}, ["missing key 'lr_schedule'"]),
    "unknown-kind": ({"lr_schedule": {"type": "cosinus", "from": 3e-4}},
                     ["unknown schedule type 'cosinus'", "known types", "cosine"]),
    "no-type": ({"lr_schedule": {"from": 3e-4}}, ["has no 'type'"]),
    "unknown-key": ({"lr_schedule": {"type": "cosine", "from": 3e-4, "too": 3e-5}},
                    ["schedule type 'cosine': unknown key 'too'"]),
    "missing-key": ({"lr_schedule": {"type": "cosine"}}, ["schedule type 'cosine' needs key 'from'"]),
    "unknown-unit": ({"lr_schedule": {"type": "cosine", "from": 3e-4, "unit": "epochs"}},
                     ["unknown unit 'epochs'"]),
    "unsorted-stages": ({"lr_schedule": _stages(0, 500, 300)},
                        ["stage 2: 'start' 300 is not after the previous stage's"]),
    "overlapping-stages": ({"lr_schedule": _stages(0, 500, 500)},
                           ["stage 2: 'start' 500 is not after the previous stage's"]),
    "stage-span-overlaps-next": ({"lr_schedule": [
        {"start": 0, "schedule": {"type": "linear", "from": 1e-4, "to": 0.0, "span": 800}},
        {"start": 500, "schedule": 1e-4}]}, ["stage 0: 'span' 800 overlaps the next stage"]),
    "first-stage-not-at-0": ({"lr_schedule": _stages(10, 500)}, ["stage 0: 'start' 10 must be 0"]),
    "stage-after-train-iters": ({"lr_schedule": _stages(0, 1200)},
                                ["stage 1: 'start' 1200", "end of training"]),
    "stage-unknown-key": ({"lr_schedule": [{"start": 0, "schedule": 1e-4, "end": 5}]},
                          ["stage 0: unknown key 'end'"]),
    "negative-value": ({"lr_schedule": {"type": "linear", "from": 3e-4, "to": -1e-5}},
                       ["negative or invalid learning rate"]),
    "warmup-longer-than-span": ({"lr_schedule": {"type": "cosine", "from": 3e-4, "warmup": 2000}},
                                ["warmup 2000", "is not shorter than"]),
    # json.dumps writes inf/nan as Infinity/NaN, which json.loads (and YAML's .inf/.nan) accept
    "infinite-value": ({"lr_schedule": {"type": "constant", "value": float("inf")}},
                       ["constant: 'value': inf is not a finite number"]),
    "infinite-number": ({"lr_schedule": float("inf")}, ["constant schedule: inf is not a finite number"]),
    "nan-stage-start": ({"lr_schedule": [{"start": 0, "schedule": 1e-4},
                                         {"start": float("nan"), "schedule": 1e-5}]},
                        ["stage 1: 'start': nan is not a finite number"]),
    "infinite-point": ({"lr_schedule": {"type": "step", "points": {"0": 1e-4, "Infinity": 1e-5}}},
                       ["step: point position 'Infinity' is not a finite number"]),
    "nan-point-value": ({"lr_schedule": {"type": "step", "points": [[0, 1e-4], [10, float("nan")]]}},
                        ["step: value at point 10: nan is not a finite number"]),
    "infinite-span": ({"lr_schedule": {"type": "cosine", "from": 3e-4, "span": float("inf")}},
                      ["cosine: 'span': inf is not a finite number"]),
}


@pytest.mark.parametrize("case", list(LR_CASES))
def test_lr_schedule_config(case, tmp_path):
    config, fragments = LR_CASES[case]
    path = tmp_path / "lr.json"
    path.write_text(json.dumps(config))
    args = get_parser().parse_args(LR_BASE + ["--lr-schedule-config", str(path)])
    _raises(ArgumentError, lambda: validate_args(args, 1, require_data=False),
            f"--lr-schedule-config {path}", *fragments)


def test_lr_schedule_config_unreadable(tmp_path):
    missing = tmp_path / "missing.yaml"
    args = get_parser().parse_args(LR_BASE + ["--lr-schedule-config", str(missing)])
    _raises(ArgumentError, lambda: validate_args(args, 1, require_data=False),
            f"--lr-schedule-config {missing}: no such file")
    bad = tmp_path / "bad.yaml"
    bad.write_text("lr_schedule: [unclosed")
    args = get_parser().parse_args(LR_BASE + ["--lr-schedule-config", str(bad)])
    _raises(ArgumentError, lambda: validate_args(args, 1, require_data=False),
            f"--lr-schedule-config {bad}: cannot parse")


def test_lr_schedule_differs_from_checkpoint():
    import torch

    from megatron.optim.learning_rates import build_opt_param_scheduler

    def scheduler(lr):
        args = parse_args(LR_BASE[:-1] + [lr], world_size=1, require_data=False)
        return build_opt_param_scheduler(args.run_config.schedule,
                                         torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0))
    old = scheduler("1e-3")
    old.step(4)
    _raises(ConfigError, lambda: scheduler("2e-3").load_state_dict(old.state_dict()),
            "the learning-rate/weight-decay schedule differs from the checkpoint's",
            "--lr (max_lr): checkpoint 0.001, now 0.002", "--override-opt_param-scheduler",
            "--use-checkpoint-opt_param-scheduler")


# ============================================================== the user-facing form (2 runs)
def _run_pretrain(flags, tmp_path):
    from helpers.launch import run_single_process
    return run_single_process("pretrain_gpt.py", flags, cwd=tmp_path)


def _assert_one_error_line(proc, fragments):
    log = proc.stdout + proc.stderr
    assert proc.returncode == 1, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, log[-3000:]
    _fragments(lines[0], fragments)


@pytest.mark.launch
def test_entry_point_bad_blend_file(data, tmp_path):
    blend = tmp_path / "blend.yaml"
    blend.write_text(f"train:\n  blend:\n  - {{path: {data['web']}, wieght: 1}}\n")
    proc = _run_pretrain(BASE + ["--data-blend-config", str(blend)], tmp_path)
    _assert_one_error_line(proc, [f"error: {blend}: train.blend[0]: unknown key 'wieght' (value 1)"])


@pytest.mark.launch
def test_entry_point_missing_tokenizer_file(data, tmp_path):
    missing = str(tmp_path / "tokenizer.json")
    proc = _run_pretrain(BASE + ["--data-path", data["web"], "--tokenizer-type",
                                 "HuggingFaceTokenizer", "--tokenizer-model", missing], tmp_path)
    _assert_one_error_line(proc, [f"error: --tokenizer-model {missing!r}: no such file or directory"])


# ==================================================================== docs/robustness.md
@pytest.mark.launch
def test_robustness_doc_names_existing_tests():
    """Every test id in docs/robustness.md (``T::`` = this file) is collected by pytest."""
    import re

    with open(os.path.join(ROOT, "docs", "robustness.md"), encoding="utf-8") as f:
        text = f.read()
    this = os.path.relpath(os.path.abspath(__file__), ROOT)  # tests/e2e/test_bad_inputs.py
    cited = set()
    for m in re.finditer(r"`((?:T|tests/[\w/]+\.py)::[^`]+)`", text):
        node = m.group(1).replace("\\|", "|")
        cited.add(this + node[1:] if node.startswith("T::") else node)
    assert len(cited) > 100, len(cited)
    files = sorted({node.split("::")[0] for node in cited})
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", *files], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    collected = {line.strip() for line in proc.stdout.splitlines() if "::" in line}
    assert collected, proc.stdout[-3000:] + proc.stderr[-3000:]
    functions = {node.split("[")[0] for node in collected}  # a parametrized test, all cases
    missing = sorted(node for node in cited if node not in collected and node not in functions)
    assert not missing, f"docs/robustness.md cites tests that do not exist: {missing}"


def test_tracker_with_undecodable_bytes_is_a_checkpoint_error(tmp_path):
    from megatron.checkpoint.format import read_tracker
    from megatron.errors import CheckpointError
    (tmp_path / "latest_checkpointed_iteration.txt").write_bytes(b"\xff\xfe12")
    with pytest.raises(CheckpointError, match="latest_checkpointed_iteration.txt holds"):
        read_tracker(str(tmp_path))
