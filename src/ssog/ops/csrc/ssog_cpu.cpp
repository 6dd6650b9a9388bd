// Fused CPU kernels of the SSoG operator (the `cpp` backend), float32, forward only.
//
// Built by ssog/ops/cpp_kernels.py with the machine's C++ compiler on first use and called
// through ctypes: a plain C ABI, no torch headers, so it compiles in seconds and does not
// depend on the torch version. Values and outputs are float32 with contiguous features and
// any batch, head and token strides; mixture parameters are contiguous. Shapes are in the
// comments of the two entry points at the end.
//
// Both kernels keep their running sums in vector registers and never write an intermediate
// larger than a few KiB, so the workspace is the output alone, and each call is one OpenMP
// loop over its work items. Linked against libgomp.so.1, the runtime torch itself loads (its
// wheels ship one under that name), so the kernels share torch's thread pool: a second
// runtime's idle threads would spin against torch's.
//
// Kernel rows are ssog.ops.kernels.gaussian_rows, built here (gaussian_row below) from the
// mixture parameters: in PyTorch a steered query's rows cost as much to build as to apply,
// and a fixed layer's take longer than mixing a 14x14 grid. Their tails are clamped at eps^2
// of the peak (eps of float32); keys where every kernel of a tile is at that floor are
// skipped: what they would add is below 2^-46 of the output's scale, under float32's
// resolution.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace {

#if defined(__AVX512F__)
constexpr int kLanes = 16;
#else
constexpr int kLanes = 8;
#endif
typedef float vec __attribute__((vector_size(kLanes * sizeof(float))));  // GCC/Clang vector extension
constexpr int kRegisters = kLanes == 16 ? 32 : 16;  // vector registers of AVX-512 / AVX2

// How many rows of running sums (each kVectors registers) a loop can keep in registers beside
// one row of loaded values and a broadcast weight, at most `cap`.
constexpr int sums_in_registers(int vectors, int cap) {
  return std::max(1, std::min(cap, (kRegisters - vectors - 1) / vectors));
}

// gaussian_rows' floor: logits are clamped at 2 ln(eps(float32)), values at eps^2 of the
// row's peak; kNegligible adds a margin for the normalisation's rounding.
constexpr float kLogitFloor = -31.8847885f;
constexpr float kNegligible = 2.0e-14f;

inline vec load(const float* p) { vec v; std::memcpy(&v, p, sizeof v); return v; }
inline void store(float* p, vec v) { std::memcpy(p, &v, sizeof v); }

// Runs body(i) for i in [0, count) on `threads` threads, handing out items one at a time so
// that a core slowed by another process takes fewer.
// One thread runs the loop without entering OpenMP, as torch's own parallel_for does (its
// DataLoader workers, forked processes, run on one thread).
template <class Body>
void parallel_for(int64_t count, int threads, Body body) {
  if (threads <= 1 || count <= 1) {
    for (int64_t i = 0; i < count; ++i) body(i);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t i = 0; i < count; ++i) body(i);
}

// First and last+1 index of `length` where any of the `count` rows (stride `stride`) is above
// the floor in magnitude (or NaN); an empty span when none is. Rows carry their atom's weight,
// which may be negative (a signed mixture) or 0 (a softmax's limit: an empty span).
inline void span_above_floor(const float* rows, int count, int64_t stride, int length, int* first, int* end) {
  int lo = length, hi = 0;
  for (int k = 0; k < count; ++k) {
    const float* row = rows + k * stride;
    int j = 0;
    while (j < lo && std::fabs(row[j]) <= kNegligible) ++j;
    lo = std::min(lo, j);
    j = length;
    while (j > hi && std::fabs(row[j - 1]) <= kNegligible) --j;
    hi = std::max(hi, j);
  }
  *first = lo;
  *end = std::max(lo, hi);
}

// ssog.ops.checks._in_range in float32, for `count` atoms (mu, sigma: (count, 2) as (y, x),
// weight: (count)): (L + |mu|) / sigma positive with a finite square, |mu| <= 2^20 and a
// finite weight. NaN fails every comparison. The Python check names what failed.
bool parameters_in_range(const float* mu, const float* sigma, const float* weight, int64_t count, int rows, int cols) {
  const float largest_reach = static_cast<float>(std::sqrt(static_cast<double>(FLT_MAX)));
  const float lengths[2] = {static_cast<float>(rows), static_cast<float>(cols)};
  bool ok = true;
  for (int64_t i = 0; i < 2 * count; ++i) {
    const float offset = std::fabs(mu[i]);
    const float reach = (lengths[i & 1] + offset) / sigma[i];
    ok &= (reach > 0.0f) & (reach < largest_reach) & (offset <= 1048576.0f);
  }
  for (int64_t i = 0; i < count; ++i) ok &= std::fabs(weight[i]) <= FLT_MAX;
  return ok;
}

