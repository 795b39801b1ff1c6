"""Data provenance: which documents the samples of given training iterations came from, read from
the index the loader uses, across the phases of a run's data ledger (megatron/data/mix_ledger.py).

One record per global sample (``tools/data_provenance.py`` writes them as JSON lines)::

    {"iteration": t, "global_sample": i, "dataset": NAME, "sample": k, "epoch": e,
     "seq_length": L, "tokens": [[start, end), ...],
     "documents": [[doc_id, first_token, last_token], ...]}

``iteration`` is numbered as in the training log (iteration ``t`` is the ``t``-th optimizer step,
1-based); ``sample`` is the dataset's own sample number (its ledger position when it was drawn);
``epoch`` the epoch of the dataset that sample belongs to. For GPT data ``seq_length`` is the
sequence length it was drawn at and ``tokens`` the offsets of its input tokens in the dataset's
token stream (its documents in their one-epoch order, megatron/data/length_change.py): one range
for a sample of an epoch, several for a sample finishing an epoch after a change of the sequence
length. :func:`token_coverage` gathers them per dataset and epoch. For GPT data ``documents`` are the
``.idx`` sequences (documents, for data preprocessed one document per sequence) the sample's
``seq_length + 1`` tokens are read from, with the first and last (inclusive) token offsets in
each; for packed T0 data they are the (input, target) pairs packed, one per segment, with the
token range over the input followed by the target.
"""
from typing import Dict, Iterable, Iterator, List, Sequence, Tuple

import numpy as np

from megatron.data.mix_ledger import MixPhase
from megatron.errors import ConfigError

__all__ = ["iteration_samples", "provenance_records", "token_coverage", "coverage_lines"]


def _phase_of_iteration(phases: Sequence[MixPhase], iteration: int) -> int:
    """The phase that drew iteration ``iteration`` (1-based): the last to begin before it."""
    return max(p for p, ph in enumerate(phases) if ph.begin_iteration < iteration)


def iteration_samples(phases: Sequence[MixPhase], first: int, last: int) -> List[Tuple[int, int, int]]:
    """``[(iteration, first global sample, end global sample), ...]`` of iterations ``first`` to
    ``last`` (1-based, inclusive): each phase's iterations follow its batch schedule from the
    global sample and iteration it began at (batch sizes are functions of consumed samples)."""
    from megatron.data.mix_resume import _batch_schedule  # lazy: torch (~1 s), only for iteration_samples

    out = []
    t = first
    while t <= last:
        p = _phase_of_iteration(phases, t)
        phase = phases[p]
        stop = last if p + 1 == len(phases) else min(last, phases[p + 1].begin_iteration)
        bs = _batch_schedule(phase.batch_schedule)
        k0 = int(bs.iterations_at_samples(phase.begin))
        if int(bs.samples_at_iterations(k0)) == phase.begin:  # on the schedule's grid
            its = np.arange(t, stop + 1, dtype=np.int64)
            starts = bs.samples_at_iterations(k0 + its - 1 - phase.begin_iteration)
            ends = bs.samples_at_iterations(k0 + its - phase.begin_iteration)
            out += [(int(a), int(b), int(c)) for a, b, c in zip(its, starts, ends, strict=True)]
        else:  # a batch schedule changed at the resume point: step as the loop does
            consumed = phase.begin
            for it in range(phase.begin_iteration + 1, stop + 1):
                size = bs.batch_size_at_samples(consumed)
                if it >= t:
                    out.append((it, consumed, consumed + size))
                consumed += size
        t = stop + 1
    return out


def provenance_records(history, first: int, last: int) -> Iterator[dict]:
    """The provenance record of every global sample of iterations ``first`` to ``last`` of the
    run whose phases ``history`` (megatron/data/mix_resume.py ``MixHistory``) rebuilds."""
    phases = history.phases
    for iteration, lo, hi in iteration_samples(phases, first, last):
        for i in range(lo, hi):
            p = max(k for k, ph in enumerate(phases) if ph.begin <= i)
            dataset = history.dataset(p)
            if i >= len(dataset):
                raise ConfigError(f"iteration {iteration}: global sample {i} is past the run's "
                                  f"{len(dataset)} samples")
            d, k = dataset.locate(i)
            source = dataset.datasets[d]
            constituent = dataset.constituents[d]
            record = {"iteration": iteration, "global_sample": i, "dataset": constituent.name,
                      "sample": k}
            if hasattr(source, "token_ranges"):  # GPT data: where in its token stream
                epoch, ranges = source.token_ranges(k)
                record.update(epoch=int(epoch),
                              seq_length=int(phases[p].batch_schedule["seq_length"]),
                              tokens=ranges)
            else:
                record["epoch"] = int(source.epoch_and_position(k)[0])
            record["documents"] = source.sample_documents(k)
            yield record


def token_coverage(records: Iterable[dict]) -> Dict[str, Dict[int, dict]]:
    """What the GPT ``records`` (of :func:`provenance_records`) drew of each dataset's token
    stream, per dataset and epoch: ``{"samples": {seq_length: samples}, "tokens": input tokens
    drawn, "ranges": [[start, end), ...] (their union, merged), "repeated": [[start, end), ...]
    (ranges drawn more than once)}``. A finished epoch drawn without repeat or gap shows one
    range from 0."""
    drawn: Dict[Tuple[str, int], List[Tuple[int, int]]] = {}
    samples: Dict[Tuple[str, int], Dict[int, int]] = {}
    for r in records:
        if "tokens" not in r:
            continue
        key = (r["dataset"], int(r["epoch"]))
        drawn.setdefault(key, []).extend((int(a), int(b)) for a, b in r["tokens"])
        counts = samples.setdefault(key, {})
        counts[int(r["seq_length"])] = counts.get(int(r["seq_length"]), 0) + 1
    out: Dict[str, Dict[int, dict]] = {}
    for (name, epoch), ranges in sorted(drawn.items()):
        merged: List[List[int]] = []
        repeated: List[List[int]] = []
        for a, b in sorted(ranges):
            if merged and a < merged[-1][1]:
                repeated.append([a, min(b, merged[-1][1])])
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        out.setdefault(name, {})[epoch] = {
            "samples": samples[(name, epoch)], "tokens": int(sum(b - a for a, b in ranges)),
            "ranges": merged, "repeated": repeated}
    return out


def coverage_lines(coverage: Dict[str, Dict[int, dict]]) -> List[str]:
    """One line per dataset and epoch of :func:`token_coverage`: the ranges (or how many), the
    samples per sequence length and the repeats."""
    lines = []
    for name, epochs in coverage.items():
        for epoch, c in epochs.items():
            lengths = ", ".join(f"{n} at {L}" for L, n in sorted(c["samples"].items()))
            ranges = c["ranges"]
            where = (f"tokens [{ranges[0][0]}, {ranges[0][1]}) contiguous" if len(ranges) == 1
                     else f"{c['tokens']} tokens in {len(ranges)} ranges")
            repeats = (f"{len(c['repeated'])} ranges drawn twice" if c["repeated"]
                       else "none drawn twice")
            lines.append(f"{name} epoch {epoch}: {where} ({lengths} tokens per sample); {repeats}")
    return lines
