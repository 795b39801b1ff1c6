"""The curriculum index kernel: the compiled loops (``curriculum_index.cpp`` beside this module,
built at first use by torch.utils.cpp_extension, which caches the build in
``$TORCH_EXTENSIONS_DIR`` and locks it against concurrent builds by other ranks), their pure-Python
twins (the same loops and double arithmetic: the same index without a compiler, slowly) and
:class:`_KernelState`, the kernel's resumable state over one stage."""
import os
from typing import Any, Dict

import numpy as np

from megatron.runtime import jit_ops

KERNEL_SOURCE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                  "curriculum_index.cpp")
KERNEL_NAME = "megatron_curriculum_index"
# no FMA contraction: the Python fallback reproduces the kernel's arithmetic bit for bit
_CXXFLAGS = ("-O3", "-ffp-contract=off")
# {"fn": the built extension module, or None for the Python fallback}; loaded once per process
_KERNEL: Dict[str, Any] = {}


def _kernel_source_digest() -> str:
    """The digest of the kernel's source (its build rule: part of the index's cache key)."""
    return jit_ops.source_digest(KERNEL_SOURCE_PATH)


def _load_kernel():
    """The compiled kernel module (``build``, ``build_pl``), or None when it cannot be built (no
    compiler): then the Python loops below give the same index, slowly. Built once per
    environment; a line is printed before a build."""
    if "fn" not in _KERNEL:
        _KERNEL["fn"] = jit_ops.load_op_or_none(
            KERNEL_NAME, [KERNEL_SOURCE_PATH], list(_CXXFLAGS),
            "the curriculum index kernel (megatron/data/curriculum/curriculum_index.cpp)",
            "about 30 s")
    return _KERNEL["fn"]


def _python_kernel(i0, i1, D, seg_starts, seg_w, prenorm, lead, caps, base, counts, sd, si, out_id,
                   out_sample) -> int:
    """Same loop as the C++ kernel (fallback without a compiler)."""
    B, w, raw = sd[:D], sd[D:2 * D], sd[2 * D:]
    seg = int(np.searchsorted(seg_starts, i0, side="left"))
    S = len(seg_starts)
    for i in range(i0, i1):
        renorm = si[1] != 0
        if seg < S and seg_starts[seg] <= i:
            while seg < S and seg_starts[seg] <= i:
                seg += 1
            raw[:] = seg_w[:, seg - 1]
            renorm = True
        if renorm:
            B += w * float(i - si[0])
            active = (caps < 0) | (counts < caps)
            exhausted = not active.all()
            r = np.where(active, raw, 0.0)
            rem = False
            if not r.sum() > 0:
                if not (caps >= 0).any():
                    return -(i + 1)
                rem = True
                r = np.where(active & (caps >= 0), (caps - counts).astype(np.float64), 0.0)
                if not r.sum() > 0:
                    return -(i + 1)
            w[:] = r if (prenorm and not exhausted and not rem) else r / r.sum()
            si[0], si[1] = i, 0
        x = 1.0 if i == 0 else float(i - si[0] + lead)
        best, best_err = -1, 0.0
        for d in range(D):
            err = B[d] + w[d] * x - float(counts[d])
            if (best < 0 or err > best_err) and (w[d] > 0 or err > 0) and (caps[d] < 0 or counts[d] < caps[d]):
                best, best_err = d, err
        if best < 0:
            return -(i + 1)
        out_id[i - i0] = best
        out_sample[i - i0] = counts[best] + base[best]
        counts[best] += 1
        if caps[best] >= 0 and counts[best] == caps[best]:
            si[1] = 1
    return 0


