"""The blocked order of the curriculum index: O(N + D x N / 65,536) where the greedy order is
O(N x D), for blends of thousands of datasets and runs of a billion samples.

A stage is cut into blocks of at most 65,536 consecutive samples; a block also starts at every
breakpoint of a piecewise-linear weight schedule (a step, a ramp's ends), and a block is halved
until each dataset's target strays at most a quarter sample from a straight line across it
(:data:`BLOCK_ERROR`). Each block takes the normalised weights by Simpson's rule over its first,
middle and last sample and draws from each dataset a whole number of samples, its *quota*: the
target it has accumulated up to the block's end, less what it has drawn, rounded by largest
remainders (Hamilton's method) so that the quotas sum to the block's length. The fraction a
dataset is left short or ahead is carried into the next block. Within a block the datasets of
equal quotas form a group (a skewed blend of thousands of datasets has a few dozen distinct quotas:
many datasets give 1, 2 or 3 samples a block); the groups are interleaved by Tijdeman's
earliest-deadline rule (``blocked_index.cpp``) and a group gives its samples to its datasets in
turn: no dataset is a full sample from its quota's straight line. A block thus costs O(L + D),
whatever the number of datasets with a quota. Constant weights are kept as one array
(:class:`StageWeights`): blocks are split and weighted in O(D) per batch of blocks plus the
scheduled entries' share.

Guarantees (tests/unit/test_blocked_index.py checks them at every prefix):

* at block ends every dataset is within one sample of its target (the carry);
* at any sample it is within 2.25 samples of the exact per-sample target of the greedy order (the
  carry, the in-block bound of Tijdeman's rule over the groups with the turns within a group,
  under 1, and the block's straight line);
* an ``epochized_blend`` stage draws every dataset exactly its repetitions: quotas never pass a
  dataset's cap, and what a capped dataset cannot give goes to the others by their weights.

The greedy order remains available (``--data-index-order greedy``) and is what a static blend
of megatron-core gives (``BlendedDataset``'s own order); ``auto`` takes the greedy order where it is
cheap (samples x datasets <= 2**32) and the blocked order above that.
"""
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from heapq import heappop, heappush
from typing import Any, Callable, Dict, Optional

import numpy as np

from megatron.runtime import jit_ops

__all__ = ["INDEX_ORDERS", "AUTO_GREEDY_WORK", "resolve_index_order", "blocked_kernel_digest",
           "apportion", "StageWeights", "build_blocked_stage", "fill_blocks"]

INDEX_ORDERS = ("auto", "greedy", "blocked")
# auto: the greedy order while samples x datasets stays below this (about 10 s of build)
AUTO_GREEDY_WORK = 1 << 32
MAX_BLOCK = 1 << 16
BLOCK_ERROR = 0.25  # samples: how far a block's straight-line target may stray from the weights
# blocks whose quotas are planned together and filled by one kernel call (samples)
BATCH_SAMPLES = 1 << 22
PENDING_BATCHES = 3  # batches planned and not yet filled and released, at most
DEADLINE_UNITS = 1 << 12  # deadlines are compared in 1/4096 samples (blocked_index.cpp)
NOTHING_LEFT = " (the datasets still to draw all have weight zero)"  # the all-zero error's detail

KERNEL_SOURCE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "blocked_index.cpp")
KERNEL_NAME = "megatron_blocked_index"
_KERNEL: Dict[str, Any] = {}  # {"fn": the built module, or None for the Python twin}


def resolve_index_order(order: str, num_samples: int, num_datasets: int) -> str:
    """The order an index of ``num_samples`` samples over ``num_datasets`` datasets is built in:
    ``order`` itself, or for ``auto`` the greedy order when samples x datasets is at most
    :data:`AUTO_GREEDY_WORK`, the blocked order above."""
    if order not in INDEX_ORDERS:
        raise ValueError(f"--data-index-order: {order!r} is not one of {', '.join(INDEX_ORDERS)}")
    if order != "auto":
        return order
    return "greedy" if int(num_samples) * max(int(num_datasets), 1) <= AUTO_GREEDY_WORK else "blocked"


