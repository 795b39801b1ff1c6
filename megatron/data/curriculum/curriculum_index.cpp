// The curriculum blending kernel of megatron/data/curriculum.py: global sample index ->
// (dataset id, dataset sample index) under time-varying weights. Built at first use with
// torch.utils.cpp_extension.load (cached in $TORCH_EXTENSIONS_DIR); curriculum.py keeps a Python
// version of both loops (_python_kernel, _python_pl_kernel) that gives the identical index.
// Compiled with -ffp-contract=off: no FMA contraction, so both versions round identically.
// The arrays come from numpy, C-contiguous with the dtypes curriculum.py gives them.
#include <cstdint>
#include <cstring>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

namespace py = pybind11;

namespace {

// seg_w: [D, S] (dataset-major: weight of dataset d in segment k at d * S + k)
// sd: [0:D) B (target integral at s), [D:2D) w (normalised), [2D:3D) raw weights of the segment
// si: [0] s, [1] renormalise before the next sample (a dataset was exhausted)
template <typename TI, typename TS>
int64_t run(int64_t i0, int64_t i1, int32_t D, const int64_t* seg_starts, int64_t S,
                   const double* seg_w, int32_t prenorm, int32_t lead, int32_t all_positive,
                   const int64_t* caps, const int64_t* base, int64_t* counts, double* sd, int64_t* si, TI* out_id, TS* out_sample) {
  double* B = sd; double* w = sd + D; double* raw = sd + 2 * D;
  bool fast = prenorm != 0;
  for (int32_t d = 0; d < D; ++d) fast = fast && caps[d] < 0;
  // lead: the deficits T_d(i+1) - c_d(i) sum to 1, so the largest is > 0 and thus eligible
  const bool plain = fast && (lead != 0 || all_positive != 0);
  int64_t seg = 0;
  while (seg < S && seg_starts[seg] < i0) { ++seg; }
  for (int64_t i = i0; i < i1; ++i) {
    bool renorm = si[1] != 0;
    if (fast && seg < S && seg_starts[seg] == i) {
      // no caps, weights normalised by the caller: move the integral on, take the new weights
      const double* row = seg_w + seg;
      double x0 = (double)(i - si[0]);
      for (int32_t d = 0; d < D; ++d) { B[d] += w[d] * x0; w[d] = row[d * S]; }
      si[0] = i; ++seg;
      renorm = false;
    } else if (seg < S && seg_starts[seg] <= i) {
      while (seg < S && seg_starts[seg] <= i) { ++seg; }
      const double* row = seg_w + (seg - 1);
      for (int32_t d = 0; d < D; ++d) raw[d] = row[d * S];
      renorm = true;
    }
    if (renorm) {
      double x = (double)(i - si[0]);
      double sum = 0.0;
      bool exhausted = false;
      for (int32_t d = 0; d < D; ++d) {
        B[d] += w[d] * x;
        bool active = caps[d] < 0 || counts[d] < caps[d];
        exhausted |= !active;
        sum += active ? raw[d] : 0.0;
      }
      bool rem = false;
      if (!(sum > 0.0)) {
        bool any_cap = false;
        for (int32_t d = 0; d < D; ++d) any_cap |= caps[d] >= 0;
        if (!any_cap) return -(i + 1);
        rem = true; sum = 0.0;
        for (int32_t d = 0; d < D; ++d)
          if (caps[d] >= 0 && counts[d] < caps[d]) sum += (double)(caps[d] - counts[d]);
        if (!(sum > 0.0)) return -(i + 1);
      }
      for (int32_t d = 0; d < D; ++d) {
        bool active = caps[d] < 0 || counts[d] < caps[d];
        double r = rem ? ((active && caps[d] >= 0) ? (double)(caps[d] - counts[d]) : 0.0)
                       : (active ? raw[d] : 0.0);
        w[d] = (prenorm && !exhausted && !rem) ? r : r / sum;
      }
      si[0] = i; si[1] = 0;
    }
    double x = (i == 0) ? 1.0 : (double)(i - si[0] + lead);
    if (lead && i == 0) x = 1.0;
    int32_t best = -1;
    double best_err = 0.0;
    if (plain) {
      // no caps and the largest deficit is positive (lead) or every weight is positive: the
      // first largest deficit is always eligible (megatron-core's loop)
      best = 0;
      best_err = B[0] + w[0] * x - (double)counts[0];
      for (int32_t d = 1; d < D; ++d) {
        double err = B[d] + w[d] * x - (double)counts[d];
        if (err > best_err) { best = d; best_err = err; }
      }
    } else {
      for (int32_t d = 0; d < D; ++d) {
        double err = B[d] + w[d] * x - (double)counts[d];
        if ((best < 0 || err > best_err) && (w[d] > 0.0 || err > 0.0)
            && (caps[d] < 0 || counts[d] < caps[d])) { best = d; best_err = err; }
      }
    }
    if (best < 0) return -(i + 1);
    out_id[i - i0] = (TI)best;
    out_sample[i - i0] = (TS)(counts[best] + base[best]);
    counts[best] += 1;
    if (caps[best] >= 0 && counts[best] == caps[best]) si[1] = 1;
  }
  return 0;
}
// Piecewise-linear raw weights, no caps (the "lead" rule): segment k covers [starts[k],
// starts[k + 1]) (the last one up to i1; starts[0] == i0) and the raw weight of dataset d at sample
// i of it is max(a[d * S + k] + b[d * S + k] * (i - starts[k]), 0), normalised per sample: the
// target integral is the exact per-sample sum. E (carried between chunks) is the lag T_d - c_d,
// kept directly (small magnitude: no precision lost as T grows). scratch: [3D] doubles.
template <typename TI, typename TS>
int64_t run_pl(int64_t i0, int64_t i1, int32_t D, const int64_t* starts, int64_t S,
                      const double* a, const double* b, const int64_t* base, int64_t* counts,
                      double* E, double* scratch, TI* out_id, TS* out_sample) {
  double* ak = scratch; double* bk = scratch + D; double* r = scratch + 2 * D;
  for (int64_t k = 0; k < S; ++k) {
    const int64_t s = starts[k];
    const int64_t e = (k + 1 < S) ? starts[k + 1] : i1;
    for (int32_t d = 0; d < D; ++d) { ak[d] = a[(int64_t)d * S + k]; bk[d] = b[(int64_t)d * S + k]; }
    for (int64_t i = s; i < e; ++i) {
      const double t = (double)(i - s);
      double R = 0.0;
      for (int32_t d = 0; d < D; ++d) {
        double v = ak[d] + bk[d] * t;
        v = v > 0.0 ? v : 0.0;
        r[d] = v;
        R += v;
      }
      if (!(R > 0.0)) return -(i + 1);
      const double inv = 1.0 / R;
      // deficit T_d(i + 1) - c_d(i): they sum to 1, so the first largest is positive (eligible)
      int32_t best = 0;
      double best_err = 0.0;
      for (int32_t d = 0; d < D; ++d) {
        const double err = E[d] + r[d] * inv;
        E[d] = err;
        if (d == 0 || err > best_err) { best = d; best_err = err; }
      }
      E[best] = best_err - 1.0;
      out_id[i - i0] = (TI)best;
      out_sample[i - i0] = (TS)(counts[best] + base[best]);
      counts[best] += 1;
    }
  }
  return 0;
}
}  // namespace

