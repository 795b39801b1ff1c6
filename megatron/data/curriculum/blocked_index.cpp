// The blocked order's in-block kernel (megatron/data/curriculum/blocked.py): given, per block, how
// many samples each dataset gives (its quota), the order of the block's samples. The datasets of a
// block with equal quotas q > 0 form a group (g of them: its quota is Q = g q); the groups are
// numbered in the order of their lowest dataset. Within a block of L samples the groups (G of
// them) are interleaved by Tijdeman's earliest-deadline rule ("The chairman assignment problem",
// Discrete Math. 32, 1980) at the rates Q / L: with K = 2G - 2, a group's (k+1)-th sample is
// released at the first sample j with Q (j + 1) / L - k >= 1/K and due when Q (j + 1) / L reaches
// k + 1 - 1/K; each sample goes to the released group due first (ties: the lowest group), and a
// group gives its samples to its datasets in turn (lowest dataset first, round-robin). Then no
// group is a full sample from Q j / L (|C(j) - Q j / L| <= 1 - 1/K), and no dataset a full sample
// from q j / L: its count is within (g - 1) / g of C(j) / g, so within 1 - 1/(K g) of q j / L.
// A block costs O(L + D) whatever the datasets: G is at most the distinct quotas (sqrt(2 L)),
// and a blend of thousands of small datasets is mostly groups of quota 1, 2, 3, ...
// Releases and deadlines are exact integers (deadlines in 1/4096 samples, ties: the lowest
// group), so blocked.py's Python twin gives the identical order. Built at first use with
// torch.utils.cpp_extension.load.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

namespace py = pybind11;

namespace {

// Per dataset of a block: the release and deadline of its next sample, kept as quotient and
// remainder of exact integer fractions and moved on by one sample without a division.
//   release of the (k+1)-th sample: r_k = ceil(L (k K + 1) / (n K)) - 1 (a sample of the block)
//   deadline: floor(L ((k + 1) K - 1) 2^12 / (n K)), the sample at which n (j + 1) / L reaches
//   k + 1 - 1/K, in 1/4096 samples
struct Clock {
  int64_t rq, rr, dq, dr;     // release quotient/remainder, deadline quotient/remainder
  int64_t rstep_q, rstep_r;   // divmod(L K, n K)
  int64_t dstep_q, dstep_r;   // divmod(L K 2^12, n K)
  int64_t den;                // n K
  void start(int64_t L, int64_t n, int64_t K) {
    den = n * K;
    rq = (L + den - 1) / den; rr = (L + den - 1) % den;            // k = 0: L (0 K + 1)
    dq = (L * (K - 1) * FRAC) / den; dr = (L * (K - 1) * FRAC) % den;
    rstep_q = (L * K) / den; rstep_r = (L * K) % den;
    dstep_q = (L * K * FRAC) / den; dstep_r = (L * K * FRAC) % den;
  }
  void advance() {
    rq += rstep_q; rr += rstep_r; if (rr >= den) { rr -= den; ++rq; }
    dq += dstep_q; dr += dstep_r; if (dr >= den) { dr -= den; ++dq; }
  }
  int64_t release() const { return rq - 1; }
  static constexpr int64_t FRAC = 1 << 12;
};

// The ready datasets, earliest deadline first: a bucket per whole sample of deadline (a bitmap
// of the non-empty ones, scanned 64 at a time from the lowest that may be non-empty) holding an
// intrusive list, searched for the smallest key (deadline << 16 | position). The minimum of a set
// of distinct keys is what any priority queue gives, so this is the Python twin's heap order.
class ReadyBuckets {
 public:
  void reset(int64_t L, int64_t m) {
    head_.assign((size_t)L + 2, -1);
    bits_.assign(((size_t)L + 2 + 63) / 64, 0);
    next_.assign((size_t)m, -1);
    key_.assign((size_t)m, 0);
    lo_ = (int64_t)head_.size();
  }
  void push(int32_t t, uint64_t key) {
    const int64_t b = (int64_t)(key >> (16 + 12));  // the deadline's whole sample
    key_[t] = key;
    next_[t] = head_[b];
    head_[b] = t;
    bits_[b >> 6] |= 1ULL << (b & 63);
    if (b < lo_) lo_ = b;
  }
  // the position of the ready dataset with the smallest key, removed; -1 when none is ready
  int32_t pop() {
    size_t w = (size_t)(lo_ >> 6);
    if (w >= bits_.size()) return -1;
    uint64_t word = bits_[w] & (~0ULL << (lo_ & 63));
    while (!word) {
      if (++w >= bits_.size()) return -1;
      word = bits_[w];
    }
    const int64_t b = (int64_t)(w * 64 + __builtin_ctzll(word));
    lo_ = b;
    int32_t best = head_[b], best_prev = -1;
    for (int32_t prev = best, t = next_[best]; t >= 0; prev = t, t = next_[t]) {
      if (key_[t] < key_[best]) { best = t; best_prev = prev; }
    }
    if (best_prev < 0) head_[b] = next_[best]; else next_[best_prev] = next_[best];
    if (head_[b] < 0) bits_[b >> 6] &= ~(1ULL << (b & 63));
    return best;
  }

