"""megatron/runtime/known_warnings.py: the notices every run would print and no user can act on
are silenced, and only those."""
import logging
import warnings

from megatron.runtime.known_warnings import quiet_known_warnings


def test_gpt_model_deprecation_log_is_dropped_and_other_records_pass(caplog):
    """megatron-core 0.19 logs "GPTModel IS DEPRECATED ..." at every model build (a warning on the
    logger of megatron/core/models/gpt/gpt_model.py): dropped; any other record of that logger
    passes."""
    quiet_known_warnings()
    quiet_known_warnings()  # idempotent: one filter
    logger = logging.getLogger("megatron.core.models.gpt.gpt_model")
    assert len(logger.filters) == 1
    with caplog.at_level(logging.WARNING, logger=logger.name):
        logger.warning("GPTModel IS DEPRECATED. GPTModel is only accepting critical bug fixes")
        logger.warning("something else about GPTModel")
    assert [r.getMessage() for r in caplog.records] == ["something else about GPTModel"]


def test_single_process_rank_notice_is_ignored_and_other_warnings_shown():
    """megatron-core 0.19 warns "Could not determine rank ..." in a process without
    torch.distributed or RANK (the single-process tools): ignored; other warnings are not."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_known_warnings()
        warnings.warn("Could not determine rank from torch.distributed, RANK, or SLURM_PROCID. "
                      "Defaulting to rank 0.", stacklevel=2)
        warnings.warn("a warning that matters", stacklevel=2)
    assert [str(w.message) for w in caught] == ["a warning that matters"]


def test_building_a_gpt_model_prints_no_deprecation(caplog, one_rank_model_parallel):
    """Whatever megatron-core is installed, building the project's GPT logs no deprecation of
    GPTModel once quiet_known_warnings ran (entry points call it first)."""
    from helpers.flags import parse
    from helpers.models import gpt_model

    quiet_known_warnings()
    args = parse(["--transformer-impl", "local", "--use-cpu-initialization"])
    args.padded_vocab_size = 128
    with caplog.at_level(logging.WARNING):
        gpt_model(args)
    assert not [r for r in caplog.records if "DEPRECATED" in r.getMessage()]
