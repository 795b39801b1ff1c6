"""Training and evaluation records, written by rank 0 through one fan-out (:class:`MetricsWriter`)
to each writer asked for: ``--metrics-jsonl`` lines (:class:`JsonlWriter`), TensorBoard scalars
(:class:`TensorBoardWriter`) and a Weights & Biases run (``--wandb-project``:
megatron/metrics/wandb_writer.py). Every writer gets the same record dicts from megatron/train/ and
computes nothing itself: the scalar tags of a record are ``train_scalars`` / ``eval_scalars``
(megatron/metrics/records.py), shared by TensorBoard and W&B.
"""
import json
import math
import os
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence, Tuple

from megatron.metrics.records import eval_scalars, train_scalars

# Training-record keys written to TensorBoard only when asked, with the flag that asks (the
# Megatron-LM/BigScience --log-*-to-tensorboard flags).
TENSORBOARD_EXTRAS = {"global_batch_size": "log_batch_size_to_tensorboard",
                      "ms_per_iteration": "log_timers_to_tensorboard"}
# Training-record keys TensorBoard always gets (train/KEY), besides the per-dataset losses.
TENSORBOARD_TRAIN_KEYS = ("lm_loss", "lr", "weight_decay", "grad_norm", "consumed_samples",
                          "tokens_per_second", "seq_length",
                          # with a skip flag (docs/skip_step.md), absent otherwise
                          "skipped", "skipped_total",
                          # MoE models (megatron/metrics/moe.py), absent for dense ones
                          "load_balancing_loss", "seq_load_balancing_loss", "z_loss",
                          "tokens_per_expert_min", "tokens_per_expert_max")


@dataclass(frozen=True)
class MetricsConfig:
    """The metrics flags after validation (fields are their argparse dests): ``--metrics-jsonl``,
    ``--tensorboard-dir``, the TensorBoard extras' switches, the W&B flags and ``--save`` (where
    W&B's run id is kept)."""

    metrics_jsonl: Optional[str]
    tensorboard_dir: Optional[str]
    log_batch_size_to_tensorboard: bool
    log_timers_to_tensorboard: bool
    wandb_project: Optional[str]
    wandb_exp_name: Optional[str]
    wandb_save_dir: Optional[str]
    save: Optional[str]


def tensorboard_extras(config: MetricsConfig) -> Tuple[str, ...]:
    """The :data:`TENSORBOARD_EXTRAS` keys whose flag is set: ``global_batch_size`` (samples per
    iteration) for ``--log-batch-size-to-tensorboard``, ``ms_per_iteration`` (wall time) for
    ``--log-timers-to-tensorboard``."""
    return tuple(key for key, dest in TENSORBOARD_EXTRAS.items() if getattr(config, dest))


class JsonlWriter:
    """Appends each record as one JSON object per line to ``path`` (``--metrics-jsonl``)."""

    def __init__(self, path: str):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._file = open(path, "a", buffering=1)

    def train_record(self, record: Dict[str, Any]) -> None:
        """Write a training record as it is."""
        self._file.write(json.dumps(record) + "\n")

    def eval_record(self, record: Dict[str, Any]) -> None:
        """Write an evaluation record as it is."""
        self._file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        """Flush and close the file."""
        self._file.close()


class TensorBoardWriter:
    """TensorBoard scalars in ``log_dir`` (``--tensorboard-dir``) at the record's iteration:
    :data:`TENSORBOARD_TRAIN_KEYS` plus ``extras`` (:func:`tensorboard_extras`) and the
    per-dataset losses of training records, and every evaluation record's loss and perplexity."""

    def __init__(self, log_dir: str, extras: Sequence[str] = ()):
        from torch.utils.tensorboard import SummaryWriter

        self._keys = TENSORBOARD_TRAIN_KEYS + tuple(extras)
        self._tb = SummaryWriter(log_dir=log_dir)

    def train_record(self, record: Dict[str, Any]) -> None:
        """Add the training record's scalars at its iteration."""
        self._add(train_scalars(record, self._keys), record["iteration"])

    def eval_record(self, record: Dict[str, Any]) -> None:
        """Add the evaluation record's loss and perplexity at its iteration."""
        self._add(eval_scalars(record), record["iteration"])

    def _add(self, scalars: Dict[str, float], step: int) -> None:
        for tag, value in scalars.items():
            self._tb.add_scalar(tag, value, step)

    def close(self) -> None:
        """Flush and close the event file."""
        self._tb.close()


class MetricsWriter:
    """Hands every training and evaluation record to each of ``writers`` (objects with
    ``train_record``, ``eval_record`` and ``close``), in order. Only the rank that owns the
    metrics (rank 0) has writers; the others get a MetricsWriter with none."""

    def __init__(self, writers: Sequence[Any] = ()):
        self.writers = list(writers)

    @property
    def enabled(self) -> bool:
        """Whether any writer is attached."""
        return bool(self.writers)

    def train_record(self, record: Dict[str, Any]) -> None:
        """Log a training record (the README's --metrics-jsonl keys: iteration, lr, ...)."""
        for writer in self.writers:
            writer.train_record(record)

    def eval_record(self, record: Dict[str, Any]) -> None:
        """Log an evaluation record: iteration, split, group, lm_loss, ppl."""
        for writer in self.writers:
            writer.eval_record(record)

    def close(self) -> None:
        """Flush and close every writer."""
        for writer in self.writers:
            writer.close()


def metrics_writer(config: MetricsConfig, enabled: bool, run_flags: Dict[str, Any]) -> MetricsWriter:
    """The writers the flags ask for (``--metrics-jsonl``, ``--tensorboard-dir``,
    ``--wandb-project``) on the rank that owns the metrics (``enabled``); none elsewhere.
    ``run_flags``: every flag's value, W&B's run config."""
    writers = []
    if enabled and config.metrics_jsonl:
        writers.append(JsonlWriter(config.metrics_jsonl))
    if enabled and config.tensorboard_dir:
        writers.append(TensorBoardWriter(config.tensorboard_dir, tensorboard_extras(config)))
    if enabled and config.wandb_project:
        from megatron.metrics.wandb_writer import wandb_writer  # lazy: wandb is optional

        writers.append(wandb_writer(config, run_flags))
    return MetricsWriter(writers)


def perplexity(loss: float) -> float:
    """exp(loss), capped to avoid overflow (loss in nats per token)."""
    return math.exp(min(loss, 20.0))
