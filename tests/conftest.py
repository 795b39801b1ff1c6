"""Shared test set-up: fixtures (a 1-process gloo group, megatron-core's model-parallel state,
demo data, tiny tokenizers, the single-rank layout reference) and the collection order. What test
modules import lives in the helpers package (tests/helpers/; pyproject.toml puts tests/ on the
path); tests/README.md describes the layout."""

import os

import pytest

from helpers.paths import TESTS, shared_session_dir
from helpers.ports import free_port

# The test files that take longest (launch-heavy), slowest first, by their path under tests/.
# tools/run_tests.sh hands whole files to its pytest-xdist workers in collection order (--dist
# loadfile --no-loadscope-reorder); starting the long ones first keeps both workers busy to the end
# (tests/unit/test_suite_layout.py checks that each names a test file).
SLOW_FILES_FIRST = (
    "e2e/test_pipeline_parallel.py", "e2e/test_two_nodes_e2e.py", "e2e/test_compat_scripts.py",
    "e2e/test_examples.py",
    "e2e/test_parallel_layouts_e2e.py", "e2e/test_moe_e2e.py", "e2e/test_exact_resume_e2e.py",
    "e2e/test_adaptive_mixer_layouts_e2e.py", "e2e/test_adaptive_mixer_e2e.py",
    "e2e/test_context_extension_e2e.py", "e2e/test_mix_edit_e2e.py",
    "e2e/test_pretrain_e2e.py", "e2e/test_small_corpus_splits.py", "e2e/test_attention_backends_e2e.py",
    "unit/test_attention_backends.py", "e2e/test_checkpoint_safety.py", "e2e/test_curriculum_e2e.py",
    "e2e/test_run_control_e2e.py", "e2e/test_finetune_t0.py", "e2e/test_schedule_resume_e2e.py",
    "e2e/test_graceful_exit.py", "e2e/test_bad_inputs.py", "e2e/test_error_reporting_e2e.py",
    "e2e/test_cpu_comm_e2e.py", "e2e/test_merge_checkpoints.py", "e2e/test_hf_conversion_e2e.py",
    "unit/test_hf_conversion.py", "unit/test_hf_mixtral.py", "unit/test_rotary.py",
)


def pytest_collection_modifyitems(config, items):
    """Run the files of SLOW_FILES_FIRST first, in that order; the rest keep their order."""
    order = {name: i for i, name in enumerate(SLOW_FILES_FIRST)}
    items.sort(key=lambda item: order.get(os.path.relpath(item.path, TESTS), len(order)))


@pytest.fixture(scope="session")
def dist_group():
    """A 1-process gloo torch.distributed group (megatron-core's dataset builders and
    parallel_state need one outside the launcher)."""
    import torch
    if not torch.distributed.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(free_port())
        torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    yield


@pytest.fixture(scope="module")
def one_rank_model_parallel(dist_group):
    """DeepSpeed's communication wrapped around the 1-process gloo group and megatron-core's
    model-parallel state of size 1 (what GPTModel and GPTModelPipe need outside the launcher)."""
    import deepspeed
    from megatron.core import parallel_state
    os.environ.setdefault("LOCAL_RANK", "0")
    deepspeed.init_distributed(dist_backend="gloo", verbose=False)  # wraps the 1-rank gloo group
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
    yield


@pytest.fixture(scope="module")
def tp1(dist_group):
    """megatron-core's model-parallel state of size 1 (TP 1, PP 1) on the 1-process group, for the
    in-process models of the checkpoint conversion tests."""
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    yield


@pytest.fixture(scope="session")
def demo_data(tmp_path_factory):
    """A small copy of the embedded demo corpus, made once for all workers: {"web"|"code"|"math":
    .bin/.idx prefix}."""
    from tools.make_demo_data import make_demo_data
    with shared_session_dir(tmp_path_factory, "demo") as (directory, _):
        return make_demo_data(str(directory), size_mb=0.2, verbose=False)  # kept when made


@pytest.fixture(scope="session")
def tiny_tokenizers(tmp_path_factory):
    """Tiny tokenizers trained on the demo text (tools/make_tiny_tokenizers.py), once per session:
    {"hf": tokenizer directory, "sentencepiece": .model file}."""
    from tools.make_tiny_tokenizers import make_tiny_tokenizers
    return make_tiny_tokenizers(str(tmp_path_factory.mktemp("tiny_tokenizers")))


@pytest.fixture(scope="session")
def hf_tokenizer_dir(tiny_tokenizers):
    """A local Hugging Face tokenizer directory (byte-level BPE, vocab 384; <unk> 0, <s> 1,
    </s> 2 = eos, <pad> 3) for ``--tokenizer-type PretrainedFromHF --tokenizer-name-or-path``."""
    return tiny_tokenizers["hf"]


@pytest.fixture(scope="session")
def sentencepiece_model(tiny_tokenizers):
    """A sentencepiece BPE .model file (vocab 384; <unk> 0, <s> 1, </s> 2, no pad) for
    ``--tokenizer-type GPTSentencePieceTokenizer --tokenizer-model``."""
    return tiny_tokenizers["sentencepiece"]


@pytest.fixture(scope="session")
def single_rank_layout_dir(demo_data, tmp_path_factory):
    """The run directory (``metrics.jsonl``) of the layout-comparison model
    (tests/helpers/parallel.py) trained on one rank: the reference every parallel layout must
    reproduce; run once per session, for all workers."""
    from helpers.parallel import run_layout
    with shared_session_dir(tmp_path_factory, "layout_reference") as (run_dir, done):
        if not done:
            run_layout(demo_data, run_dir, num_ranks=1)
    return run_dir


@pytest.fixture(scope="session")
def single_rank_layout_records(single_rank_layout_dir):
    """Training records (``--metrics-jsonl``) of the single-rank layout reference run."""
    from helpers.parallel import train_records
    return train_records(single_rank_layout_dir)


@pytest.fixture(scope="session")
def single_rank_layout_losses(single_rank_layout_records):
    """Per-iteration losses of the single-rank layout reference run."""
    return [r["lm_loss"] for r in single_rank_layout_records]