// ------------------------------------------------------------------------ steered kernels
typedef int32_t ivec __attribute__((vector_size(kLanes * sizeof(int32_t))));

// 0, 1, ..., kLanes - 1.
inline vec lane_index() {
  vec lanes;
  for (int i = 0; i < kLanes; ++i) lanes[i] = static_cast<float>(i);
  return lanes;
}

// exp(x) for x in [kLogitFloor, 0], on whole vectors: x = n ln2 + f with |f| <= ln2 / 2,
// exp(f) by its Taylor polynomial of degree 7 (relative error < 1e-8), 2^n written into the
// exponent bits (n >= -47, so never subnormal).
inline vec exp_clamped(vec x) {
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds to an integer
  const vec n = (x * 1.44269504f + kRound) - kRound;
  const vec f = (x - n * 0.693145752f) - n * 1.42860677e-6f;  // ln 2 in two parts (Cody-Waite)
  vec p = f * (1.0f / 5040.0f) + 1.0f / 720.0f;
  p = p * f + 1.0f / 120.0f;
  p = p * f + 1.0f / 24.0f;
  p = p * f + 1.0f / 6.0f;
  p = p * f + 0.5f;
  p = p * f + 1.0f;
  p = p * f + 1.0f;
  const ivec bits = (__builtin_convertvector(n, ivec) + 127) << 23;
  return p * reinterpret_cast<const vec&>(bits);
}

// gaussian_rows (ssog/ops/kernels.py) for one row, times `weight`: softmax over keys
// j < length of -(j - centre)^2 / (2 sigma^2), shifted by the logit of the key nearest the
// centre and clamped at 2 ln(eps) like the PyTorch formula. `row` holds `length` rounded up
// to whole vectors; the padding is set to zero.
inline void gaussian_row(float centre, float sigma, float weight, int length, float* row) {
  const float scale = -0.5f / (sigma * sigma);
  const float nearest = std::min(std::max(__builtin_nearbyintf(centre), 0.0f), static_cast<float>(length - 1));
  const float nearest_offset = nearest - centre;
  const vec lanes = lane_index();
  vec total = {};
  for (int j = 0; j < length; j += kLanes) {
    const vec key = lanes + static_cast<float>(j);
    // (j - c)^2 - (n - c)^2 as (j - n) ((j - c) + (n - c)): 0 at the nearest key and never
    // positive, however far the centre (the difference of squares cancels there).
    vec logit = scale * (key - nearest) * ((key - centre) + nearest_offset);
    logit = logit < kLogitFloor ? kLogitFloor : logit;  // NaN parameters stay NaN
    const vec value = key < static_cast<float>(length) ? exp_clamped(logit) : vec{};
    store(row + j, value);
    total += value;
  }
  float sum = 0.0f;
  for (int i = 0; i < kLanes; ++i) sum += total[i];
  const float factor = weight / sum;
  for (int j = 0; j < length; j += kLanes) store(row + j, load(row + j) * factor);
}

// Length rounded up to whole vectors.
inline int padded(int length) { return (length + kLanes - 1) / kLanes * kLanes; }

// Strides (floats) of a (batch, heads, tokens, dim) tensor whose features are contiguous: the
// layers pass views of their (batch, tokens, heads, dim) projections, read and written in
// place instead of copied to and from a contiguous (batch, heads, tokens, dim).
struct Layout {
  int64_t batch, head, token;
  template <class T> T* item(T* base, int64_t item, int heads) const {
    return base + (item / heads) * batch + (item % heads) * head;
  }
};

