"""The adaptive mixer in the training loop (issue 46; a blend file's ``train: {blend: [...],
mixer: {...}}``).

Every micro batch's per-dataset losses go to the interval's sums, kept on the device in fixed point
(megatron/train/mixer_sums.py: exact, so the same whatever the order, the layout or where a
checkpoint cut the interval) and reduced over the model replicas only when read: at an update and
before a checkpoint. At every iteration that is a multiple of ``interval`` the policy
(megatron/data/mixer_policies.py) turns the interval's mean losses, the samples each dataset drew
in it and what each has left in its epoch into the next weights, and the training mix appends a
phase with those static weights from the first global sample not yet trained on, every dataset
continuing at its ledger position (megatron/data/mix_resume.py
``TrainMix.append_mixer_segment``). The loop then reads on from that sample with no batch of the
old phase (megatron/train/mixer_loader.py with loader workers, else a fresh loader). The phase
records the update (iteration, inputs,
weights, the policy's state) and the checkpoint's data record the interval in progress (its
sums), so a resume rebuilds the same phases and makes the same next update, bit for bit: the
samples drawn are a pure function of the seed, the iteration and the recorded weights.

With ``target: loss_weight`` (issue 46 item 2) an update appends no phase: the sampling stays the
blend's, and the policy's weights become the datasets' loss weights
(megatron/data/mixer_loss_weights.py) from the next iteration on. The weights in force, the
policy's state and the updates made are then kept with the interval in progress in the
checkpoint's data record (``MixRecord.mixer``), so a resume anywhere continues them bit for bit.
"""
import json
import math
from typing import Any, Dict, List, Optional

import numpy as np

from megatron.data.blend_config import MixerConfig
from megatron.data.mix_resume import TrainMix, batch_schedule_of, blend_file_phase
from megatron.data.mixer_loss_weights import objective_loss_weights
from megatron.data.mixer_policies import MixerInputs, initial_state, update_weights
from megatron.errors import ConfigError
from megatron.train.mixer_sums import SCALE_BITS, MixerLossSums
from megatron.utils.rank_utils import print_rank_0

__all__ = ["LoopMixer", "TeeStats", "loop_mixer"]


class TeeStats:
    """Hands each micro batch's losses to several loss accumulators (the log interval's and the
    mixer's iteration)."""

    def __init__(self, *stats):
        self.stats = stats

    def add_micro_batch(self, *args, **kwargs) -> None:
        for s in self.stats:
            s.add_micro_batch(*args, **kwargs)


def _plain(values) -> List[float]:
    return [float(x) for x in values]


def _fixed_sums(progress: Dict[str, Any], key: str) -> np.ndarray:
    """The interval's fixed-point sums ``key`` of a checkpoint's ``progress`` (int64; a record
    written before they were kept in fixed point holds floats, rounded here to the unit)."""
    if progress.get("scale_bits") == SCALE_BITS:
        return np.asarray([int(x) for x in progress[key]], dtype=np.int64)
    return np.asarray([round(float(x) * 2 ** SCALE_BITS) for x in progress[key]], dtype=np.int64)


