"""Weights & Biases logging (megatron/metrics/wandb_writer.py): the flags and their aliases, the one-line
error when wandb cannot be imported, the run id kept in --save for a resume, and a failing W&B log
that warns and never stops training. The entry point without wandb:
tests/e2e/test_wandb_logging_e2e.py; the 2-rank runs whose offline W&B history is read back are in
tests/e2e/test_curriculum_e2e.py (every record) and tests/e2e/test_schedule_resume_e2e.py
(resume)."""
import sys

import pytest

from helpers.flags import parse
from megatron.errors import ArgumentError
from megatron.metrics.wandb_writer import (
    RUN_ID_FILE,
    WandbWriter,
    read_run_id,
    run_config,
    run_id_to_resume,
    write_run_id,
)
from megatron.metrics.writers import MetricsWriter, metrics_writer


@pytest.fixture
def no_wandb(monkeypatch):
    """``import wandb`` raises ImportError (None in sys.modules), as when it is not installed."""
    monkeypatch.setitem(sys.modules, "wandb", None)


def test_flags_and_llm_jp_alias():
    args = parse(["--wandb-project", "p", "--wandb-name", "exp", "--wandb-save-dir", "d"])
    assert (args.wandb_project, args.wandb_exp_name, args.wandb_save_dir) == ("p", "exp", "d")
    assert vars(args) == vars(parse(["--wandb-project", "p", "--wandb-exp-name", "exp",
                                     "--wandb-save-dir", "d"])) | {"given_flags": args.given_flags}
    assert not any("accepted without effect" in note for note in args.run_config.notes)
    # the config of the run is the validated arguments (derived values included), JSON-clean
    config = run_config(vars(args))
    assert config["wandb_project"] == "p" and config["data_parallel_size"] == 1
    assert config["ffn_hidden_size"] == 4 * 64


def test_without_project_nothing_is_imported_and_other_flags_are_noted(no_wandb):
    args = parse(["--wandb-exp-name", "exp"])
    assert "--wandb-exp-name without --wandb-project: no W&B run (as in Megatron-LM)" in \
        args.run_config.notes
    assert args.run_config.metrics.metrics_jsonl is None
    assert metrics_writer(args.run_config.metrics, enabled=True, run_flags=vars(args)).writers == []


def test_project_without_wandb_is_one_error_naming_the_extra(no_wandb):
    with pytest.raises(ArgumentError) as info:
        parse(["--wandb-project", "p"])
    message = str(info.value)
    assert message.startswith("--wandb-project p needs the wandb package, which cannot be "
                              "imported (ModuleNotFoundError: import of wandb halted")
    assert message.endswith("install it: pip install '.[wandb]' (or pip install wandb)")


def test_run_id_kept_in_save_resumes_unless_another_name(tmp_path):
    assert read_run_id(str(tmp_path)) is None and run_id_to_resume(None, "a") is None
    write_run_id(str(tmp_path), "abc123", "exp")
    assert (tmp_path / RUN_ID_FILE).read_text() == "abc123\nexp\n"
    assert run_id_to_resume(str(tmp_path), "exp") == "abc123"
    assert run_id_to_resume(str(tmp_path), None) == "abc123"  # no name given: same run
    assert run_id_to_resume(str(tmp_path), "other") is None  # another name: a new run
    write_run_id(str(tmp_path), "def456", None)
    assert read_run_id(str(tmp_path)) == ("def456", None)
    assert run_id_to_resume(str(tmp_path), "named-now") is None


class _Run:
    """A W&B run stand-in whose ``log`` raises from the second call on."""

    def __init__(self):
        self.logged, self.finished = [], False

    def log(self, data, step):
        if self.logged:
            raise ConnectionError("W&B is down")
        self.logged.append((step, data))

    def finish(self):
        self.finished = True


def test_failing_log_warns_and_the_other_writers_go_on(tmp_path, capsys):
    from megatron.metrics.writers import JsonlWriter

    run = _Run()
    metrics = MetricsWriter([WandbWriter(run), JsonlWriter(str(tmp_path / "m.jsonl"))])
    for i in (1, 2, 3):
        metrics.train_record({"iteration": i, "lm_loss": 2.0, "lr": 1e-3, "grad_norm": None,
                              "per_dataset_loss": {"web": 2.5}})
    metrics.eval_record({"iteration": 3, "split": "valid", "group": "web", "lm_loss": 2.0,
                         "ppl": 7.4})
    metrics.close()
    assert run.logged == [(1, {"train/lm_loss": 2.0, "train/lr": 1e-3,
                               "train/per_dataset_loss/web": 2.5})]
    assert run.finished
    assert len((tmp_path / "m.jsonl").read_text().splitlines()) == 4
    err = capsys.readouterr().err.splitlines()
    assert err == ["warning: W&B: logging iteration 2 failed (ConnectionError: W&B is down); "
                   "training goes on, --metrics-jsonl/TensorBoard still get every record",
                   "warning: W&B: 3 log calls failed in this run"]