template <typename T>
static const T* input(const py::array& a) { return static_cast<const T*>(a.data()); }
template <typename T>
static T* output(py::array& a) { return static_cast<T*>(a.mutable_data()); }

// id_bytes / sample_bytes: the itemsize of out_id (uint8 or int16) and out_sample (int32 or int64).
static int64_t curriculum_build(int64_t i0, int64_t i1, int32_t D, py::array seg_starts, int64_t S,
                                py::array seg_w, int32_t prenorm, int32_t lead, int32_t all_positive,
                                py::array caps, py::array base, py::array counts, py::array sd,
                                py::array si, py::array out_id, py::array out_sample) {
  const int64_t* st = input<int64_t>(seg_starts);
  const double* w = input<double>(seg_w);
  const int64_t* cp = input<int64_t>(caps);
  const int64_t* bs = input<int64_t>(base);
  int64_t* c = output<int64_t>(counts);
  double* d = output<double>(sd);
  int64_t* s = output<int64_t>(si);
  void* id = out_id.mutable_data();
  void* sample = out_sample.mutable_data();
  const auto id_bytes = out_id.itemsize(), sample_bytes = out_sample.itemsize();
  py::gil_scoped_release release;  // no Python object is touched below
#define RUN(TI, TS) return run(i0, i1, D, st, S, w, prenorm, lead, all_positive, cp, bs, c, d, s, (TI*)id, (TS*)sample)
  if (id_bytes == 1 && sample_bytes == 4) RUN(uint8_t, int32_t);
  if (id_bytes == 1 && sample_bytes == 8) RUN(uint8_t, int64_t);
  if (id_bytes == 2 && sample_bytes == 4) RUN(int16_t, int32_t);
  RUN(int16_t, int64_t);
#undef RUN
}

static int64_t curriculum_build_pl(int64_t i0, int64_t i1, int32_t D, py::array starts, int64_t S,
                                   py::array a, py::array b, py::array base, py::array counts,
                                   py::array E, py::array scratch, py::array out_id,
                                   py::array out_sample) {
  const int64_t* st = input<int64_t>(starts);
  const double* pa = input<double>(a);
  const double* pb = input<double>(b);
  const int64_t* bs = input<int64_t>(base);
  int64_t* c = output<int64_t>(counts);
  double* e = output<double>(E);
  double* sc = output<double>(scratch);
  void* id = out_id.mutable_data();
  void* sample = out_sample.mutable_data();
  const auto id_bytes = out_id.itemsize(), sample_bytes = out_sample.itemsize();
  py::gil_scoped_release release;  // no Python object is touched below
#define RUN_PL(TI, TS) return run_pl(i0, i1, D, st, S, pa, pb, bs, c, e, sc, (TI*)id, (TS*)sample)
  if (id_bytes == 1 && sample_bytes == 4) RUN_PL(uint8_t, int32_t);
  if (id_bytes == 1 && sample_bytes == 8) RUN_PL(uint8_t, int64_t);
  if (id_bytes == 2 && sample_bytes == 4) RUN_PL(int16_t, int32_t);
  RUN_PL(int16_t, int64_t);
#undef RUN_PL
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "curriculum blending index kernel (megatron/data/curriculum.py)";
  m.def("build", &curriculum_build,
        "Fill samples [i0, i1) of one stage from per-segment weights (caps, renormalisation); "
        "returns 0, or -(i + 1) when no dataset can be drawn at sample i");
  m.def("build_pl", &curriculum_build_pl,
        "Fill samples [i0, i1) of one stage from piecewise-linear raw weights (no caps); "
        "returns 0, or -(i + 1) when every weight is zero at sample i");
}
