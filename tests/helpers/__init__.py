"""Shared test helpers (imported as ``helpers.<module>``: pyproject.toml puts tests/ on the path).

paths       ROOT, the tests' folders, shared_session_dir (one directory for all xdist workers)
ports       free_port
flags       the tiny model and run flags most in-process tests parse
launch      run_deepspeed / run_single_process / run_ranks (how the tests start a training run or
            a child script), read_jsonl, DeepSpeed's /dev/shm buffers of a launch
parallel    the layout-comparison run (one model under every parallel layout)
resume      the pretraining scenario of the exact-resume tests (staged LR, 3-dataset curriculum)
curriculum  a CurriculumIndex over fake datasets; megatron-core's blending rule
hf          tiny models, checkpoints and exports for the Hugging Face conversion tests
eval_tasks  the local lm-eval task files of the evaluation tests
models      the model builders of a validated namespace (its typed configs, vocabulary rows)
tensors     every tensor of a nested state, by path
wandb_offline  reading an offline W&B run back

Nothing here is a test module; no test module imports another (tests/unit/test_suite_layout.py).
"""