// One tile of up to `kQueries` consecutive queries of one (batch, head) item:
// out[q] = sum_j A[q, j] v[j] with A[q, (y, x)] = sum_r ky[q, r, y] kx[q, r, x], the kernels
// built from the tile's parameters and A one key row at a time, all in L1. Rows along x are
// padded with zeros to whole vectors (`stride`); a tile's missing queries have zero kernels.
template <int kVectors, int kQueries>
void steered_tile(const float* v, int64_t v_token, const float* mu, const float* sigma, const float* weight,
                  float* out, int64_t out_token, int64_t first_query, int queries, int rows, int cols, int atoms,
                  float* scratch) {
  const int stride_y = padded(rows), stride = padded(cols);
  float* ky = scratch;                                 // (kQueries, atoms, stride_y)
  float* kx = ky + kQueries * atoms * stride_y;        // (kQueries, atoms, stride)
  float* row_of_a = kx + kQueries * atoms * stride;    // (kQueries, stride)
  std::fill(ky, row_of_a, 0.0f);
  for (int q = 0; q < queries; ++q) {
    const int64_t query = first_query + q;
    const float query_y = static_cast<float>(query / cols), query_x = static_cast<float>(query % cols);
    for (int r = 0; r < atoms; ++r) {
      const int64_t at = q * atoms + r;
      gaussian_row(query_y + mu[2 * at], sigma[2 * at], weight[at], rows, ky + at * stride_y);
      gaussian_row(query_x + mu[2 * at + 1], sigma[2 * at + 1], 1.0f, cols, kx + at * stride);
    }
  }
  // Columns any kernel of the tile reaches, and the vectors that hold them; the rest of A's
  // rows are at the floor.
  int x0, x1;
  span_above_floor(kx, queries * atoms, stride, cols, &x0, &x1);
  const int vector0 = x0 / kLanes, vector1 = (x1 + kLanes - 1) / kLanes;
  vec acc[kQueries][kVectors] = {};
  for (int y = 0; y < rows; ++y) {
    bool negligible = true;  // false for NaN, which must reach the output
    for (int k = 0; k < queries * atoms; ++k) negligible &= std::fabs(ky[k * stride_y + y]) <= kNegligible;
    if (negligible) continue;
    for (int i = vector0; i < vector1; ++i) {
      for (int q = 0; q < kQueries; ++q) {
        vec sum = {};
        for (int r = 0; r < atoms; ++r)
          sum += ky[(q * atoms + r) * stride_y + y] * load(kx + (q * atoms + r) * stride + i * kLanes);
        store(row_of_a + q * stride + i * kLanes, sum);
      }
    }
    const float* v_row = v + static_cast<int64_t>(y) * cols * v_token;
    for (int x = x0; x < x1; ++x) {
      vec values[kVectors];
      for (int c = 0; c < kVectors; ++c) values[c] = load(v_row + x * v_token + c * kLanes);
      for (int q = 0; q < kQueries; ++q) {
        const float weight_a = row_of_a[q * stride + x];
        for (int c = 0; c < kVectors; ++c) acc[q][c] += weight_a * values[c];
      }
    }
  }
  for (int q = 0; q < queries; ++q)
    for (int c = 0; c < kVectors; ++c) store(out + q * out_token + c * kLanes, acc[q][c]);
}

template <int kVectors>
void steered_forward(const float* v, Layout v_layout, const float* mu, const float* sigma, const float* weight,
                     float* out, Layout out_layout, int64_t items, int heads, int rows, int cols, int atoms,
                     int threads) {
  constexpr int kQueries = sums_in_registers(kVectors, 8);
  const int64_t n = static_cast<int64_t>(rows) * cols;
  const int64_t tiles = (n + kQueries - 1) / kQueries;
  parallel_for(items * tiles, threads, [&](int64_t task) {
    thread_local std::vector<float> scratch;
    scratch.resize(static_cast<size_t>(kQueries) * (atoms * (padded(rows) + padded(cols)) + padded(cols)));
    const int64_t item = task / tiles;
    const int64_t q0 = (task % tiles) * kQueries;
    const int count = static_cast<int>(std::min<int64_t>(kQueries, n - q0));
    const int64_t query = item * n + q0;  // first (item, query) of the tile in the parameters
    steered_tile<kVectors, kQueries>(v_layout.item(v, item, heads), v_layout.token, mu + query * atoms * 2,
                                     sigma + query * atoms * 2, weight + query * atoms,
                                     out_layout.item(out, item, heads) + q0 * out_layout.token, out_layout.token,
                                     q0, count, rows, cols, atoms, scratch.data());
  });
}

// ------------------------------------------------------------------------ fixed kernels
inline int round_up(int value, int multiple) { return (value + multiple - 1) / multiple * multiple; }

// The 1-D kernels of every head, built once per call, and per kernel row the span of keys
// above the floor. Padded with zero rows to whole groups of atoms and output columns (the
// loops' register blocks), so those loops need no remainder cases.
struct FixedKernels {
  int atoms, padded_atoms, rows, cols, padded_cols, stride_y, stride_x;
  std::vector<float> ky, kx;        // [head][atom][query row][stride_y], [head][atom][query col][stride_x]
  std::vector<int> ky_span, kx_span;  // [head][atom][query][first, end]

