"""Parallel layouts: tensor/pipeline/data-parallel sizes, megatron-core process groups, the ``mpu``
DeepSpeed is given, activation recompute flags."""
