"""What the data builders read (megatron/data/builder.py, megatron/data/mtf_builder.py): the
data flags after validation as a frozen dataclass whose fields
are their argparse dests, built once by megatron/config/run_config.py (``RunConfig.data``) and
passed down, so that no module of megatron/data/ reads the parsed flags."""
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from megatron.data.blend_config import BlendConfig
from megatron.data.weighted_splits import WeightedSplitGroup
from megatron.schedules.units import BatchConfig


@dataclass(frozen=True)
class DataConfig:
    """The data flags after validation (fields are their argparse dests):

    - the sources: ``--data-path`` words and ``--split``, ``--{train,valid,test}-data-path``
      words (or the ``--data-args-path`` / ``--per-split-data-args-path`` files they were read
      from, kept to name them in errors), ``data_blend`` (``--data-blend-config`` as validation
      parsed it, or None) and ``weighted_split_groups`` (``{"train"|"valid"|"test": [group]}`` of
      the ``--*-weighted-split-paths`` flags, parsed by validation);
    - the index: ``--data-cache-path`` (or None: megatron-core's default beside each prefix),
      ``--data-index-order`` and ``--seed``;
    - the samples: ``--pack-documents`` (``"concat"``: megatron-core's windows, or
      ``"best-fit"``: whole documents packed into bins, megatron/data/document_packing.py),
      ``--reset-position-ids``, ``--reset-attention-mask``, ``--eod-mask-loss``,
      ``--dataset-loss-weights`` (the ``NAME=WEIGHT`` words, or None) and the T0 flags
      ``--prefix-lm``, ``--loss-on-targets-only``, ``--norm-target-loss`` (False where the entry
      point has none: pretrain_gpt.py);
    - the run's length and evaluations: ``--train-iters`` (iterations; derived by validation for
      a ``--train-samples`` run), ``--train-samples`` (samples, or None), ``--eval-interval``
      (iterations) and ``--eval-iters`` (global batches per evaluation);
    - ``batch``: megatron/schedules/units.py :class:`BatchConfig` (the batch schedule, which also
      gives ``--global-batch-size`` in samples and ``--seq-length`` in tokens)."""

    data_path: Optional[List[str]]
    split: Optional[str]
    train_data_path: Optional[List[str]]
    valid_data_path: Optional[List[str]]
    test_data_path: Optional[List[str]]
    data_args_path: Optional[str]
    per_split_data_args_path: Optional[str]
    data_blend: Optional[BlendConfig]
    weighted_split_groups: Dict[str, List[WeightedSplitGroup]]
    data_cache_path: Optional[str]
    data_index_order: str
    seed: int
    pack_documents: str
    reset_position_ids: bool
    reset_attention_mask: bool
    eod_mask_loss: bool
    dataset_loss_weights: Optional[Sequence[str]]
    prefix_lm: bool
    loss_on_targets_only: bool
    norm_target_loss: bool
    train_iters: Optional[int]
    train_samples: Optional[int]
    eval_interval: int
    eval_iters: int
    batch: BatchConfig

    @property
    def seq_length(self) -> int:
        """``--seq-length`` (tokens per sample), the batch config's."""
        return self.batch.seq_length

    @property
    def global_batch_size(self) -> int:
        """``--global-batch-size`` (samples per iteration), the batch config's."""
        return self.batch.global_batch_size