  // fill_row(axis, head, atom, query, row, length) writes one kernel row (axis 0: ky, 1: kx); each
  // row's span above the floor is found here.
  template <class FillRow>
  FixedKernels(int heads, int atoms_, int rows_, int cols_, int atom_group, int column_group, FillRow fill_row)
      : atoms(atoms_), padded_atoms(round_up(atoms_, atom_group)), rows(rows_), cols(cols_),
        padded_cols(round_up(cols_, column_group)), stride_y(padded(rows_)), stride_x(padded(cols_)),
        ky(static_cast<size_t>(heads) * padded_atoms * rows * stride_y, 0.0f),
        kx(static_cast<size_t>(heads) * atoms * padded_cols * stride_x, 0.0f),
        ky_span(static_cast<size_t>(heads) * padded_atoms * rows * 2, 0),
        kx_span(static_cast<size_t>(heads) * atoms * padded_cols * 2, 0) {
    // On the calling thread, and once per set of parameters (fixed_kernels' cache): a
    // parallel region of its own would be one more barrier to wait at for a thread that
    // another process holds.
    for (int64_t head_atom = 0; head_atom < static_cast<int64_t>(heads) * atoms; ++head_atom) {
      const int64_t head = head_atom / atoms, atom = head_atom % atoms;
      const int64_t y_rows = head * padded_atoms + atom, x_rows = head * atoms + atom;
      for (int query = 0; query < rows; ++query) {
        float* row = &ky[(y_rows * rows + query) * stride_y];
        fill_row(0, head, atom, query, row, rows);
        int* span = &ky_span[(y_rows * rows + query) * 2];
        span_above_floor(row, 1, 0, rows, span, span + 1);
      }
      for (int query = 0; query < cols; ++query) {
        float* row = &kx[(x_rows * padded_cols + query) * stride_x];
        fill_row(1, head, atom, query, row, cols);
        int* span = &kx_span[(x_rows * padded_cols + query) * 2];
        span_above_floor(row, 1, 0, cols, span, span + 1);
      }
    }
  }

  // The rows built from the mixture parameters (the gaussian_rows formula, weights folded into ky).
  static FixedKernels from_parameters(const float* mu, const float* sigma, const float* weight, int heads, int atoms,
                                      int rows, int cols, int atom_group, int column_group) {
    return FixedKernels(heads, atoms, rows, cols, atom_group, column_group,
                        [&](int axis, int64_t head, int64_t atom, int query, float* row, int length) {
                          const int64_t at = head * atoms + atom;
                          gaussian_row(query + mu[2 * at + axis], sigma[2 * at + axis], axis == 0 ? weight[at] : 1.0f,
                                       length, row);
                        });
  }

  // The rows copied from given tables (ssog::fixed_mix's CPU kernel: the op takes the tables, built
  // or transposed by the caller): element [h][r][q][k] at h * s[0] + r * s[1] + q * s[2] + k * s[3].
  static FixedKernels from_tables(const float* ky_in, const int64_t* ky_s, const float* kx_in, const int64_t* kx_s,
                                  int heads, int atoms, int rows, int cols, int atom_group, int column_group) {
    return FixedKernels(heads, atoms, rows, cols, atom_group, column_group,
                        [&](int axis, int64_t head, int64_t atom, int query, float* row, int length) {
                          const float* table = axis == 0 ? ky_in : kx_in;
                          const int64_t* s = axis == 0 ? ky_s : kx_s;
                          const float* in = table + head * s[0] + atom * s[1] + query * s[2];
                          for (int key = 0; key < length; ++key) row[key] = in[key * s[3]];
                        });
  }

  size_t bytes() const {
    return (ky.size() + kx.size()) * sizeof(float) + (ky_span.size() + kx_span.size()) * sizeof(int);
  }
};

// The kernels of recent fixed calls, most recent first, up to kKernelCacheBytes: in
// inference every layer mixes with the same parameters call after call, and building the
// kernels took 0.05 ms of a 0.6 ms call at 14x14. The key holds the parameters' bytes, so
// changed parameters never meet stale kernels.
constexpr size_t kKernelCacheBytes = 16u << 20;

