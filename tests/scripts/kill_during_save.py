"""pretrain_gpt.py whose ranks each SIGKILL themselves once the files of the checkpoint of
iteration ITER are written, before the tracker names it (tests/e2e/test_checkpoint_safety.py):

    deepspeed ... tests/scripts/kill_during_save.py ITER [pretrain_gpt.py flags]
"""
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import pretrain_gpt  # noqa: E402
from megatron.runtime.process_exit import run_entry_point  # noqa: E402


def kill_at(iteration: int):
    """The hook: SIGKILL this process after writing the checkpoint of ``iteration``."""
    def after_files_written(saved_iteration: int) -> None:
        if saved_iteration == iteration:
            os.kill(os.getpid(), signal.SIGKILL)
    return after_files_written


if __name__ == "__main__":
    # the launcher puts --local_rank=N first; the iteration is the first other argument
    argv = sys.argv[1:]
    position = next(i for i, a in enumerate(argv) if not a.startswith("--local_rank"))
    killed_at = int(argv.pop(position))
    run_entry_point(lambda: pretrain_gpt.main(argv, after_checkpoint_files_written=kill_at(killed_at)))