def blocked_kernel_digest() -> str:
    """The digest of the in-block kernel's source (the blocked order's rule: part of cache keys)."""
    return jit_ops.source_digest(KERNEL_SOURCE_PATH)


def _load_kernel():
    """The compiled in-block kernel (``fill``), or None without a compiler (the Python twin)."""
    if "fn" not in _KERNEL:
        _KERNEL["fn"] = jit_ops.load_op_or_none(
            KERNEL_NAME, [KERNEL_SOURCE_PATH], ["-O3"],
            "the blocked index kernel (megatron/data/curriculum/blocked_index.cpp)", "about 30 s")
    return _KERNEL["fn"]


def _groups(q: np.ndarray):
    """The groups of one block's quotas ``q`` [D]: the datasets of equal quota > 0, in the order
    of their lowest dataset; returns (each group's datasets, increasing; each group's quota, the
    sum of its datasets')."""
    members: Dict[int, list] = {}
    for d in np.flatnonzero(q > 0).tolist():
        members.setdefault(int(q[d]), []).append(d)
    groups = list(members.values())  # dicts keep insertion order: by lowest dataset
    return groups, [int(q[g[0]]) * len(g) for g in groups]


def _python_block(L: int, groups, n, gid, counts, out_id, out_sample) -> None:
    """One block of the kernel's loop in Python (the same integer releases and deadlines, so the
    same order): ``groups`` the groups' datasets with group quotas ``n``, ``L`` = sum(n) samples;
    a group gives its samples to its datasets in turn."""
    G = len(groups)
    turn = [0] * G

    def take(t):  # the dataset group t gives its next sample to
        d = groups[t][turn[t]]
        turn[t] = (turn[t] + 1) % len(groups[t])
        return d

    if G == 1:
        for j in range(L):
            d = take(0)
            out_id[j] = gid[d]
            out_sample[j] = counts[d]
            counts[d] += 1
        return
    K = 2 * G - 2
    k = [0] * G
    calendar: Dict[int, list] = {}
    ready: list = []

    def release(t):  # into the ready queue under its key (deadline << 16 | position)
        heappush(ready, (L * ((k[t] + 1) * K - 1) * DEADLINE_UNITS // (n[t] * K)) << 16 | t)

    def schedule(t, j):
        r = -(-(L * (k[t] * K + 1)) // (n[t] * K)) - 1
        if r <= j:
            release(t)
        else:
            calendar.setdefault(r, []).append(t)

    for t in range(G):
        schedule(t, -1)
    for j in range(L):
        for t in calendar.pop(j, ()):
            release(t)
        t = heappop(ready) & 0xFFFF
        d = take(t)
        out_id[j] = gid[d]
        out_sample[j] = counts[d]
        counts[d] += 1
        k[t] += 1
        if k[t] < n[t]:
            schedule(t, j)


def _python_fill(lens, quotas, gid, counts, out_id, out_sample) -> None:
    """The kernel's loop in Python, block by block."""
    o = 0
    for b, L in enumerate(int(x) for x in lens):
        groups, n = _groups(quotas[b])
        _python_block(L, groups, n, gid, counts, out_id[o:o + L], out_sample[o:o + L])
        o += L


def fill_blocks(lens: np.ndarray, quotas: np.ndarray, gid: np.ndarray, counts: np.ndarray,
                out_id: np.ndarray, out_sample: np.ndarray, use_kernel: bool = True) -> None:
    """Order the samples of consecutive blocks (lengths ``lens``, samples) from their quotas
    (``quotas[b, d]``: dataset ``d``'s samples in block ``b``): ``out_id`` gets ``gid[d]``,
    ``out_sample`` dataset ``d``'s next sample number ``counts[d]`` (advanced in place)."""
    lens = np.ascontiguousarray(lens, dtype=np.int64)
    quotas = np.ascontiguousarray(quotas, dtype=np.int64)
    gid = np.ascontiguousarray(gid, dtype=np.int64)
    kernel = _load_kernel() if use_kernel else None
    if kernel is None:
        _python_fill(lens, quotas, gid, counts, out_id, out_sample)
        return
    assert counts.dtype == np.int64 and counts.flags.c_contiguous
    assert out_id.flags.c_contiguous and out_sample.flags.c_contiguous
    kernel.fill(len(lens), quotas.shape[1], lens, quotas, gid, counts, out_id, out_sample)


def _smallest(key: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` smallest entries of ``key`` (ties: the lowest indices), as the first
    ``k`` of a stable argsort, in O(len(key)) (a partition, not a sort)."""
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    if k >= len(key):
        return np.arange(len(key))
    kth = np.partition(key, k - 1)[k - 1]
    below = np.flatnonzero(key < kth)
    return np.concatenate([below, np.flatnonzero(key == kth)[:k - len(below)]])


def apportion(need: np.ndarray, total: int) -> np.ndarray:
    """Whole samples per dataset summing to ``total`` from real-valued ``need`` (summing to about
    ``total``): each gets ``floor(need)`` (none below 0), and the samples left go one each to the
    largest remainders (ties: the lowest dataset); an excess (negative needs) is taken back one
    each from the smallest remainders of datasets that got some."""
    n = np.maximum(np.floor(need), 0.0).astype(np.int64)
    left = int(total) - int(n.sum())
    if left > 0:
        n[_smallest(n - need, left)] += 1
    elif left < 0:
        n[_smallest(np.where(n > 0, need - n, np.inf), -left)] -= 1
    return n


@dataclass(frozen=True)
class StageWeights:
    """A stage's raw (unnormalised) weights, split so that a stage of thousands of constant
    entries costs O(D) per batch of blocks, not O(D x blocks): ``static`` [D], each entry's
    weight where it is constant (0 where it follows a schedule); ``dynamic`` [k], the positions of
    the entries that follow a schedule; ``at(positions)`` their raw weights [k, n] at stage-local
    samples."""

    static: np.ndarray
    dynamic: np.ndarray
    at: Callable[[np.ndarray], np.ndarray]


def _straightness(f0: np.ndarray, fm: np.ndarray, f1: np.ndarray) -> np.ndarray:
    """How far (in units of ``f``) the integral of a curve through ``f0``, ``fm``, ``f1`` (its
    first, middle and last values over a block) may stray from a straight line, per block:
    ``|f1 - f0| / 8 + |fm - (f0 + f1) / 2|``."""
    return np.abs(f1 - f0) / 8 + np.abs(fm - (f0 + f1) / 2)


def _split_blocks(starts: np.ndarray, ends: np.ndarray, weights: StageWeights,
                  zero_error: Callable[[int, str], None]):
    """Blocks ``[starts, ends)`` halved until each is one sample or its weights are close to
    straight: ``L x max_d(|w_last - w_first| / 8 + |w_mid - (w_first + w_last) / 2|)`` at most
    :data:`BLOCK_ERROR` samples (the most a dataset's target strays from the block's straight
    line), ``w`` the normalised weights at the block's first, middle and last sample. A constant
    entry's normalised weight is its raw weight r_d over the sum S, so the constant entries'
    worst is ``max_d(r_d)`` times that of ``1 / S``: O(D) however many blocks. Returns the blocks,
    sorted, and their weights by Simpson's rule on the normalised weights at those three samples,
    as (the Simpson value of ``1 / S`` [blocks], which a constant entry's weight multiplies; the
    dynamic entries' weights [k, blocks])."""
    static_sum, static_max = float(weights.static.sum()), float(weights.static.max(initial=0.0))
    done_s, done_e, done_inv, done_dyn = [], [], [], []
    s, e = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
    while len(s):
        n = len(s)
        mid = (s + e - 1) // 2
        dyn = (weights.at(np.concatenate([s, mid, e - 1])) if len(weights.dynamic)
               else np.zeros((0, 3 * n)))  # [k, 3n]
        sums = static_sum + dyn.sum(axis=0)
        inv = np.divide(1.0, sums, out=np.zeros_like(sums), where=sums > 0)
        dyn = dyn * inv
        i0, im, i1 = inv[:n], inv[n:2 * n], inv[2 * n:]
        w0, wm, w1 = dyn[:, :n], dyn[:, n:2 * n], dyn[:, 2 * n:]
        zero = ~(sums.reshape(3, n) > 0).all(axis=0)
        length = e - s
        err = np.maximum(static_max * _straightness(i0, im, i1),
                         _straightness(w0, wm, w1).max(axis=0, initial=0.0)) * length
        split = (zero | (err > BLOCK_ERROR)) & (length > 1)
        bad = zero & ~split
        if bad.any():
            zero_error(int(s[bad].min()), "")
        keep = ~split
        done_s.append(s[keep])
        done_e.append(e[keep])
        done_inv.append((i0[keep] + 4 * im[keep] + i1[keep]) / 6)
        done_dyn.append((w0[:, keep] + 4 * wm[:, keep] + w1[:, keep]) / 6)
        half = s[split] + length[split] // 2
        s, e = np.concatenate([s[split], half]), np.concatenate([half, e[split]])
    s, e = np.concatenate(done_s), np.concatenate(done_e)
    inv, dyn = np.concatenate(done_inv), np.concatenate(done_dyn, axis=1)
    order = np.argsort(s, kind="stable")
    return s[order], e[order], inv[order], dyn[:, order]


def _block_starts(length: int, size: int, cuts: np.ndarray) -> np.ndarray:
    grid = np.arange(0, length, size, dtype=np.int64)
    cuts = np.asarray(cuts, dtype=np.int64)
    return np.unique(np.concatenate([grid, cuts[(cuts > 0) & (cuts < length)]]))


def build_blocked_stage(length: int, weights: StageWeights, cuts: np.ndarray, caps: np.ndarray,
                        counts: np.ndarray, gid: np.ndarray, out_id: np.ndarray, out_sample: np.ndarray,
                        zero_error: Callable[[int, str], None], use_kernel: bool = True,
                        written: Optional[Callable[[int, int], None]] = None) -> np.ndarray:
    """Fill one stage's ``length`` samples (``out_id``/``out_sample``, stage-local) in the blocked
    order (module docstring). ``weights``: the stage's raw weights (:class:`StageWeights`, at
    stage-local samples); ``cuts``: stage-local samples where a block must start; ``caps``: each
    dataset's samples to give (-1: no cap); ``counts``: each dataset's next sample number
    (advanced in place); ``gid``: the id written for each dataset; ``zero_error(j, detail)`` raises
    for sample ``j`` where nothing can be drawn; ``written(lo, hi)`` is told each filled range.
    Returns the samples drawn per dataset."""
    D = len(gid)
    caps = np.asarray(caps, dtype=np.int64)
    capped = caps >= 0
    drawn = np.zeros(D, dtype=np.int64)
    coarse = _block_starts(length, MAX_BLOCK, cuts)
    coarse_end = np.append(coarse[1:], length)
    carry = np.zeros(D, dtype=np.float64)
    start_counts = counts.copy()

    def run(s, e, quotas, c):
        lo, hi = int(s[0]), int(e[-1])
        fill_blocks(e - s, quotas, gid, c, out_id[lo:hi], out_sample[lo:hi], use_kernel)
        return lo, hi

    def finish(future):
        lo, hi = future.result()
        if written is not None:
            written(lo, hi)

    # batches are independent (each starts from its own counts): both cores fill them while this
    # thread plans the next one's quotas, at most PENDING_BATCHES ahead (their quotas in memory,
    # their pages not yet released)
    with ThreadPoolExecutor(max_workers=2) as pool:
        pending: list = []
        lo_block = 0
        while lo_block < len(coarse):
            hi_block = int(np.searchsorted(coarse, coarse[lo_block] + BATCH_SAMPLES, side="left"))
            hi_block = max(hi_block, lo_block + 1)
            s, e, inv, dyn = _split_blocks(coarse[lo_block:hi_block], coarse_end[lo_block:hi_block],
                                           weights, zero_error)
            if capped.any():
                full = weights.static[:, None] * inv[None, :]
                full[weights.dynamic] = dyn
                quotas, carry = _capped_quotas(s, e, full, carry, caps, drawn, zero_error)
            else:
                quotas, carry = _quotas(s, e, weights, inv, dyn, carry, zero_error)
            drawn += quotas.sum(axis=0)
            pending.append(pool.submit(run, s, e, quotas, start_counts.copy()))
            start_counts += quotas.sum(axis=0)
            lo_block = hi_block
            while len(pending) > PENDING_BATCHES:
                finish(pending.pop(0))
        for future in pending:
            finish(future)
    counts[:] = start_counts
    return drawn


def _quotas(s: np.ndarray, e: np.ndarray, weights: StageWeights, inv: np.ndarray, dyn: np.ndarray,
            carry: np.ndarray, zero_error: Callable[[int, str], None]):
    """The quotas [blocks, D] (samples) of the blocks ``[s, e)`` (weights from
    :func:`_split_blocks`: ``inv`` [blocks], ``dyn`` [k, blocks]) and the fractions of a sample
    carried in (``carry`` [D]), and the carry out: each block's normalised weights x its length
    plus the carry, apportioned (:func:`apportion`)."""
    sums = float(weights.static.sum()) * inv + dyn.sum(axis=0)  # 1, but for rounding
    zero = np.flatnonzero(~(sums > 0))
    if len(zero):
        zero_error(int(s[zero[0]]), NOTHING_LEFT)
    scale = (e - s) / sums  # samples per unit of normalised weight, per block
    # [blocks, D], each row a block's target in samples
    targets = np.multiply.outer(inv * scale, weights.static)
    if len(weights.dynamic):
        targets[:, weights.dynamic] = (dyn * scale).T
    quotas = np.empty(targets.shape, dtype=np.int64)
    for b in range(len(s)):
        need = carry + targets[b]
        quotas[b] = n = apportion(need, int(e[b] - s[b]))
        carry = need - n
    return quotas, carry


def _capped_quotas(s, e, weights, carry, caps, drawn, zero_error):
    """:func:`_quotas` for a stage with caps (``caps`` [D], -1: none; ``drawn`` [D]: the samples
    drawn before the blocks, advanced in place): a dataset that has given its cap drops out (its
    weight is zero, the others renormalised, its carry dropped), and a quota never passes what a
    dataset has left (:func:`_respect_caps`)."""
    D = len(caps)
    capped = caps >= 0
    drawn = drawn.copy()
    quotas = np.zeros((len(s), D), dtype=np.int64)
    for b in range(len(s)):
        L = int(e[b] - s[b])
        active = ~capped | (drawn < caps)
        w = np.where(active, weights[:, b], 0.0)
        total = w.sum()
        if not total > 0:
            zero_error(int(s[b]), NOTHING_LEFT)
        w = w / total
        need = carry + w * L
        n = apportion(need, L)
        n = _respect_caps(n, w, caps - drawn, capped, L, int(s[b]), zero_error)
        carry = need - n
        carry[capped & (drawn + n >= caps)] = 0.0
        quotas[b] = n
        drawn += n
    return quotas, carry


def _respect_caps(n: np.ndarray, w: np.ndarray, remaining: np.ndarray,
                  capped: np.ndarray, L: int, at: int, zero_error) -> np.ndarray:
    """Quotas ``n`` of one block clipped to what each capped dataset has left; the samples that
    frees go to the datasets that still have room, by their weights (raises through
    ``zero_error`` when those all have weight zero)."""
    room = np.where(capped, remaining, np.iinfo(np.int64).max)
    n = np.minimum(n, room)
    short = L - int(n.sum())
    while short > 0:
        open_ = n < room
        share = np.where(open_, w, 0.0)
        if not share.sum() > 0:
            zero_error(at, NOTHING_LEFT)
        extra = apportion(share / share.sum() * short, short)
        n = np.minimum(n + extra, room)
        short = L - int(n.sum())
    return n