def _python_pl_kernel(i0, i1, D, starts, a, b, base, counts, E, out_id, out_sample) -> int:
    """Same loop as the C++ ``run_pl`` (same double arithmetic, so the same index)."""
    S = len(starts)
    A, Bs = a.tolist(), b.tolist()
    El, C, base_l = [float(x) for x in E], [int(x) for x in counts], [int(x) for x in base]
    rc = 0
    try:
        for k in range(S):
            s = int(starts[k])
            e = int(starts[k + 1]) if k + 1 < S else i1
            ak = [A[d][k] for d in range(D)]
            bk = [Bs[d][k] for d in range(D)]
            for i in range(s, e):
                t = float(i - s)
                r, R = [], 0.0
                for d in range(D):
                    v = ak[d] + bk[d] * t
                    v = v if v > 0.0 else 0.0
                    r.append(v)
                    R += v
                if not R > 0.0:
                    rc = -(i + 1)
                    return rc
                inv = 1.0 / R
                best, best_err = 0, 0.0
                for d in range(D):
                    err = El[d] + r[d] * inv
                    El[d] = err
                    if d == 0 or err > best_err:
                        best, best_err = d, err
                El[best] = best_err - 1.0
                out_id[i - i0] = best
                out_sample[i - i0] = C[best] + base_l[best]
                C[best] += 1
    finally:
        E[:] = El
        counts[:] = C
    return rc


class _KernelState:
    """Resumable state of the kernel over one stage (chunks are fed in order)."""

    def __init__(self, D: int, caps: np.ndarray, base: np.ndarray, prenorm: bool,
                 lead: bool = True, all_positive: bool = False):
        self.D = D
        self.caps = np.ascontiguousarray(caps, dtype=np.int64)
        self.base = np.ascontiguousarray(base, dtype=np.int64)
        self.counts = np.zeros(D, dtype=np.int64)
        self.sd = np.zeros(3 * D, dtype=np.float64)
        self.si = np.zeros(2, dtype=np.int64)
        self.scratch = np.zeros(3 * D, dtype=np.float64)
        self.prenorm = int(bool(prenorm))
        self.lead = int(bool(lead))
        self.all_positive = int(bool(all_positive))  # static weights all > 0 (megatron's case)
        self.kernel = _load_kernel()

    def run(self, i0: int, i1: int, seg_starts: np.ndarray, seg_w: np.ndarray,
            out_id: np.ndarray, out_sample: np.ndarray) -> int:
        """Fill samples [i0, i1) (stage-local); ``seg_w`` is [D, len(seg_starts)]."""
        seg_starts = np.ascontiguousarray(seg_starts, dtype=np.int64)
        seg_w = np.ascontiguousarray(seg_w, dtype=np.float64).reshape(self.D, len(seg_starts))
        if self.kernel is None:
            return _python_kernel(i0, i1, self.D, seg_starts, seg_w, self.prenorm, self.lead, self.caps,
                                  self.base, self.counts, self.sd, self.si, out_id, out_sample)
        assert out_id.flags.c_contiguous and out_sample.flags.c_contiguous
        return int(self.kernel.build(i0, i1, self.D, seg_starts, len(seg_starts), seg_w,
                                     self.prenorm, self.lead, self.all_positive, self.caps,
                                     self.base, self.counts, self.sd, self.si, out_id, out_sample))

    def run_pl(self, i0: int, i1: int, starts: np.ndarray, a: np.ndarray, b: np.ndarray,
               out_id: np.ndarray, out_sample: np.ndarray) -> int:
        """Fill samples [i0, i1) (stage-local) from piecewise-linear raw weights: segment k starts
        at ``starts[k]`` (``starts[0] == i0``), raw weight ``a[:, k] + b[:, k] * (i - starts[k])``
        normalised per sample (no caps). ``sd[:D]`` carries the lag (target integral - count)."""
        starts = np.ascontiguousarray(starts, dtype=np.int64)
        S = len(starts)
        a = np.ascontiguousarray(a, dtype=np.float64).reshape(self.D, S)
        b = np.ascontiguousarray(b, dtype=np.float64).reshape(self.D, S)
        E = self.sd[:self.D]  # a view: updated in place
        if self.kernel is None:
            return _python_pl_kernel(i0, i1, self.D, starts, a, b, self.base, self.counts, E,
                                     out_id, out_sample)
        assert out_id.flags.c_contiguous and out_sample.flags.c_contiguous and E.flags.c_contiguous
        return int(self.kernel.build_pl(i0, i1, self.D, starts, S, a, b, self.base, self.counts, E,
                                        self.scratch, out_id, out_sample))
