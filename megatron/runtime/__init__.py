"""The process of a run below the parallel layouts: native ops built at first use, DeepSpeed's CPU
all-reduce, warnings silenced at start-up, the launch port and its one retry, how an entry point
ends (process_exit.py). (Distributed start-up is megatron/parallel/initialize.py.)"""
