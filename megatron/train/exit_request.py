"""Whether to stop after the current iteration: an exit signal, the time limit or the kill switch,
decided the same on every rank."""
import time

import torch

from megatron.config.run_config import LoopConfig
from megatron.train.run_control import kill_switch_found
from megatron.utils.rank_utils import all_reduce_small


class ExitRequest:
    """Decides, identically on every rank, whether to stop after the current iteration:
    ``--exit-signal-handler`` (SIGTERM/SIGINT received by any rank), ``--exit-duration-in-mins``
    or ``--kill-switch-path`` (the file exists on any rank)."""

    def __init__(self, loop: LoopConfig):
        self.signal_received = False
        self.deadline = None
        self.reason = ""
        self.kill_switch_path = loop.kill_switch_path
        if loop.exit_duration_in_mins is not None:
            self.deadline = time.time() + 60.0 * loop.exit_duration_in_mins
        if loop.exit_signal_handler:
            import signal

            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self._on_signal)
        self.enabled = (loop.exit_signal_handler or self.deadline is not None
                        or self.kill_switch_path is not None)

    def _on_signal(self, signum, frame):
        self.signal_received = True

    def should_exit(self) -> bool:
        """True on every rank when any rank saw a signal, the time limit has passed or any rank
        sees the kill-switch file."""
        if not self.enabled:
            return False
        flags = all_reduce_small(
            torch.tensor([float(self.signal_received),
                          float(self.deadline is not None and time.time() >= self.deadline),
                          float(kill_switch_found(self.kill_switch_path))]),
            torch.distributed.ReduceOp.MAX)
        if flags[0] > 0:
            self.reason = "exit signal received (--exit-signal-handler)"
        elif flags[1] > 0:
            self.reason = "time limit reached (--exit-duration-in-mins)"
        elif flags[2] > 0:
            self.reason = f"kill switch {self.kill_switch_path} found (--kill-switch-path)"
        return bool(flags.max() > 0)
