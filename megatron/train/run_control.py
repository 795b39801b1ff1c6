"""When a run trains and when it stops: the token budget (``--train-tokens``), the kill switch
(``--kill-switch-path``), evaluation-only runs (``--eval-only``) and ``--reset-progress``.

Flag names and meanings are those of BigScience's and Microsoft's Megatron-DeepSpeed forks:

- ``--train-tokens N`` (Microsoft): training continues while the consumed tokens (consumed samples
  x ``--seq-length``) are below N, so it stops after the first iteration whose tokens reach N,
  or at ``--train-iters``/``--train-samples`` if that comes first. Microsoft's scripts set
  ``--train-samples`` to twice the budget on purpose: the budget is what stops the run. Here the
  stopping iteration is known before training (the batch schedule fixes the samples of every
  iteration), so validation (megatron/config/run_control_flags.py) shortens
  ``--train-iters``/``--train-samples`` to it and every schedule whose span defaults to "the end
  of training" ends at the budget (docs/schedules.md).
- ``--kill-switch-path FILE`` (BigScience; Microsoft calls it ``--kill-switch-file``): when FILE
  exists at start-up the run exits at once; when it appears during training, every rank saves a
  checkpoint after the same iteration and exits 0 (the check is all-reduced, see
  ``megatron.train.exit_request.ExitRequest``).
"""
import os
from typing import Optional


def kill_switch_found(path: Optional[str]) -> bool:
    """Whether the ``--kill-switch-path`` file exists on this rank (False without the flag)."""
    return path is not None and os.path.exists(path)