std::shared_ptr<const FixedKernels> fixed_kernels(const float* mu, const float* sigma, const float* weight, int heads,
                                                  int atoms, int rows, int cols, int atom_group, int column_group) {
  const size_t count = static_cast<size_t>(heads) * atoms;
  std::vector<float> key = {static_cast<float>(heads), static_cast<float>(atoms), static_cast<float>(rows),
                            static_cast<float>(cols), static_cast<float>(atom_group),
                            static_cast<float>(column_group)};
  key.insert(key.end(), mu, mu + 2 * count);
  key.insert(key.end(), sigma, sigma + 2 * count);
  key.insert(key.end(), weight, weight + count);
  const auto same = [&key](const std::vector<float>& other) {
    return other.size() == key.size() && std::memcmp(other.data(), key.data(), key.size() * sizeof(float)) == 0;
  };
  static std::mutex mutex;
  static std::list<std::pair<std::vector<float>, std::shared_ptr<const FixedKernels>>> cache;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    for (auto entry = cache.begin(); entry != cache.end(); ++entry) {
      if (same(entry->first)) {
        cache.splice(cache.begin(), cache, entry);
        return cache.front().second;
      }
    }
  }
  auto built = std::make_shared<const FixedKernels>(
      FixedKernels::from_parameters(mu, sigma, weight, heads, atoms, rows, cols, atom_group, column_group));
  const std::lock_guard<std::mutex> lock(mutex);
  cache.emplace_front(std::move(key), built);
  size_t bytes = 0;
  for (auto entry = cache.begin(); entry != cache.end();) {
    bytes += entry->second->bytes();
    entry = bytes > kKernelCacheBytes && entry != cache.begin() ? cache.erase(entry) : std::next(entry);
  }
  return built;
}

// Keys reached by any of `count` consecutive kernel rows, from their spans.
inline void union_of_spans(const int* spans, int count, int* first, int* end) {
  int lo = spans[0], hi = spans[1];
  for (int k = 1; k < count; ++k) {
    if (spans[2 * k] < spans[2 * k + 1]) {
      lo = lo < hi ? std::min(lo, spans[2 * k]) : spans[2 * k];
      hi = std::max(hi, spans[2 * k + 1]);
    }
  }
  *first = lo;
  *end = std::max(lo, hi);
}

// One query row y' of one (batch, head) item, separable: m[r, x] = sum_y ky[r, y', y] v[y, x]
// for every atom into a (R, Wg, d) scratch (L1- or L2-sized), then
// out[y', x'] = sum_(r, x) kx[r, x', x] m[r, x].
template <int kVectors, int kAtomGroup, int kColumnGroup>
void fixed_row(const float* v, int64_t v_token, const FixedKernels& k, int head, float* out, int64_t out_token,
               int out_row, float* mixed) {
  constexpr int dim = kVectors * kLanes;
  const int rows = k.rows, cols = k.cols;
  for (int r0 = 0; r0 < k.padded_atoms; r0 += kAtomGroup) {
    const int64_t first = (static_cast<int64_t>(head) * k.padded_atoms + r0) * rows + out_row;
    const float* ky_rows[kAtomGroup];
    int spans[2 * kAtomGroup];
    for (int r = 0; r < kAtomGroup; ++r) {
      ky_rows[r] = &k.ky[(first + static_cast<int64_t>(r) * rows) * k.stride_y];
      spans[2 * r] = k.ky_span[(first + static_cast<int64_t>(r) * rows) * 2];
      spans[2 * r + 1] = k.ky_span[(first + static_cast<int64_t>(r) * rows) * 2 + 1];
    }
    int y0, y1;
    union_of_spans(spans, kAtomGroup, &y0, &y1);
    for (int x = 0; x < cols; ++x) {
      vec acc[kAtomGroup][kVectors] = {};
      for (int y = y0; y < y1; ++y) {
        vec values[kVectors];
        const float* v_at = v + (static_cast<int64_t>(y) * cols + x) * v_token;
        for (int c = 0; c < kVectors; ++c) values[c] = load(v_at + c * kLanes);
        for (int r = 0; r < kAtomGroup; ++r)
          for (int c = 0; c < kVectors; ++c) acc[r][c] += ky_rows[r][y] * values[c];
      }
      for (int r = 0; r < kAtomGroup; ++r)
        for (int c = 0; c < kVectors; ++c) store(mixed + ((r0 + r) * cols + x) * dim + c * kLanes, acc[r][c]);
    }
  }
  for (int x0 = 0; x0 < cols; x0 += kColumnGroup) {
    vec acc[kColumnGroup][kVectors] = {};
    for (int r = 0; r < k.atoms; ++r) {
      const int64_t first = (static_cast<int64_t>(head) * k.atoms + r) * k.padded_cols + x0;
      const float* kx_rows = &k.kx[first * k.stride_x];
      int x_first, x_end;
      union_of_spans(&k.kx_span[first * 2], kColumnGroup, &x_first, &x_end);
      for (int x = x_first; x < x_end; ++x) {
        vec values[kVectors];
        for (int c = 0; c < kVectors; ++c) values[c] = load(mixed + (r * cols + x) * dim + c * kLanes);
        for (int i = 0; i < kColumnGroup; ++i)
          for (int c = 0; c < kVectors; ++c) acc[i][c] += kx_rows[i * k.stride_x + x] * values[c];
      }
    }
    for (int i = 0; i < std::min(kColumnGroup, cols - x0); ++i)
      for (int c = 0; c < kVectors; ++c)
        store(out + (static_cast<int64_t>(out_row) * cols + x0 + i) * out_token + c * kLanes, acc[i][c]);
  }
}

