"""Parser and validate_args: defaults derived as Megatron-LM does, bad combinations named clearly."""
import json

import pytest

from helpers.flags import TINY_RUN, parse
from megatron.config.arguments import validate_args
from megatron.config.parser import get_parser
from megatron.errors import ArgumentError


def test_defaults_are_derived():
    args = parse(["--global-batch-size", "8"], world_size=2)
    assert args.data_parallel_size == 2
    assert args.gradient_accumulation_steps == 2
    assert args.ffn_hidden_size == 4 * 64
    assert args.kv_channels == 16
    assert args.max_position_embeddings == 32
    assert args.num_query_groups == 4
    assert args.start_weight_decay == args.end_weight_decay == args.weight_decay


def test_global_batch_defaults_to_micro_times_dp():
    assert parse([], world_size=2).global_batch_size == 4


def test_swiglu_ffn_size_rounds_to_64():
    args = parse(["--swiglu", "--hidden-size", "96", "--num-attention-heads", "4"])
    assert args.ffn_hidden_size == int((4 * 96 * 2 / 3) / 64) * 64


@pytest.mark.parametrize("extra, world_size, fragments", [
    (["--global-batch-size", "6"], 2, ["--global-batch-size 6", "--micro-batch-size 2", "data-parallel size 2"]),
    (["--train-samples", "100"], 1, ["--train-iters 10", "--train-samples 100", "mutually exclusive"]),
    (["--fp16", "--bf16"], 1, ["--fp16", "--bf16"]),
    (["--hidden-size", "66"], 1, ["--hidden-size 66", "--num-attention-heads 4"]),
    (["--min-lr", "1"], 1, ["--min-lr 1.0", "--lr 0.001"]),
    (["--lr", "-1"], 1, ["--lr -1.0"]),
    (["--max-position-embeddings", "16"], 1, ["--seq-length 32", "--max-position-embeddings 16"]),
    (["--tensor-model-parallel-size", "2"], 3, ["world size 3", "--tensor-model-parallel-size 2"]),
    (["--rampup-batch-size", "2", "3", "100", "--global-batch-size", "8"], 1, ["--rampup-batch-size 2 3 100"]),
    (["--rampup-batch-size", "3", "1", "100", "--global-batch-size", "8"], 1, ["multiples of"]),
    (["--lr-decay-samples", "100"], 1, ["--lr-decay-samples", "--train-iters"]),
    (["--lr-decay-style", "WSD"], 1, ["--lr-wsd-decay-iters"]),
    (["--eval-interval", "0"], 1, ["--eval-interval 0"]),
    (["--hidden-dropout", "1.5"], 1, ["--hidden-dropout 1.5"]),
    (["--tokenizer-type", "GPT2BPETokenizer"], 1, ["--vocab-file", "--merge-file"]),
    (["--override-opt_param-scheduler", "--use-checkpoint-opt_param-scheduler"], 1,
     ["--override-opt_param-scheduler", "--use-checkpoint-opt_param-scheduler"]),
    (["--train-data-path", "x"], 1, ["--data-path", "--train-data-path"]),
])
def test_bad_combinations_name_flags_and_values(extra, world_size, fragments):
    with pytest.raises(ArgumentError) as err:
        parse(extra, world_size)
    for fragment in fragments:
        assert fragment in str(err.value)


def test_missing_required_flags_are_listed():
    with pytest.raises(ArgumentError, match="--num-layers"):
        validate_args(get_parser().parse_args(["--lr", "1"]), 1)


def test_no_data_is_an_error():
    base = [a for a in TINY_RUN if a not in ("--data-path", "some/prefix")]
    with pytest.raises(ArgumentError, match="--data-path"):
        parse([], base=base)


def test_rampup_parsed_to_ints():
    args = parse(["--rampup-batch-size", "2", "2", "100", "--global-batch-size", "8"])
    assert args.rampup_batch_size == [2, 2, 100]


def test_bigscience_token_aliases_convert_to_samples():
    base = [a for a in TINY_RUN if a not in ("--train-iters", "10")]
    from megatron.optim.learning_rates import scheduler_steps
    args = parse(["--train-samples", "1000", "--lr-warmup-tokens", "100", "--lr-decay-tokens", "3200"], base=base)
    steps = scheduler_steps(args.run_config.schedule)
    assert steps["lr_warmup_steps"] == 100 / 32 and steps["lr_decay_steps"] == 100  # tokens / seq


def test_scheduler_aliases():
    args = parse(["--override-lr-scheduler"])
    assert args.override_opt_param_scheduler
    args = parse(["--use-checkpoint-lr-scheduler"])
    assert args.use_checkpoint_opt_param_scheduler


def test_deepspeed_config_must_agree_with_flags(tmp_path):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_batch_size": 16, "zero_optimization": {"stage": 1}}))
    with pytest.raises(ArgumentError, match="train_batch_size=16"):
        parse(["--global-batch-size", "8", "--deepspeed", "--deepspeed_config", str(cfg)])
    cfg.write_text(json.dumps({"train_batch_size": 8, "zero_optimization": {"stage": 1}}))
    args = parse(["--global-batch-size", "8", "--deepspeed_config", str(cfg)])
    assert args.deepspeed_config_dict["zero_optimization"]["stage"] == 1


def test_deepspeed_config_missing_or_invalid(tmp_path):
    with pytest.raises(ArgumentError, match="no such file"):
        parse(["--deepspeed_config", str(tmp_path / "nope.json")])
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ArgumentError, match="not valid JSON"):
        parse(["--deepspeed_config", str(bad)])


def test_parse_args_exits_with_message(capsys):
    from megatron.config.parser import parse_args
    with pytest.raises(SystemExit) as exit_info:
        parse_args(TINY_RUN + ["--fp16", "--bf16"], world_size=1)
    assert exit_info.value.code == 2
    assert "--fp16 and --bf16" in capsys.readouterr().err


def test_missing_dataset_files_name_the_flag(tmp_path):
    from megatron.data.builder import check_prefixes_exist
    with pytest.raises(ValueError, match=r"--data-path: dataset file '.*nothing\.bin' does not "
                                         r"exist, nor '.*nothing\.idx'"):
        check_prefixes_exist("--data-path", ["0.5", str(tmp_path / "nothing")])
    (tmp_path / "half.bin").write_bytes(b"")
    with pytest.raises(ValueError, match=r"--train-data-path: dataset file '.*half\.idx' does not "
                                         r"exist \(the prefix"):
        check_prefixes_exist("--train-data-path", [str(tmp_path / "half")])


def test_loss_normalisation_flags_are_exclusive():
    with pytest.raises(ArgumentError, match="--calculate-per-token-loss and "
                                            "--calculate-per-sample-loss are mutually exclusive"):
        parse(["--calculate-per-token-loss", "--calculate-per-sample-loss"])
    for bad, message in ((["copy"], "'copy' is not NAME=WEIGHT"),
                         (["web=0"], "'web=0': the weight must be positive and finite"),
                         (["web=1", "web=2"], "'web' is given twice")):
        with pytest.raises(ArgumentError, match=f"--dataset-loss-weights: {message}"):
            parse(["--dataset-loss-weights", *bad])
    assert parse(["--dataset-loss-weights", "web=2", "code=0.5"]).dataset_loss_weights == [
        "web=2", "code=0.5"]
