"""DeepSpeed-Ulysses sequence parallelism (--ds-sequence-parallel-size) through the launcher: the
model at SP 2 against the whole sequence on one rank (tests/scripts/ulysses_model_check.py, 2 CPU
ranks) for RoPE, YaRN, ALiBi, packed prefix-LM batches, query groups and recompute. The slicing, the
heads and the refused layouts in process: tests/unit/test_ulysses.py."""
import json

import pytest

from helpers.launch import run_deepspeed

pytestmark = pytest.mark.launch


# ------------------------------------------------------------------ the model, 2 ranks
def test_model_at_sp2_equals_the_whole_sequence_on_one_rank(tmp_path):
    """Loss, per-sample losses and gradients (summed over the group, as DeepSpeed's reduction
    does) of the SP 2 model equal the whole-sequence model's for RoPE with packed prefix-LM
    segments crossing the shard boundary, ALiBi (each rank holding the slopes of its heads),
    grouped-query attention and selective recompute."""
    run_deepspeed("tests/scripts/ulysses_model_check.py", [str(tmp_path)], num_ranks=2)
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    from megatron.model.alibi import alibi_slope_list

    for record in records:
        for name in ("rope_packed_prefix", "alibi_packed_prefix", "rope_gqa_causal",
                     "learned_causal_selective_recompute", "yarn_packed_prefix"):
            case = record[name]
            assert case["loss"] == pytest.approx(case["reference_loss"], rel=1e-6), name
            assert case["per_sample"] == pytest.approx(case["reference_per_sample"], rel=1e-6), name
            assert case["grad_max_diff"] <= 1e-5 * case["grad_max"], (name, case)
    slopes = alibi_slope_list(4)
    assert records[0]["alibi_packed_prefix"]["alibi_slopes"] == slopes[:2]
    assert records[1]["alibi_packed_prefix"]["alibi_slopes"] == slopes[2:]
