"""GPU: train a few steps of ``pretrain_gpt.py`` with ``torch.cuda.set_sync_debug_mode("error")``
around each step, so any host synchronisation in it stops the run with its traceback.

    python benchmarks/gpu/sync_debug_steps.py [--first-checked 2] [--scope micro-batches|step]
        -- [pretrain_gpt.py flags]
    python benchmarks/gpu/sync_debug_steps.py --device cpu -- [flags]   # dry run of the wiring

One process, one GPU (rank 0 of 1). The training loop's step (``megatron.train.steps``'
``StepFunctions.train_step``: loading the micro batches, forward, backward, the gradient
reductions, the optimizer step) runs in "error" mode from iteration ``--first-checked`` on (the
first iteration builds kernels, caches and compiled graphs, which may synchronise). With
``--scope micro-batches`` (the default) DeepSpeed's optimizer step (``engine._take_model_step``:
clipping, the overflow check, the update: DeepSpeed's code, not this project's) runs in "warn"
mode instead and its synchronisations are counted and reported; ``--scope step`` checks it too.
Logging (``--log-interval``) reads losses on the host by design; keep it above the step count.
Exit status 0 when no checked code synchronised, 1 with the first offending traceback.
"""
import argparse
import os
import sys
import traceback
import warnings

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
sys.path.insert(0, ROOT)

SYNC_WARNING = "called a synchronizing CUDA operation"


class SyncCheck:
    """Wraps the loop's step functions (``megatron.train.steps.step_functions``) so that each
    training step from ``first_checked`` on runs under the sync debug mode."""

    def __init__(self, first_checked: int, scope: str, cuda: bool):
        self.first_checked, self.scope, self.cuda = first_checked, scope, cuda
        self.iteration = 0
        self.checked_steps = 0
        self.optimizer_syncs = 0

    def _mode(self, mode) -> None:
        if self.cuda:  # CPU dry run: torch without CUDA has no sync debug mode
            import torch

            torch.cuda.set_sync_debug_mode(mode)

    def _exempt_optimizer_step(self, engine) -> None:
        if self.scope != "micro-batches" or getattr(engine, "_sync_check_wrapped", False):
            return
        take_model_step = engine._take_model_step

        def warned(*args, **kwargs):
            self._mode("warn")
            try:
                with warnings.catch_warnings(record=True) as seen:
                    warnings.simplefilter("always")
                    return take_model_step(*args, **kwargs)
            finally:
                self.optimizer_syncs += sum(SYNC_WARNING in str(w.message) for w in seen)
                self._mode("error")

        engine._take_model_step = warned
        engine._sync_check_wrapped = True

    def wrap(self, steps):
        """``steps`` (a ``StepFunctions``) with its ``train_step`` checked."""
        import dataclasses

        def train_step(engine, *args, **kwargs):
            self.iteration += 1
            if self.iteration < self.first_checked:
                return steps.train_step(engine, *args, **kwargs)
            self._exempt_optimizer_step(engine)
            self._mode("error")
            try:
                result = steps.train_step(engine, *args, **kwargs)
            finally:
                self._mode(0)
            self.checked_steps += 1
            return result

        return dataclasses.replace(steps, train_step=train_step)


def _own_frames(exc: BaseException):
    """The traceback lines of this repository's code (not torch's, not DeepSpeed's)."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if f.filename.startswith(ROOT) and "/.venv/" not in f.filename
           and not f.filename.endswith("sync_debug_steps.py")]
    return [f"{os.path.relpath(f.filename, ROOT)}:{f.lineno} in {f.name}: {f.line}" for f in own]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--first-checked", type=int, default=2,
                        help="first iteration run under the sync debug mode")
    parser.add_argument("--scope", choices=["micro-batches", "step"], default="micro-batches")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("flags", nargs=argparse.REMAINDER, help="-- pretrain_gpt.py flags")
    opts = parser.parse_args(argv)
    flags = opts.flags[1:] if opts.flags[:1] == ["--"] else opts.flags
    for name, value in (("WORLD_SIZE", "1"), ("RANK", "0"), ("LOCAL_RANK", "0"),
                        ("MASTER_ADDR", "127.0.0.1"), ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(name, value)
    if "MASTER_PORT" not in os.environ:
        from megatron.runtime.ports import launch_port

        os.environ["MASTER_PORT"] = str(launch_port())
    if opts.device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from megatron.runtime.known_warnings import quiet_known_warnings

    quiet_known_warnings()
    import torch

    if opts.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("sync_debug_steps.py needs a CUDA device (--device cpu: dry run)")
    import megatron.train.loop as loop
    import pretrain_gpt

    check = SyncCheck(opts.first_checked, opts.scope, cuda=opts.device == "cuda")
    make_steps = loop.step_functions
    loop.step_functions = lambda *a, **k: check.wrap(make_steps(*a, **k))
    try:
        pretrain_gpt.main(flags)
    except RuntimeError as e:
        if SYNC_WARNING not in str(e):
            raise
        print(f"HOST SYNC in a checked step (iteration {check.iteration}, scope {opts.scope}): {e}")
        print("\n".join(_own_frames(e)) or "(no frame of this repository: see the traceback)")
        traceback.print_exc()
        return 1
    finally:
        loop.step_functions = make_steps
    if check.checked_steps == 0:
        print(f"no step was checked: --train-iters must reach --first-checked {opts.first_checked}")
        return 1
    mode = "sync debug mode 'error'" if check.cuda else "CPU dry run (no sync debug mode without CUDA)"
    print(f"no host sync in {check.checked_steps} checked steps (iterations {opts.first_checked}-"
          f"{check.iteration}, {mode}, scope {opts.scope}); DeepSpeed's optimizer step: "
          f"{check.optimizer_syncs} host syncs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
