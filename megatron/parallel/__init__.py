"""Parallel layouts: distributed start-up (torch.distributed, megatron-core's process groups,
seeds), tensor/pipeline/data-parallel sizes, the ``mpu`` DeepSpeed is given, activation recompute
flags."""
