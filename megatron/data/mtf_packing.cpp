// T0 packing's best-fit-decreasing loop (megatron/data/mtf_dataset.py pack_lengths): the same
// placement rule as its Python twin, item for item, so the packs are identical. Items are taken in
// the given order (longest first, ties in shuffled order); each goes into the open bin with the
// least room that still fits it (among bins of equal room, the one that reached that room last),
// else into a new bin. Open bins are kept in one last-in-first-out stack per room, and the rooms
// that have a bin in a two-level bitset, so the least room >= a length is a few word scans.
// Built at first use with torch.utils.cpp_extension.load.
#include <cstdint>
#include <stdexcept>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

namespace py = pybind11;

namespace {

// The rooms 0..S that have an open bin: bit r of words[r / 64], and bit w of summary[w / 64] set
// while words[w] is not zero.
struct Rooms {
  std::vector<uint64_t> words, summary;
  explicit Rooms(int64_t S) : words(S / 64 + 1, 0), summary(S / 4096 + 1, 0) {}
  void set(int64_t r) {
    words[r >> 6] |= 1ULL << (r & 63);
    summary[r >> 12] |= 1ULL << ((r >> 6) & 63);
  }
  void clear(int64_t r) {
    const int64_t w = r >> 6;
    words[w] &= ~(1ULL << (r & 63));
    if (words[w] == 0) summary[w >> 6] &= ~(1ULL << (w & 63));
  }
  // the least room >= r with an open bin, or -1
  int64_t least_at_least(int64_t r) const {
    int64_t w = r >> 6;
    if (w >= (int64_t)words.size()) return -1;
    const uint64_t here = words[w] & (~0ULL << (r & 63));
    if (here) return (w << 6) + __builtin_ctzll(here);
    ++w;  // the next non-empty word after w - 1
    int64_t s = w >> 6;
    if (s >= (int64_t)summary.size()) return -1;
    uint64_t m = (w & 63) ? summary[s] & (~0ULL << (w & 63)) : summary[s];
    while (!m) {
      if (++s >= (int64_t)summary.size()) return -1;
      m = summary[s];
    }
    const int64_t word = (s << 6) + __builtin_ctzll(m);
    return (word << 6) + __builtin_ctzll(words[word]);
  }
};

// lengths: [n] int64 item lengths (each 1..S); order: [n] int64 the items in placement order;
// items / offsets: [n] and [n + 1] int64 outputs (bin b holds items[offsets[b]:offsets[b + 1]], in
// placement order; bins in creation order). Returns the number of bins.
static int64_t pack(py::array lengths, py::array order, int64_t S, py::array items,
                    py::array offsets) {
  const int64_t n = (int64_t)order.size();
  const int64_t* len = static_cast<const int64_t*>(lengths.data());
  const int64_t* ord = static_cast<const int64_t*>(order.data());
  int64_t* out = static_cast<int64_t*>(items.mutable_data());
  int64_t* off = static_cast<int64_t*>(offsets.mutable_data());
  py::gil_scoped_release release;  // no Python object is touched below
  std::vector<int64_t> bin_of(n);
  std::vector<std::vector<int64_t>> by_room(S + 1);
  Rooms rooms(S);
  int64_t nbins = 0;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t length = len[ord[k]];
    if (length < 1 || length > S) throw std::runtime_error("pack: item length outside [1, S]");
    int64_t room = rooms.least_at_least(length), b;
    if (room >= 0) {
      std::vector<int64_t>& candidates = by_room[room];
      b = candidates.back();
      candidates.pop_back();
      if (candidates.empty()) rooms.clear(room);
    } else {
      b = nbins++;
      room = S;
    }
    bin_of[k] = b;
    room -= length;
    if (room > 0) {
      by_room[room].push_back(b);
      rooms.set(room);
    }
  }
  // items grouped by bin, each bin's in placement order (a counting sort on bin_of)
  for (int64_t b = 0; b <= nbins; ++b) off[b] = 0;
  for (int64_t k = 0; k < n; ++k) ++off[bin_of[k] + 1];
  for (int64_t b = 0; b < nbins; ++b) off[b + 1] += off[b];
  std::vector<int64_t> fill(off, off + nbins);
  for (int64_t k = 0; k < n; ++k) out[fill[bin_of[k]]++] = ord[k];
  return nbins;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "T0 packing's best-fit-decreasing loop (megatron/data/mtf_dataset.py)";
  m.def("pack", &pack,
        "Best-fit-decreasing packing of items taken in the given order into bins of S; writes "
        "items and offsets, returns the number of bins");
}