// Atoms contracted together along y, and output columns computed together along x: as many
// as registers hold. Wider column groups read the y-mixed values fewer times; measured on a
// 2-core AVX-512 VM at 14x14, d 64: 7 columns 1.15 ms, 4 columns 1.24 ms, 8 (spilling) 1.46 ms.
template <int kVectors>
constexpr int atom_group() { return sums_in_registers(kVectors, 4); }
template <int kVectors>
constexpr int column_group() { return std::max(1, std::min(8, (kRegisters - 4) / kVectors)); }

template <int kVectors>
void fixed_rows(const float* v, Layout v_layout, const FixedKernels& kernels, float* out, Layout out_layout,
                int64_t items, int heads, int threads);

template <int kVectors>
void fixed_forward(const float* v, Layout v_layout, const float* mu, const float* sigma, const float* weight,
                   float* out, Layout out_layout, int64_t items, int heads, int rows, int cols, int atoms,
                   int threads) {
  const auto cached = fixed_kernels(mu, sigma, weight, heads, atoms, rows, cols, atom_group<kVectors>(),
                                    column_group<kVectors>());
  fixed_rows<kVectors>(v, v_layout, *cached, out, out_layout, items, heads, threads);
}

// fixed_forward with the 1-D kernels given as tables (no cache: the caller holds them).
template <int kVectors>
void fixed_forward_tables(const float* v, Layout v_layout, const float* ky, const int64_t* ky_s, const float* kx,
                          const int64_t* kx_s, float* out, Layout out_layout, int64_t items, int heads, int rows,
                          int cols, int atoms, int threads) {
  const FixedKernels kernels = FixedKernels::from_tables(ky, ky_s, kx, kx_s, heads, atoms, rows, cols,
                                                         atom_group<kVectors>(), column_group<kVectors>());
  fixed_rows<kVectors>(v, v_layout, kernels, out, out_layout, items, heads, threads);
}

// Every output row of every item, from built kernels.
template <int kVectors>
void fixed_rows(const float* v, Layout v_layout, const FixedKernels& kernels, float* out, Layout out_layout,
                int64_t items, int heads, int threads) {
  constexpr int dim = kVectors * kLanes;
  constexpr int kAtomGroup = atom_group<kVectors>();
  constexpr int kColumnGroup = column_group<kVectors>();
  const int rows = kernels.rows, cols = kernels.cols;
  // Tasks of whole query rows, about 16 per thread: few enough that handing them out costs
  // nothing, enough that a thread slowed by another process hands its share to the others.
  const int64_t per_task = std::max<int64_t>(1, std::min<int64_t>(rows, items * rows / (16 * std::max(threads, 1))));
  const int64_t blocks = (rows + per_task - 1) / per_task;
  parallel_for(items * blocks, threads, [&](int64_t task) {
    thread_local std::vector<float> mixed;
    mixed.resize(static_cast<size_t>(kernels.padded_atoms) * cols * dim);
    const int64_t item = task / blocks;
    const int y0 = static_cast<int>((task % blocks) * per_task);
    const int y1 = static_cast<int>(std::min<int64_t>(rows, y0 + per_task));
    for (int y = y0; y < y1; ++y)
      fixed_row<kVectors, kAtomGroup, kColumnGroup>(v_layout.item(v, item, heads), v_layout.token, kernels,
                                                    static_cast<int>(item % heads), out_layout.item(out, item, heads),
                                                    out_layout.token, y, mixed.data());
  });
}