 private:
  std::vector<int32_t> head_, next_;
  std::vector<uint64_t> bits_, key_;
  int64_t lo_ = 0;
};

// The same queue as a binary heap of the keys: for blocks of many datasets with few samples each,
// whose equal quotas give equal deadlines that would crowd one bucket. Same minimum, same order.
class ReadyHeap {
 public:
  void reset(int64_t, int64_t m) {
    keys_.clear();
    keys_.reserve((size_t)m);
  }
  void push(int32_t, uint64_t key) {
    keys_.push_back(key);
    std::push_heap(keys_.begin(), keys_.end(), std::greater<uint64_t>());
  }
  int32_t pop() {
    if (keys_.empty()) return -1;
    std::pop_heap(keys_.begin(), keys_.end(), std::greater<uint64_t>());
    const uint64_t key = keys_.back();
    keys_.pop_back();
    return (int32_t)(key & 0xFFFF);
  }

 private:
  std::vector<uint64_t> keys_;
};

// The groups of one block: group t holds the datasets member[start[t] .. start[t + 1]) (each of
// quota q[t], so the group's quota is n[t] = q[t] (start[t + 1] - start[t])), in increasing order.
struct Groups {
  std::vector<int32_t> member, start, cursor;
  std::vector<int64_t> n;
  std::vector<int32_t> of_quota;  // of_quota[q]: the group of quota q in this block, -1 none
  // the groups of quotas q[0..D) (a block of at most L samples), in the order of their lowest dataset
  int64_t build(const int64_t* q, int32_t D, int64_t L) {
    if ((int64_t)of_quota.size() < L + 1) of_quota.assign((size_t)L + 1, -1);
    std::vector<int64_t>& quota = quota_;
    quota.clear(); start.clear(); n.clear();
    for (int32_t d = 0; d < D; ++d) {
      if (q[d] <= 0) continue;
      if (q[d] > L) throw std::invalid_argument("blocked index: a quota longer than its block");
      int32_t& g = of_quota[(size_t)q[d]];
      if (g < 0) { g = (int32_t)quota.size(); quota.push_back(q[d]); start.push_back(0); }
      ++start[(size_t)g];  // its size, for now
    }
    const int64_t G = (int64_t)quota.size();
    int32_t at = 0;
    for (int64_t t = 0; t < G; ++t) {  // sizes -> starts; n = q x size
      const int32_t size = start[(size_t)t];
      n.push_back(quota[(size_t)t] * size);
      start[(size_t)t] = at;
      at += size;
    }
    start.push_back(at);
    member.resize((size_t)at);
    cursor.assign(start.begin(), start.end() - 1);  // the next free slot, then the next to draw
    for (int32_t d = 0; d < D; ++d) {
      if (q[d] > 0) member[(size_t)cursor[(size_t)of_quota[(size_t)q[d]]]++] = d;
    }
    for (int64_t t = 0; t < G; ++t) {
      of_quota[(size_t)quota[(size_t)t]] = -1;
      cursor[(size_t)t] = start[(size_t)t];
    }
    return G;
  }
  // the dataset group t gives its next sample to (its datasets in turn)
  int32_t next_dataset(int32_t t) {
    const int32_t d = member[(size_t)cursor[(size_t)t]];
    if (++cursor[(size_t)t] == start[(size_t)t + 1]) cursor[(size_t)t] = start[(size_t)t];
    return d;
  }

