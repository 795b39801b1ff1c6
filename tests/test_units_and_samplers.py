"""BatchSchedule against megatron-core's rampup calculator; the resumable batch sampler."""
import pytest
from hypothesis import given, settings, strategies as st

from megatron.core.num_microbatches_calculator import RampupBatchsizeNumMicroBatchesCalculator

from megatron.data.samplers import PretrainingBatchSampler
from megatron.schedules.units import BatchSchedule


@settings(max_examples=40, deadline=None)
@given(start_steps=st.integers(1, 4), incr_steps=st.integers(1, 4), num_incr=st.integers(1, 5),
       ramp=st.integers(1, 400), mbs=st.integers(1, 2), dp=st.integers(1, 2))
def test_batch_size_matches_megatron_core(start_steps, incr_steps, num_incr, ramp, mbs, dp):
    unit = mbs * dp
    start, incr = start_steps * unit, incr_steps * unit
    gbs = start + num_incr * incr
    core = RampupBatchsizeNumMicroBatchesCalculator(
        gbs, mbs, dp, False, 0, start, incr, ramp)
    ours = BatchSchedule(gbs, (start, incr, ramp))
    consumed = 0
    table = ours.consumed_samples_table(60)
    for i in range(60):
        core.update(consumed, consistency_check=True)
        assert ours.batch_size_at_samples(consumed) == core.get_current_global_batch_size()
        assert table[i] == consumed
        consumed += core.get_current_global_batch_size()


def test_zero_rampup_samples_means_full_batch():
    assert BatchSchedule(16, (4, 4, 0)).batch_size_at_samples(0) == 16


def test_iterations_for_samples_inverts_table():
    schedule = BatchSchedule(16, (4, 4, 100))
    table = schedule.consumed_samples_table(50)
    for samples in range(1, int(table[-1])):
        it = schedule.iterations_for_samples(samples)
        assert table[it] >= samples and (it == 0 or table[it - 1] < samples)


def test_constant_batch_table_and_tokens():
    schedule = BatchSchedule(8, None, seq_length=32)
    assert list(schedule.consumed_samples_table(3)) == [0, 8, 16, 24]
    assert schedule.iterations_for_samples(17) == 3
    assert schedule.tokens(3) == 96


def global_order(total, consumed, mbs, dp):
    """Interleave the micro batches of all ranks back into one global sample sequence."""
    samplers = [iter(PretrainingBatchSampler(total, consumed, mbs, r, dp)) for r in range(dp)]
    order = []
    for batches in zip(*samplers):
        for batch in batches:
            order.extend(batch)
    return order


@pytest.mark.parametrize("dp", [1, 2, 4])
def test_global_order_independent_of_dp_and_resumable(dp):
    full = global_order(64, 0, 2, dp)
    assert full == list(range(64))
    assert global_order(64, 16, 2, dp) == full[16:]


def test_sampler_rejects_bad_input():
    with pytest.raises(ValueError, match="consumed_samples 10 >= dataset size 10"):
        PretrainingBatchSampler(10, 10, 2, 0, 1)
    with pytest.raises(ValueError, match="data_parallel_rank 2"):
        PretrainingBatchSampler(10, 0, 2, 2, 2)
