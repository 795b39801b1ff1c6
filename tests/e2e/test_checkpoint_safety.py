"""Checkpoint safety: a kill during ``--save`` never leaves the tracker pointing at an incomplete
checkpoint (the next run resumes from the last complete one), and unusable checkpoints give one
clear ``error: ...`` line from the entry point, never a traceback.

The kill is injected deterministically through the hook ``save_checkpoint`` calls once a rank's
files are written, before the tracker update (megatron/checkpoint/engine.py):
tests/scripts/kill_during_save.py runs pretrain_gpt.py with a hook that makes every rank SIGKILL
itself at checkpoint ITER.
"""
import shutil

import pytest

from helpers.launch import read_jsonl, run_deepspeed, run_single_process

pytestmark = pytest.mark.launch

TRACKER = "latest_checkpointed_iteration.txt"
TRAIN_ITERS = 6
KILLED_AT = 4  # the save that is killed; the one before (iteration 2) is complete


def flags(demo_data, run_dir, extra=()):
    return ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2",
            "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "4",
            "--train-iters", str(TRAIN_ITERS), "--lr", "1e-3", "--seed", "5",
            "--hidden-dropout", "0", "--attention-dropout", "0",
            "--data-path", "0.6", demo_data["web"], "0.4", demo_data["code"], "--split", "98,1,1",
            "--data-cache-path", str(run_dir / "cache"), "--eval-iters", "0", "--log-interval", "1",
            "--save", str(run_dir / "ckpt"), "--save-interval", "2",
            "--metrics-jsonl", str(run_dir / "metrics.jsonl"), *extra]


@pytest.fixture(scope="module")
def killed_during_save(demo_data, tmp_path_factory):
    """A 2-rank run whose save at iteration KILLED_AT is killed before the tracker update."""
    run_dir = tmp_path_factory.mktemp("killed")
    proc = run_deepspeed("tests/scripts/kill_during_save.py",
                         [str(KILLED_AT)] + flags(demo_data, run_dir), check=False)
    assert proc.returncode != 0, proc.stdout[-3000:]
    return run_dir, read_jsonl(run_dir / "metrics.jsonl")


def test_kill_during_save_leaves_the_tracker_on_the_last_complete_checkpoint(killed_during_save):
    run_dir, records = killed_during_save
    ckpt = run_dir / "ckpt"
    assert [r["iteration"] for r in records] == list(range(1, KILLED_AT + 1))
    assert (ckpt / TRACKER).read_text().strip() == "2"
    # the killed save had written its DeepSpeed files: only the tracker update was missing
    assert any(p.name.endswith("model_states.pt") for p in (ckpt / f"iter_{KILLED_AT:07d}").iterdir())
    assert not (ckpt / "latest").exists()


def test_next_run_resumes_from_the_last_complete_checkpoint(killed_during_save, demo_data):
    run_dir, killed_records = killed_during_save
    ckpt = run_dir / "ckpt"
    work = run_dir / "resume"
    shutil.copytree(ckpt, work / "ckpt")
    resumed_flags = flags(demo_data, work, ["--load", str(work / "ckpt")])
    resumed_flags[resumed_flags.index("--data-cache-path") + 1] = str(run_dir / "cache")
    proc = run_deepspeed("pretrain_gpt.py", resumed_flags)
    assert f"resumed from --load {work / 'ckpt'} at iteration 2," in proc.stdout
    records = read_jsonl(work / "metrics.jsonl")
    assert [r["iteration"] for r in records] == list(range(3, TRAIN_ITERS + 1))
    # iterations 3..KILLED_AT repeat exactly what the killed run did
    for got, want in zip(records, killed_records[2:], strict=False):
        for key in ("consumed_samples", "lr", "lm_loss", "per_dataset_loss"):
            assert got[key] == want[key], (got["iteration"], key)
    assert (work / "ckpt" / TRACKER).read_text().strip() == str(TRAIN_ITERS)


# ------------------------------------------------------------------ unusable checkpoints
def _broken_copy(killed_during_save, tmp_path, breaker):
    run_dir, _ = killed_during_save
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    shutil.copytree(run_dir / "ckpt" / "iter_0000002", ckpt / "iter_0000002")
    (ckpt / TRACKER).write_text("2\n")
    breaker(ckpt)
    return ckpt


def _run_single_process(demo_data, run_dir, ckpt):
    """pretrain_gpt.py as a plain 1-process run (cheaper than the launcher)."""
    return run_single_process("pretrain_gpt.py", flags(demo_data, run_dir, ["--load", str(ckpt)]))


def _assert_one_clear_error(proc, expected, ranks=1):
    log = proc.stdout + proc.stderr
    assert proc.returncode == 1 or (ranks > 1 and proc.returncode != 0), (proc.returncode, log[-3000:])
    assert "Traceback" not in log, log[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error: " in line]
    if ranks == 1:
        assert len(errors) == 1 and errors[0].startswith("error: --load "), log[-3000:]
    assert expected in errors[0], errors


@pytest.mark.parametrize("case, breaker, expected", [
    ("tracker_names_missing_iteration",
     lambda c: (c / TRACKER).write_text("4\n"),
     "latest_checkpointed_iteration.txt names iteration 4 but"),
    ("tracker_garbage",
     lambda c: (c / TRACKER).write_bytes(b"\x00\x13garbage"),
     "latest_checkpointed_iteration.txt holds"),
    ("missing_model_states",
     lambda c: (c / "iter_0000002" / "mp_rank_00_model_states.pt").unlink(),
     "is incomplete (no *model_states.pt file)"),
    ("truncated_model_states",
     lambda c: (c / "iter_0000002" / "mp_rank_00_model_states.pt").write_bytes(
         (c / "iter_0000002" / "mp_rank_00_model_states.pt").read_bytes()[:1000]),
     "/iter_0000002 is corrupt or incompatible"),
])
def test_unusable_checkpoint_gives_one_error_line(case, breaker, expected, killed_during_save,
                                                  demo_data, tmp_path):
    ckpt = _broken_copy(killed_during_save, tmp_path, breaker)
    _assert_one_clear_error(_run_single_process(demo_data, tmp_path, ckpt), expected)


def test_truncated_rng_file_of_one_rank_stops_every_rank_cleanly(killed_during_save, demo_data,
                                                                 tmp_path):
    """Only rank 0's RNG file is truncated: rank 0 names it, rank 1 stops too (instead of running
    into a collective its peer has left, which ended in a gloo traceback)."""
    def truncate(ckpt):
        rng = ckpt / "iter_0000002" / "rng_state_rank0.pt"
        rng.write_bytes(rng.read_bytes()[:100])

    ckpt = _broken_copy(killed_during_save, tmp_path, truncate)
    proc = run_deepspeed("pretrain_gpt.py", flags(demo_data, tmp_path, ["--load", str(ckpt)]),
                         check=False)
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Traceback" not in log, log[-3000:]
    assert "[rank 0] error: --load" in log and "rng_state_rank0.pt is corrupt" in log, log[-3000:]
    assert "[rank 1] error: --load" in log and "another rank could not read" in log, log[-3000:]