// ------------------------------------------------------------------------ table gradients
// The gradient of one axis' tables (ssog::fixed_mix_table_grads' CPU kernel), on a grid of
// `rows` x `cols` whose token (y, x) is at y * row_step + x * col_step (tokens; swapped steps
// give the other axis):
//   grad[h][r][q][y] = sum_(b, x, f) U[r][x][f] v[b, h, (y, x), f]
//   U[r][x][f] = sum_x' other[h][r][x'][x] g[b, h, (q, x'), f]
// One task per (head, query row) sums over the batch in a fixed order: deterministic, no
// reduction across threads. U (atoms x cols x dim) is built in a per-thread scratch.
template <int kVectors>
void table_grad(const float* v, Layout v_layout, const float* g, Layout g_layout, const float* other,
                const int64_t* other_s, float* grad, int64_t batch, int heads, int rows, int cols, int64_t row_step,
                int64_t col_step, int atoms, int threads) {
  constexpr int dim = kVectors * kLanes;
  constexpr int kAtoms = 4;  // running sums of a group of atoms, in registers beside a row of values
  constexpr int kColumns = sums_in_registers(kVectors, 4);  // and of a group of columns
  parallel_for(static_cast<int64_t>(heads) * rows, threads, [&](int64_t task) {
    const int head = static_cast<int>(task / rows), q = static_cast<int>(task % rows);
    thread_local std::vector<float> mixed_back;
    mixed_back.resize(static_cast<size_t>(atoms) * cols * dim);
    std::vector<double> sums(static_cast<size_t>(atoms) * rows, 0.0);
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t item = b * heads + head;
      const float* v_item = v_layout.item(v, item, heads);
      const float* g_row = g_layout.item(g, item, heads) + q * row_step * g_layout.token;
      for (int r = 0; r < atoms; ++r) {
        const float* kernel = other + head * other_s[0] + r * other_s[1];
        for (int x0 = 0; x0 < cols; x0 += kColumns) {  // a group of columns per pass over the gradient's row
          const int group = std::min(kColumns, cols - x0);
          vec acc[kColumns][kVectors] = {};
          for (int x_out = 0; x_out < cols; ++x_out) {
            vec values[kVectors];
            const float* g_at = g_row + x_out * col_step * g_layout.token;
            for (int c = 0; c < kVectors; ++c) values[c] = load(g_at + c * kLanes);
            for (int i = 0; i < group; ++i) {
              const float weight = kernel[x_out * other_s[2] + (x0 + i) * other_s[3]];
              for (int c = 0; c < kVectors; ++c) acc[i][c] += weight * values[c];
            }
          }
          for (int i = 0; i < group; ++i)
            for (int c = 0; c < kVectors; ++c)
              store(&mixed_back[(static_cast<size_t>(r) * cols + x0 + i) * dim + c * kLanes], acc[i][c]);
        }
      }
      for (int y = 0; y < rows; ++y) {
        const float* v_row = v_item + y * row_step * v_layout.token;
        for (int r0 = 0; r0 < atoms; r0 += kAtoms) {  // a group of atoms per pass over the row's values
          const int group = std::min(kAtoms, atoms - r0);
          vec acc[kAtoms] = {};
          for (int x = 0; x < cols; ++x) {
            vec values[kVectors];
            const float* v_at = v_row + x * col_step * v_layout.token;
            for (int c = 0; c < kVectors; ++c) values[c] = load(v_at + c * kLanes);
            for (int r = 0; r < group; ++r) {
              const float* u_at = &mixed_back[(static_cast<size_t>(r0 + r) * cols + x) * dim];
              for (int c = 0; c < kVectors; ++c) acc[r] += load(u_at + c * kLanes) * values[c];
            }
          }
          for (int r = 0; r < group; ++r) {
            float total = 0.0f;
            for (int i = 0; i < kLanes; ++i) total += acc[r][i];
            sums[static_cast<size_t>(r0 + r) * rows + y] += total;
          }
        }
      }
    }
    for (int r = 0; r < atoms; ++r)
      for (int y = 0; y < rows; ++y)
        grad[((static_cast<int64_t>(head) * atoms + r) * rows + q) * rows + y] =
            static_cast<float>(sums[static_cast<size_t>(r) * rows + y]);
  });
}

template <template <int> class Kernel, class... Args>
int dispatch(int dim, Args... args) {
  if (dim % kLanes != 0) return 1;
  switch (dim / kLanes) {
    case 1: Kernel<1>::run(args...); return 0;
    case 2: Kernel<2>::run(args...); return 0;
    case 3: Kernel<3>::run(args...); return 0;
    case 4: Kernel<4>::run(args...); return 0;
    case 6: Kernel<6>::run(args...); return 0;
    case 8: Kernel<8>::run(args...); return 0;
    default: return 1;
  }
}

