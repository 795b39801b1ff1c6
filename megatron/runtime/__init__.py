"""The process of a run below the parallel layouts: native ops built at first use, DeepSpeed's CPU
all-reduce, warnings silenced at start-up. (Distributed start-up is megatron/parallel/initialize.py;
the fast exit is megatron/utils/process_exit.py.)"""
