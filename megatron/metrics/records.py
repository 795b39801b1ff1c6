"""The scalars of a training or evaluation record under their tags, shared by every writer that
logs scalars: TensorBoard (megatron/metrics/writers.py) and Weights & Biases (megatron/metrics/wandb_writer.py).
A leaf: the writers import it, it imports none of them."""
from numbers import Number
from typing import Any, Dict, Optional, Sequence

POSITION_LOSS_PREFIX = "lm_loss_pos_"  # megatron/metrics/position_buckets.py bucket_tag


def train_scalars(record: Dict[str, Any], keys: Optional[Sequence[str]] = None) -> Dict[str, float]:
    """The scalars of a training record as ``{tag: value}``: ``train/KEY`` for each of ``keys``
    (None: every numeric key but ``iteration``) whose value is not None, and
    ``train/per_dataset_loss/NAME`` for each dataset's loss (nats per token) and
    ``train/samples_drawn/NAME`` for each dataset's samples drawn so far (the data ledger) and
    ``train/loss_token_share/NAME`` for its share of the loss tokens, and with an adaptive mixer
    ``train/mixer_weights/NAME`` (its sampling weight) or ``train/mixer_loss_weights/NAME`` (its
    loss weight, ``target: loss_weight``). The step they belong to is ``record["iteration"]``
    (iterations)."""
    if keys is None:
        keys = [k for k, v in record.items()
                if k != "iteration" and isinstance(v, Number) and not isinstance(v, bool)]
    out = {f"train/{key}": record[key] for key in keys if record.get(key) is not None}
    for name, loss in (record.get("per_dataset_loss") or {}).items():
        out[f"train/per_dataset_loss/{name}"] = loss
    # the data ledger; the loss's make-up; an adaptive mixer's weights
    for group in ("samples_drawn", "loss_token_share", "mixer_weights", "mixer_loss_weights"):
        for name, value in (record.get(group) or {}).items():
            out[f"train/{group}/{name}"] = value
    return out


def eval_scalars(record: Dict[str, Any]) -> Dict[str, float]:
    """The scalars of an evaluation record, under its split and validation group's name:
    ``{split}/{group}/lm_loss`` (nats per token), ``{split}/{group}/ppl`` and, under
    ``--eval-position-buckets``, each position bucket's ``{split}/{group}/lm_loss_pos_LO_HI`` (nats
    per loss token of positions LO to HI - 1; megatron/metrics/position_buckets.py)."""
    tag = f"{record['split']}/{record['group']}"
    out = {f"{tag}/lm_loss": record["lm_loss"], f"{tag}/ppl": record["ppl"]}
    out.update({f"{tag}/{key}": value for key, value in record.items()
                if key.startswith(POSITION_LOSS_PREFIX)})
    return out