template <int kVectors>
struct Steered {
  template <class... Args> static void run(Args... args) { steered_forward<kVectors>(args...); }
};
template <int kVectors>
struct Fixed {
  template <class... Args> static void run(Args... args) { fixed_forward<kVectors>(args...); }
};
template <int kVectors>
struct TableGrad {
  template <class... Args> static void run(Args... args) { table_grad<kVectors>(args...); }
};
template <int kVectors>
struct FixedTables {
  template <class... Args> static void run(Args... args) { fixed_forward_tables<kVectors>(args...); }
};

}  // namespace

extern "C" {

// Floats per vector: head dimensions of 1, 2, 3, 4, 6 or 8 vectors are taken.
int ssog_lanes() { return kLanes; }

// out = A v for every (batch, head) item. v, out: (batch, heads, rows * cols, dim) float32
// with features contiguous and the given batch, head and token strides (floats). Steered
// (steered != 0): mu, sigma contiguous (batch, heads, rows * cols, atoms, 2) as (y, x) in
// tokens, weight (batch, heads, rows * cols, atoms). Fixed: mu, sigma (heads, atoms, 2),
// weight (heads, atoms). With `check` != 0 the parameters' values are checked first
// (parameters_in_range). Returns 0; 1 for an unsupported dim; 2 for parameters out of range,
// with nothing written.
int ssog_mix_forward(int steered, int check, const float* v, int64_t v_batch, int64_t v_head, int64_t v_token,
                     const float* mu, const float* sigma, const float* weight, float* out, int64_t out_batch,
                     int64_t out_head, int64_t out_token, int64_t batch, int heads, int rows, int cols, int atoms,
                     int dim, int threads) {
  const Layout v_layout{v_batch, v_head, v_token}, out_layout{out_batch, out_head, out_token};
  const int64_t count = (steered ? batch * rows * cols : 1) * heads * atoms;
  if (check && !parameters_in_range(mu, sigma, weight, count, rows, cols)) return 2;
  if (steered)
    return dispatch<Steered>(dim, v, v_layout, mu, sigma, weight, out, out_layout, batch * heads, heads, rows,
                             cols, atoms, threads);
  return dispatch<Fixed>(dim, v, v_layout, mu, sigma, weight, out, out_layout, batch * heads, heads, rows, cols,
                         atoms, threads);
}

// out = A v for every (batch, head) item, from given 1-D kernels: ky (heads, atoms, rows, rows)
// and kx (heads, atoms, cols, cols) float32 with the given strides (floats; a transposed table is
// its strides swapped), the mixture weights folded into ky. v and out as in ssog_mix_forward.
// Returns 0; 1 for an unsupported dim.
int ssog_mix_tables(const float* v, int64_t v_batch, int64_t v_head, int64_t v_token, const float* ky,
                    const int64_t* ky_strides, const float* kx, const int64_t* kx_strides, float* out,
                    int64_t out_batch, int64_t out_head, int64_t out_token, int64_t batch, int heads, int rows,
                    int cols, int atoms, int dim, int threads) {
  const Layout v_layout{v_batch, v_head, v_token}, out_layout{out_batch, out_head, out_token};
  return dispatch<FixedTables>(dim, v, v_layout, ky, ky_strides, kx, kx_strides, out, out_layout, batch * heads,
                               heads, rows, cols, atoms, threads);
}

// The gradient of one axis' tables, (heads, atoms, rows, rows) float32 contiguous, overwritten
// (table_grad): v and g (batch, heads, tokens, dim) with features contiguous and the given
// strides, their first patch token at v, g; other (heads, atoms, cols, cols) with the given
// strides. Returns 0; 1 for an unsupported dim.
int ssog_table_grad(const float* v, int64_t v_batch, int64_t v_head, int64_t v_token, const float* g,
                    int64_t g_batch, int64_t g_head, int64_t g_token, const float* other, const int64_t* other_strides,
                    float* grad, int64_t batch, int heads, int rows, int cols, int64_t row_step, int64_t col_step,
                    int atoms, int dim, int threads) {
  const Layout v_layout{v_batch, v_head, v_token}, g_layout{g_batch, g_head, g_token};
  return dispatch<TableGrad>(dim, v, v_layout, g, g_layout, other, other_strides, grad, batch, heads, rows, cols,
                             row_step, col_step, atoms, threads);
}

}  // extern "C"
