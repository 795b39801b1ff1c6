"""Weights & Biases logging (``--wandb-project``, ``--wandb-exp-name``, ``--wandb-save-dir``, with
Megatron-LM's meaning): one run, written by the rank that owns the metrics (rank 0, the one that
writes ``--metrics-jsonl`` and TensorBoard), whose config is the validated arguments and whose
history gets every record those get (megatron/metrics/writers.py; their tags: megatron/metrics/records.py),
at the iteration as the step.

The run id is kept in ``--save``/:data:`RUN_ID_FILE` (with the experiment name it was started
under), so a run resumed from its checkpoints continues the same W&B run, unless another
``--wandb-exp-name`` is given. ``wandb`` is imported only when ``--wandb-project`` is given; a
failure of W&B during training is a warning and never stops the run.
"""
import json
import os
import sys
from typing import Any, Dict, Optional, Tuple

from megatron.errors import ConfigError
from megatron.metrics.records import eval_scalars, train_scalars
from megatron.utils.atomic_io import atomic_write_text

RUN_ID_FILE = "wandb_run_id.txt"
INSTALL_HINT = "pip install '.[wandb]' (or pip install wandb)"


def wandb_import_problem() -> Optional[str]:
    """Why ``import wandb`` fails here (``"ModuleNotFoundError: No module named 'wandb'"``), or
    None when it works."""
    try:
        import wandb  # noqa: F401
    except ImportError as e:
        return f"{type(e).__name__}: {e}"
    return None


def read_run_id(save_dir: Optional[str]) -> Optional[Tuple[str, Optional[str]]]:
    """``(run id, experiment name or None)`` stored in ``save_dir``/:data:`RUN_ID_FILE`, or None
    when there is no such file (or no ``save_dir``)."""
    if not save_dir:
        return None
    path = os.path.join(save_dir, RUN_ID_FILE)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    if not lines or not lines[0].strip():
        return None
    name = lines[1] if len(lines) > 1 and lines[1] else None
    return lines[0].strip(), name


def write_run_id(save_dir: str, run_id: str, name: Optional[str]) -> None:
    """Store ``run_id`` and the experiment ``name`` it was started under (line 1 and 2 of
    ``save_dir``/:data:`RUN_ID_FILE`), atomically."""
    os.makedirs(save_dir, exist_ok=True)
    atomic_write_text(os.path.join(save_dir, RUN_ID_FILE), f"{run_id}\n{name or ''}\n")


def run_id_to_resume(save_dir: Optional[str], name: Optional[str]) -> Optional[str]:
    """The W&B run id to continue: the one stored in ``save_dir`` unless ``name`` (the
    ``--wandb-exp-name`` given now) differs from the name that run was started under; None (a
    new run) otherwise."""
    stored = read_run_id(save_dir)
    if stored is None:
        return None
    run_id, stored_name = stored
    if name and name != stored_name:
        return None
    return run_id


def run_config(run_flags: Dict[str, Any]) -> Dict[str, Any]:
    """The validated arguments (``run_flags``: ``vars(args)``) as the run's config, with every
    value JSON can't hold written as its ``str``; the typed configs (``run_config``) are left
    out: they repeat the flags."""
    flags = {key: value for key, value in run_flags.items() if key != "run_config"}
    return json.loads(json.dumps(flags, default=str))


def wandb_dir(config) -> Optional[str]:
    """Where the run's local files go (``DIR/wandb/...``): ``--wandb-save-dir``, else
    ``--save``/wandb (Megatron-LM's default), else None (wandb's own default, ./wandb).
    ``config``: the run's megatron/metrics/writers.py ``MetricsConfig``."""
    if config.wandb_save_dir:
        return config.wandb_save_dir
    if config.save:
        return os.path.join(config.save, "wandb")
    return None


def start_wandb_run(config, run_flags: Dict[str, Any]):
    """``wandb.init`` for ``--wandb-project`` with ``--wandb-exp-name`` as the name, the run id
    of ``--save`` continued (:func:`run_id_to_resume`) and the arguments (``run_flags``) as
    config; the run's id is then stored in ``--save``. ``config``: the run's ``MetricsConfig``.
    A failing ``wandb.init`` is a :class:`ConfigError` (no training has started)."""
    import wandb

    directory = wandb_dir(config)
    if directory:
        os.makedirs(directory, exist_ok=True)
    resume_id = run_id_to_resume(config.save, config.wandb_exp_name)
    kwargs = dict(project=config.wandb_project, name=config.wandb_exp_name, dir=directory,
                  config=run_config(run_flags))
    if resume_id is not None:
        kwargs.update(id=resume_id, resume="allow")
    try:
        run = wandb.init(**kwargs)
    except Exception as e:  # wandb raises its own error types (no API key, bad project ...)
        raise ConfigError(f"--wandb-project {config.wandb_project}: wandb.init failed "
                          f"({type(e).__name__}: {e}); WANDB_MODE=offline logs without an "
                          "account (wandb sync uploads later)") from None
    if config.save:
        write_run_id(config.save, run.id, config.wandb_exp_name)
    return run


def _warn(message: str) -> None:
    sys.stderr.write(f"warning: {message}\n")
    sys.stderr.flush()


class WandbWriter:
    """Logs each record to a W&B ``run`` at the record's iteration as the step: every numeric
    key of a training record (``train/KEY``, per-dataset losses ``train/per_dataset_loss/NAME``)
    and each evaluation record's loss and perplexity (``{split}/{group}/lm_loss``, ``.../ppl``).
    A failing ``run.log`` or ``run.finish`` prints a warning (the first failure in full, then a
    count at the end) and training goes on."""

    def __init__(self, run):
        self._run = run
        self._failures = 0

    def train_record(self, record: Dict[str, Any]) -> None:
        """Log the training record's scalars at its iteration."""
        self._log(train_scalars(record), record["iteration"])

    def eval_record(self, record: Dict[str, Any]) -> None:
        """Log the evaluation record's loss and perplexity at its iteration."""
        self._log(eval_scalars(record), record["iteration"])

    def _log(self, scalars: Dict[str, float], step: int) -> None:
        try:
            self._run.log(scalars, step=step)
        except Exception as e:  # never let logging stop training
            self._failures += 1
            if self._failures == 1:
                _warn(f"W&B: logging iteration {step} failed ({type(e).__name__}: {e}); "
                      "training goes on, --metrics-jsonl/TensorBoard still get every record")

    def close(self) -> None:
        """Finish the run (its files are complete afterwards)."""
        if self._failures > 1:
            _warn(f"W&B: {self._failures} log calls failed in this run")
        try:
            self._run.finish()
        except Exception as e:
            _warn(f"W&B: finishing the run failed ({type(e).__name__}: {e})")


def wandb_writer(config, run_flags: Dict[str, Any]) -> WandbWriter:
    """A :class:`WandbWriter` on the run :func:`start_wandb_run` starts."""
    return WandbWriter(start_wandb_run(config, run_flags))
