"""Training and evaluation records: ``--metrics-jsonl`` lines and TensorBoard scalars (rank 0)."""
import json
import math
import os
from typing import Any, Dict, Optional, Sequence, Tuple

# Training-record keys written to TensorBoard only when asked, with the flag that asks (the
# Megatron-LM/BigScience --log-*-to-tensorboard flags).
TENSORBOARD_EXTRAS = {"global_batch_size": "log_batch_size_to_tensorboard",
                      "ms_per_iteration": "log_timers_to_tensorboard"}


def tensorboard_extras_from_args(args) -> Tuple[str, ...]:
    """The :data:`TENSORBOARD_EXTRAS` keys whose flag is set: ``global_batch_size`` (samples per
    iteration) for ``--log-batch-size-to-tensorboard``, ``ms_per_iteration`` (wall time) for
    ``--log-timers-to-tensorboard``."""
    return tuple(key for key, dest in TENSORBOARD_EXTRAS.items() if getattr(args, dest))


class MetricsWriter:
    """Writes one JSON object per line to ``jsonl_path`` and mirrors scalars to TensorBoard.

    Only the rank that owns the writer (rank 0) writes; other ranks get a writer with no outputs.
    """

    def __init__(self, jsonl_path: Optional[str], tensorboard_dir: Optional[str], enabled: bool,
                 tensorboard_extras: Sequence[str] = ()):
        self.enabled = enabled
        self._tb_extras = tuple(tensorboard_extras)
        self._jsonl = None
        self._tb = None
        if not enabled:
            return
        if jsonl_path:
            os.makedirs(os.path.dirname(os.path.abspath(jsonl_path)), exist_ok=True)
            self._jsonl = open(jsonl_path, "a", buffering=1)
        if tensorboard_dir:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=tensorboard_dir)

    def train_record(self, record: Dict[str, Any]) -> None:
        """Log a training record (the README's --metrics-jsonl keys: iteration, lr, ...)."""
        self._write(record)
        if self._tb is not None:
            step = record["iteration"]
            for key in ("lm_loss", "lr", "weight_decay", "grad_norm", "consumed_samples",
                        "tokens_per_second") + self._tb_extras:
                if record.get(key) is not None:
                    self._tb.add_scalar(f"train/{key}", record[key], step)
            for name, loss in (record.get("per_dataset_loss") or {}).items():
                self._tb.add_scalar(f"train/per_dataset_loss/{name}", loss, step)

    def eval_record(self, record: Dict[str, Any]) -> None:
        """Log an evaluation record: iteration, split, group, lm_loss, ppl."""
        self._write(record)
        if self._tb is not None:
            tag = f"{record['split']}/{record['group']}"
            self._tb.add_scalar(f"{tag}/lm_loss", record["lm_loss"], record["iteration"])
            self._tb.add_scalar(f"{tag}/ppl", record["ppl"], record["iteration"])

    def _write(self, record: Dict[str, Any]) -> None:
        if self._jsonl is not None:
            self._jsonl.write(json.dumps(record) + "\n")

    def close(self) -> None:
        """Flush and close the outputs."""
        if self._jsonl is not None:
            self._jsonl.close()
        if self._tb is not None:
            self._tb.close()


def perplexity(loss: float) -> float:
    """exp(loss), capped to avoid overflow (loss in nats per token)."""
    return math.exp(min(loss, 20.0))
