"""BatchSchedule against megatron-core's rampup calculator (megatron-core 0.16.1's rule where a later
release dropped it: tests/helpers/rampup_peer.py); the resumable batch sampler."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.flags import parsed, tiny_run_flags
from helpers.rampup_peer import RECORDED_0_16_1, PeerRampupCalculator, RestatedRampupCalculator, batch_sizes
from megatron.data.samplers import PretrainingBatchSampler
from megatron.schedules.units import BatchSchedule


@settings(max_examples=40, deadline=None)
@given(start_steps=st.integers(1, 4), incr_steps=st.integers(1, 4), num_incr=st.integers(1, 5),
       ramp=st.integers(1, 400), mbs=st.integers(1, 2), dp=st.integers(1, 2))
def test_batch_size_matches_megatron_core(start_steps, incr_steps, num_incr, ramp, mbs, dp):
    unit = mbs * dp
    start, incr = start_steps * unit, incr_steps * unit
    gbs = start + num_incr * incr
    core = PeerRampupCalculator(
        gbs, mbs, dp, False, 0, start, incr, ramp)
    ours = BatchSchedule(gbs, (start, incr, ramp))
    consumed = 0
    table = ours.consumed_samples_table(60)
    for i in range(60):
        core.update(consumed, consistency_check=True)
        assert ours.batch_size_at_samples(consumed) == core.get_current_global_batch_size()
        assert table[i] == consumed
        consumed += core.get_current_global_batch_size()


def test_the_rampup_peer_is_megatron_core_0_16_1s_calculator():
    """The peer stands in for the calculator megatron-core 0.18 removed: its restatement gives the
    batch sizes recorded from megatron-core 0.16.1's class, as does the peer in use (the class
    itself where megatron-core still ships it)."""
    for case, recorded in RECORDED_0_16_1.items():
        assert batch_sizes(RestatedRampupCalculator, *case) == recorded, case
        assert batch_sizes(PeerRampupCalculator, *case) == recorded, case


@settings(max_examples=60, deadline=None)
@given(start=st.integers(1, 8), incr=st.integers(1, 8), num_incr=st.integers(1, 6),
       ramp=st.integers(1, 500))
def test_the_restated_rampup_equals_the_peer(start, incr, num_incr, ramp):
    """Any rampup: the restatement and the peer in use give the same batch sizes."""
    gbs = start + num_incr * incr
    assert batch_sizes(RestatedRampupCalculator, gbs, start, incr, ramp) == \
        batch_sizes(PeerRampupCalculator, gbs, start, incr, ramp)


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
    for batches in zip(*samplers, strict=False):
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


# ---- --train-samples -> iterations (Megatron-LM's update_train_iters) and training-set sizes ----

def megatron_lm_update_train_iters(train_samples, gbs, rampup):
    """A transcription of Megatron-LM's ``update_train_iters`` (megatron/training/training.py),
    on megatron-core's rampup calculator."""
    if rampup is None:
        return train_samples // gbs
    calc = PeerRampupCalculator(gbs, 1, 1, False, 0, *rampup)
    iterations = consumed = 0
    while consumed <= int(rampup[2]):
        calc.update(consumed, False)
        consumed += calc.get_current_global_batch_size()
        iterations += 1
    return iterations + (train_samples - consumed) // gbs


def _args(train_samples, gbs, rampup, seq=16, **extra):
    """The parsed flags of a --train-samples run (before validation, which would derive
    --train-iters with the function under test), with no --step-batch-size-schedule."""
    flags = ["--train-samples", str(train_samples), "--global-batch-size", str(gbs)]
    flags += ["--rampup-batch-size", *map(str, rampup)] if rampup else []
    flags += [arg for dest, value in extra.items() for arg in ("--" + dest.replace("_", "-"), str(value))]
    args = parsed(flags, base=tiny_run_flags(seq_length=seq, train_iters=None, data_path=None))
    args.batch_size_steps = None  # as validation parses no --step-batch-size-schedule
    return args


def test_train_samples_round_down_as_megatron_lm():
    from megatron.config.batch_flags import train_iterations_from_args
    assert train_iterations_from_args(_args(128017, 64, None)) == 2000   # not 2001
    assert train_iterations_from_args(_args(10, 4, None)) == 2
    for rampup, gbs in (((4, 4, 100), 16), ((192, 16, 9_765_625), 2048), ((256, 256, 30_000_000), 1024)):
        schedule = BatchSchedule(gbs, rampup)
        ramp_end = int(schedule._ramp_table()[-1])    # samples after the rampup loop
        for samples in (ramp_end, ramp_end + 1, ramp_end + gbs - 1, ramp_end + 5 * gbs + 3,
                        220_000_000, 220_000_017):
            if samples < ramp_end:
                continue
            ours = train_iterations_from_args(_args(samples, gbs, rampup))
            assert ours == megatron_lm_update_train_iters(samples, gbs, rampup), (rampup, samples)
            assert schedule.samples_at_iteration(ours) <= samples < schedule.samples_at_iteration(ours + 1)


def test_train_samples_inside_the_rampup_take_the_batches_that_fit():
    from megatron.config.batch_flags import train_iterations_from_args
    schedule = BatchSchedule(16, (4, 4, 100))
    table = schedule.consumed_samples_table(40)
    for samples in range(1, int(table[-1])):
        ours = train_iterations_from_args(_args(samples, 16, (4, 4, 100)))
        assert table[ours] <= samples < table[ours + 1]


def test_bloom_training_set_is_what_the_planned_iterations_consume():
    """BLOOM's flags: the training set equals the samples of the planned iterations (the sum of
    megatron-core's batch sizes over them); the old sizing (--train-samples with rounded-up
    iterations) was 1200 samples short of what the run consumes."""
    from megatron.config.batch_flags import train_iterations_from_args
    from megatron.config.run_config import data_config_from_args
    from megatron.data.builder import train_valid_test_num_samples
    args = _args(220_000_000, 2048, (192, 16, 9_765_625), seq=2048, eval_interval=1000, eval_iters=5)
    iters = args.train_iters = train_iterations_from_args(args)   # as validation sets it
    args.data_blend, args.weighted_split_groups = None, {}  # validation's, from no data flag
    calc = PeerRampupCalculator(2048, 1, 1, False, 0, 192, 16, 9_765_625)
    consumed = 0
    for _ in range(iters):
        calc.update(consumed, False)
        consumed += calc.get_current_global_batch_size()
    train, valid, test = train_valid_test_num_samples(data_config_from_args(args))
    assert train == consumed <= 220_000_000 < consumed + 2048
    assert valid == (iters // 1000 + 1) * 5 * 2048 and test == 5 * 2048
