"""Exact resume, in one process: the global sample order is independent of the data-parallel size
(from any resume point), the curriculum dataset is rebuilt identically from the same flags, and
creating the training iterator draws nothing from torch's global generator. The runs killed with
SIGKILL and resumed (bitwise the same records) are in tests/e2e/test_exact_resume_e2e.py."""
import dataclasses

import pytest
import torch

from helpers.flags import parse
from helpers.resume import TRAIN_ITERS, make_pretrain_data, pretrain_flags


def _global_order(dp: int, micro_batch_size: int, consumed: int, total: int, steps: int):
    """Global sample indices each optimizer step would read, as sets of micro batches."""
    from megatron.data.samplers import PretrainingBatchSampler
    iters = [iter(PretrainingBatchSampler(total, consumed, micro_batch_size, r, dp)) for r in range(dp)]
    order = []
    for _ in range(steps):
        for it in iters:  # rank order within a step
            order.append(tuple(next(it)))
    return order


@pytest.mark.parametrize("consumed", [0, 40])
def test_global_sample_order_is_independent_of_data_parallel_size(consumed):
    # 2 ranks x 2 steps (gradient accumulation 2) and 1 rank x 4 steps read the same micro batches
    # of the global batch of 8 samples, in the same order, from any resume point.
    two = _global_order(2, 2, consumed, 1000, steps=8)
    one = _global_order(1, 2, consumed, 1000, steps=16)
    assert two == one
    assert [i for mb in one for i in mb] == list(range(consumed, consumed + 32))


def test_blended_dataset_index_is_independent_of_world(tmp_path, dist_group):
    """The curriculum dataset (global sample -> dataset, sample) is rebuilt identically from the
    same flags, so a resumed run with any data-parallel size reads the same global samples."""
    from megatron.config.parser import parse_args
    from megatron.config.tokenizer_flags import tokenizer_setup_from_args
    from megatron.data.builder import build_pretraining_data
    data = make_pretrain_data(tmp_path / "data")
    datasets = []
    for run in ("a", "b"):
        args = parse_args(pretrain_flags(data, tmp_path / run))
        # built from scratch each time
        config = dataclasses.replace(args.run_config.data, data_cache_path=str(tmp_path / f"cache_{run}"))
        args.tokenizer = tokenizer_setup_from_args(args).tokenizer
        datasets.append(build_pretraining_data(config, args.tokenizer).train)
    a, b = datasets
    assert len(a) == len(b)
    for i in range(0, 8 * TRAIN_ITERS):
        sa, sb = a[i], b[i]
        assert int(sa["dataset_id"]) == int(sb["dataset_id"])
        assert torch.equal(torch.as_tensor(sa["tokens"]), torch.as_tensor(sb["tokens"]))


def test_dataloader_does_not_draw_from_the_global_rng(dist_group):
    """Creating the training iterator must not advance torch's global generator: a resumed run
    creates it right after restoring the RNG state, the uninterrupted one did not, so a draw here
    shifted every later dropout mask (found by the kill/resume test with dropout on)."""
    from megatron.core import parallel_state

    from megatron.train.loader import _loader
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel()
    dataset = [{"x": torch.tensor([i])} for i in range(16)]
    loop = parse(["--seed", "1"]).run_config.loop  # micro batches of 2, no workers
    before = torch.get_rng_state()
    next(_loader(dataset, 4, loop))
    assert torch.equal(torch.get_rng_state(), before)