class LoopMixer:
    """The mixer of one run over ``mix`` (its blend's ``config``), resuming at ``iteration``
    from the mix's recorded segments and interval in progress. ``static_loss_weights``: the
    datasets' own loss weights (``TrainData.loss_weights``, None for all 1), which the weights of
    a ``target: loss_weight`` mixer multiply. The loop's micro batches go to :attr:`pending`."""

    def __init__(self, mix: TrainMix, config: MixerConfig, iteration: int, consumed: int,
                 static_loss_weights: Optional[List[float]] = None):
        self.mix, self.config = mix, config
        self.pending = MixerLossSums(len(mix.dataset.constituents))
        self.static_loss_weights = static_loss_weights
        k = len(mix.dataset.constituents)
        segment = mix.mixer_segment()
        progress = mix.mixer_progress
        self.start = blend_file_phase(mix.phases).static_weights()
        # target loss_weight: the loss weights in force (None: the static ones) and the updates
        self.loss_weights: Optional[List[float]] = None
        self.updates: List[Dict[str, Any]] = []
        if self.on_loss_weights and progress is not None and "state" in progress:
            self.state = json.loads(json.dumps(progress["state"]))  # no phases: kept here
            self.loss_weights = progress.get("loss_weights")
            self.updates = json.loads(json.dumps(progress.get("updates", [])))
        elif segment is not None:
            self.state = json.loads(json.dumps(segment["state"]))
        else:
            self.state = initial_state(config, self.start)
        if progress is not None:
            self.since = int(progress["since"])
            self.sums, self.counts = _fixed_sums(progress, "sums"), _fixed_sums(progress, "counts")
            self.drawn = np.asarray(progress["drawn"], dtype=np.int64)
        else:  # a fresh run, or the mixer restarted (--override-data-mix)
            self.since = int(iteration)
            self.sums = np.zeros(k, dtype=np.int64)  # units of 2**-SCALE_BITS
            self.counts = np.zeros(k, dtype=np.int64)
            self.drawn = np.asarray(mix.dataset.drawn_before(consumed), dtype=np.int64)
        if len(self.sums) != k:
            raise ConfigError(f"data_mix.json: the mixer's interval in progress has {len(self.sums)} "
                              f"datasets, the training mix {k}")
        self._save_progress()

    @property
    def on_loss_weights(self) -> bool:
        """Whether the policy's weights move the datasets' loss weights (``target:
        loss_weight``), not the sampling."""
        return self.config.target == "loss_weight"

    def objective_weights(self) -> Optional[List[float]]:
        """The datasets' loss weights in force (unitless multipliers of their tokens' loss mask,
        in ``dataset_id`` order): the mixer's under ``target: loss_weight`` once it has updated,
        else the static ones (None: all 1)."""
        return self.loss_weights if self.loss_weights is not None else self.static_loss_weights

    def _save_progress(self) -> None:
        progress: Dict[str, Any] = {"since": self.since, "scale_bits": SCALE_BITS,
                                    "sums": [int(x) for x in self.sums],
                                    "counts": [int(x) for x in self.counts],
                                    "drawn": [int(x) for x in self.drawn]}
        if self.on_loss_weights:  # no phases: the state and the weights in force are kept here
            progress.update(state=self.state, updates=list(self.updates),
                            loss_weights=None if self.loss_weights is None else list(self.loss_weights))
        self.mix.mixer_progress = progress

    def fold(self) -> None:
        """Add the sums :attr:`pending` holds (over the replicas: call on every rank) to the
        interval's, which the checkpoint's data record keeps: before a checkpoint is written."""
        sums, counts = self.pending.take()
        self.sums, self.counts = self.sums + sums, self.counts + counts
        self._save_progress()

    def end_iteration(self, iteration: int, consumed: int) -> bool:
        """After iteration ``iteration`` (``consumed`` global samples drawn): within an interval,
        nothing (its losses stay on the device, in :attr:`pending`); at its end, read the
        interval's global per-dataset losses, update the weights and append their phase
        (``target: loss_weight``: make them the loss weights in force from the next iteration,
        :meth:`objective_weights`). Call on every rank. Returns True when the training dataset
        changed (the loop then starts a new loader at ``consumed``)."""
        dataset = self.mix.dataset
        if iteration % self.config.interval != 0 or consumed >= len(dataset):
            return False  # within an interval, or nothing left to draw
        self.fold()
        now = np.asarray(dataset.drawn_before(consumed), dtype=np.int64)
        drawn = now - self.drawn
        losses = [int(s) / int(c) if c > 0 else math.nan  # the exact quotient, rounded once
                  for s, c in zip(self.sums, self.counts, strict=True)]
        remaining = [int(c.samples_per_epoch - n % c.samples_per_epoch) if c.samples_per_epoch else -1
                     for c, n in zip(dataset.constituents, now, strict=True)]
        schedule = batch_schedule_of(self.mix.phases[-1])
        end = min(int(iteration) + self.config.interval,
                  schedule.iterations_for_samples(len(dataset)))
        inputs = MixerInputs(tuple(losses), tuple(int(x) for x in drawn), tuple(remaining),
                             int(iteration), total=tuple(int(x) for x in now),
                             per_epoch=tuple(c.samples_per_epoch for c in dataset.constituents),
                             next_samples=max(int(schedule.samples_at_iteration(end)) - int(consumed), 0))
        weights, state = update_weights(self.config, self.state, inputs)
        self.state = json.loads(json.dumps(state))
        segment: Dict[str, Any] = {
            "iteration": int(iteration), "policy": self.config.policy,
            "losses": [None if math.isnan(x) else x for x in losses],
            "drawn": list(inputs.drawn), "remaining": remaining, "weights": _plain(weights),
            "state": self.state}
        self.since, self.drawn = int(iteration), now
        self.sums, self.counts = np.zeros_like(self.sums), np.zeros_like(self.counts)  # int64
        if self.on_loss_weights:
            self._set_loss_weights(weights, segment, losses)
            return False  # the data stays the static blend's
        if self.state.get("fallback"):  # the cap on repetitions changed the policy's weights
            segment["fallback"] = [dict(f, dataset=dataset.names[f["dataset"]])
                                   for f in self.state["fallback"]]
            print_rank_0(f"mixer {self.config.policy} at iteration {iteration}: " + "; ".join(
                f"{f['dataset']} {f['weight']:.4f} -> {f['capped']:.4f} ({f['reason']})"
                for f in segment["fallback"]))
        self.mix.append_mixer_segment(weights, consumed, iteration, segment)
        names = dataset.names
        print_rank_0(f"mixer {self.config.policy} at iteration {iteration}: the weights from "
                     f"global sample {consumed} are " + ", ".join(
                         f"{n} {w:.4f} (loss {'n/a' if math.isnan(x) else f'{x:.4f}'})"
                         for n, w, x in zip(names, weights, losses, strict=True)))
        self._save_progress()
        return True

    def _set_loss_weights(self, weights: List[float], segment: Dict[str, Any],
                          losses: List[float]) -> None:
        """Make the policy's ``weights`` the loss weights from the next iteration on, recorded
        (``segment`` without the state, which the progress keeps once) and printed."""
        self.loss_weights = objective_loss_weights(weights, self.start, self.static_loss_weights)
        record = {k: v for k, v in segment.items() if k != "state"}
        self.updates.append(dict(record, loss_weights=list(self.loss_weights)))
        self._save_progress()
        print_rank_0(f"mixer {self.config.policy} at iteration {segment['iteration']}: the loss "
                     f"weights from iteration {segment['iteration'] + 1} are " + ", ".join(
                         f"{n} {lw:.4f} (weight {w:.4f}, loss "
                         f"{'n/a' if math.isnan(x) else f'{x:.4f}'})"
                         for n, lw, w, x in zip(self.mix.dataset.names, self.loss_weights,
                                                weights, losses, strict=True)))


def loop_mixer(data, iteration: int, consumed: int) -> Optional[LoopMixer]:
    """The mixer of the run's training ``data`` (megatron/data/train_data.py ``TrainData``), or
    None when its blend has none."""
    mix = getattr(data, "mix", None)
    if mix is None or not mix.phases:
        return None
    config = mix.dataset.index.blend.mixer
    if config is None:
        return None
    if data.train is not mix.dataset:
        raise ConfigError(f"{config.where}: the adaptive mixer needs the training set to be the "
                          "blend's own (not a wrapped one)")
    return LoopMixer(mix, config, iteration, consumed, getattr(data, "loss_weights", None))

