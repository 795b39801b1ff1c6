"""Shared test set-up: the repository root on sys.path, a 1-process gloo group, demo data."""

import contextlib
import fcntl
import os
import shutil
import socket
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.path.pardir))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


# The test files that take longest (launch-heavy), slowest first. tools/run_tests.sh hands whole
# files to its pytest-xdist workers in collection order (--dist loadfile --no-loadscope-reorder);
# starting the long ones first keeps both workers busy to the end.
SLOW_FILES_FIRST = (
    "test_pipeline_parallel.py", "test_compat_scripts.py", "test_examples.py",
    "test_parallel_layouts_e2e.py", "test_moe.py", "test_exact_resume.py", "test_pretrain_e2e.py",
    "test_attention_backends.py", "test_checkpoint_safety.py", "test_curriculum_e2e.py",
    "test_run_control_e2e.py", "test_finetune_t0.py", "test_schedule_resume_e2e.py",
    "test_graceful_exit.py", "test_bad_inputs.py", "test_error_reporting.py", "test_cpu_comm.py",
    "test_merge_checkpoints.py", "test_hf_conversion.py", "test_hf_mixtral.py", "test_rotary.py",
)


def pytest_collection_modifyitems(config, items):
    """Run the files of SLOW_FILES_FIRST first, in that order; the rest keep their order."""
    order = {name: i for i, name in enumerate(SLOW_FILES_FIRST)}
    items.sort(key=lambda item: order.get(item.path.name, len(order)))


def free_port() -> int:
    """A TCP port on localhost that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


@contextlib.contextmanager
def shared_session_dir(tmp_path_factory, name: str):
    """A directory ``name`` made once per test session and shared by its pytest-xdist workers
    (session fixtures are per worker): yields (directory, done), with the other workers waiting on
    a file lock meanwhile; ``done`` says an earlier holder finished it (the body writes it and then
    touches ``directory / "DONE"``; a body that raises leaves it to the next holder, on an emptied
    directory). Without xdist the directory is the session's own."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        yield tmp_path_factory.mktemp(name), False
        return
    root = tmp_path_factory.getbasetemp().parent  # pytest-N/, the workers' basetemps' parent
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        directory = root / name
        done = (directory / "DONE").exists()
        if not done:  # new, or left unfinished by a worker whose body failed
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir()
        yield directory, done
        (directory / "DONE").touch()


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
    """The run directory (``metrics.jsonl``) of the layout-comparison model (tests/parallel_helpers.py)
    trained on one rank: the reference every parallel layout must reproduce; run once per session,
    for all workers."""
    from parallel_helpers import run_layout
    with shared_session_dir(tmp_path_factory, "layout_reference") as (run_dir, done):
        if not done:
            run_layout(demo_data, run_dir, num_ranks=1)
    return run_dir


@pytest.fixture(scope="session")
def single_rank_layout_records(single_rank_layout_dir):
    """Training records (``--metrics-jsonl``) of the single-rank layout reference run."""
    from parallel_helpers import train_records
    return train_records(single_rank_layout_dir)


@pytest.fixture(scope="session")
def single_rank_layout_losses(single_rank_layout_records):
    """Per-iteration losses of the single-rank layout reference run."""
    return [r["lm_loss"] for r in single_rank_layout_records]