 private:
  std::vector<int64_t> quota_;
};

// one block: the Tijdeman order of the G groups' quotas over L samples (see the top of this file)
template <typename Ready, typename TI, typename TS>
void fill_block(int64_t L, int64_t G, Groups& groups, std::vector<int64_t>& k,
                std::vector<int32_t>& next, std::vector<Clock>& clock, std::vector<int32_t>& head,
                Ready& ready, const int64_t* gid, int64_t* counts, TI* out_id, TS* out_sample) {
  const std::vector<int64_t>& n = groups.n;
  const int64_t K = 2 * G - 2;
  head.assign((size_t)L, -1);
  clock.resize((size_t)G);
  k.assign((size_t)G, 0);
  next.assign((size_t)G, -1);
  ready.reset(L, G);
  // group t is released: into the ready queue under its key (deadline << 16 | position)
  auto release = [&](int32_t t) { ready.push(t, ((uint64_t)clock[t].dq << 16) | (uint64_t)t); };
  auto schedule = [&](int32_t t, int64_t j) {  // group t's next sample
    const int64_t r = clock[t].release();
    if (r <= j) {
      release(t);
    } else {
      next[t] = head[r];
      head[r] = t;
    }
  };
  for (int32_t t = (int32_t)G - 1; t >= 0; --t) {
    clock[t].start(L, n[t], K);
    schedule(t, -1);
  }
  for (int64_t j = 0; j < L; ++j) {
    for (int32_t t = head[j]; t >= 0; t = next[t]) release(t);
    // Tijdeman's bound keeps a released group at every sample (the deficits sum to 1)
    const int32_t t = ready.pop();
    if (t < 0) throw std::runtime_error("blocked index: no dataset released");
    const int32_t d = groups.next_dataset(t);
    out_id[j] = (TI)gid[d];
    out_sample[j] = (TS)(counts[d]++);
    if (++k[t] < n[t]) {
      clock[t].advance();
      schedule(t, j);
    }
  }
}

template <typename TI, typename TS>
void fill(int64_t nb, int32_t D, const int64_t* lens, const int64_t* quotas, const int64_t* gid,
          int64_t* counts, TI* out_id, TS* out_sample) {
  Groups groups;
  std::vector<int32_t> next;
  std::vector<int64_t> k;
  std::vector<Clock> clock;
  std::vector<int32_t> head;  // the calendar of releases: head[j] lists the groups released at j
  ReadyBuckets ready;
  ReadyHeap heap;
  int64_t o = 0;
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t L = lens[b];
    const int64_t G = groups.build(quotas + b * D, D, L);
    if (G == 1) {  // one group: its datasets in turn
      for (int64_t j = 0; j < L; ++j) {
        const int32_t d = groups.next_dataset(0);
        out_id[o + j] = (TI)gid[d];
        out_sample[o + j] = (TS)(counts[d]++);
      }
    } else if (G * 64 > L) {  // many groups of few samples: equal deadlines, a heap
      fill_block(L, G, groups, k, next, clock, head, heap, gid, counts, out_id + o, out_sample + o);
    } else {
      fill_block(L, G, groups, k, next, clock, head, ready, gid, counts, out_id + o, out_sample + o);
    }
    o += L;
  }
}

template <typename T>
const T* input(const py::array& a) { return static_cast<const T*>(a.data()); }

// lens: [nb] block lengths; quotas: [nb, D] int64 (row b: each dataset's samples in block b,
// summing to lens[b]); gid: [D] the id written for each dataset; counts: [D] the next sample number
// of each dataset (advanced in place); out_id / out_sample: sum(lens) samples.
static void blocked_fill(int64_t nb, int32_t D, py::array lens, py::array quotas, py::array gid,
                         py::array counts, py::array out_id, py::array out_sample) {
  const int64_t* l = input<int64_t>(lens);
  const int64_t* q = input<int64_t>(quotas);
  const int64_t* g = input<int64_t>(gid);
  int64_t* c = static_cast<int64_t*>(counts.mutable_data());
  void* id = out_id.mutable_data();
  void* sample = out_sample.mutable_data();
  const auto id_bytes = out_id.itemsize(), sample_bytes = out_sample.itemsize();
  py::gil_scoped_release release;  // no Python object is touched below
#define FILL(TI, TS) return fill(nb, D, l, q, g, c, (TI*)id, (TS*)sample)
  if (id_bytes == 1 && sample_bytes == 4) FILL(uint8_t, int32_t);
  if (id_bytes == 1 && sample_bytes == 8) FILL(uint8_t, int64_t);
  if (id_bytes == 2 && sample_bytes == 4) FILL(int16_t, int32_t);
  FILL(int16_t, int64_t);
#undef FILL
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "the blocked order's in-block kernel (megatron/data/curriculum/blocked.py)";
  m.def("fill", &blocked_fill,
        "Order the samples of consecutive blocks from their per-dataset quotas (Tijdeman's "
        "earliest-deadline rule); advances counts");
}
