// spanlm's compiled CPU kernels (built on first use by spanlm/native/__init__.py).
//
// The instruction set is chosen by the flags the loader passes (those ATen builds its own kernels of
// that capability with), so that at::vec::Vectorized<float> — and its exp, the Sleef routine torch.exp
// uses — is the 512- or 256-bit one, and the work runs on PyTorch's own OpenMP threads (at::parallel_for).
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
#define CPU_CAPABILITY AVX512
#define CPU_CAPABILITY_AVX512
#elif defined(__AVX2__) && defined(__FMA__)
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#else
#define CPU_CAPABILITY DEFAULT
#endif

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kChunk = 64 * Vec::size();  // elements summed into a fresh partial sum before it joins the total

// max over v of x[v] + b[v] (NaN if any is NaN, as torch.amax)
float shifted_max(const float* x, const float* b, int64_t V) {
  Vec peak(-std::numeric_limits<float>::infinity());
  int64_t v = 0;
  for (; v + Vec::size() <= V; v += Vec::size()) peak = at::vec::maximum(peak, Vec::loadu(x + v) + Vec::loadu(b + v));
  float m = at::vec::vec_reduce_all<float>([](Vec& p, Vec& q) { return at::vec::maximum(p, q); }, peak);
  for (; v < V; ++v) {
    const float t = x[v] + b[v];
    m = (std::isnan(t) || t > m) ? t : m;
  }
  return m;
}

// x[v] <- exp(x[v] + b[v] - m); returns their sum, added in chunks (each lane adds ~64 terms at a time,
// not V / lanes: the error of a float32 sum grows with the length of its serial chains)
float exp_in_place(float* x, const float* b, float m, int64_t V) {
  const Vec shift(m);
  Vec total(0.0f);
  int64_t v = 0;
  while (v + Vec::size() <= V) {
    Vec partial(0.0f);
    const int64_t stop = std::min(V - Vec::size() + 1, v + kChunk);
    for (; v < stop; v += Vec::size()) {
      const Vec e = ((Vec::loadu(x + v) + Vec::loadu(b + v)) - shift).exp();
      e.store(x + v);
      partial = partial + e;
    }
    total = total + partial;
  }
  float sum = at::vec::vec_reduce_all<float>([](Vec& p, Vec& q) { return p + q; }, total);
  for (; v < V; ++v) {
    x[v] = std::exp((x[v] + b[v]) - m);
    sum += x[v];
  }
  return sum;
}

// x[v] <- x[v] * scale, also added into acc[v]
void scale_and_accumulate(float* x, float scale, float* acc, int64_t V) {
  const Vec factor(scale);
  int64_t v = 0;
  for (; v + Vec::size() <= V; v += Vec::size()) {
    const Vec g = Vec::loadu(x + v) * factor;
    g.store(x + v);
    (Vec::loadu(acc + v) + g).store(acc + v);
  }
  for (; v < V; ++v) {
    x[v] *= scale;
    acc[v] += x[v];
  }
}

}  // namespace

// Cross-entropy of rows [start, end) of ``logits`` (N, V) + ``bias`` (V,) against ``labels`` (N,), in
// place: the same arithmetic as the block passes of spanlm.heads.losses._decode, one row at a time, so
// that a row (V floats) stays in cache from its first pass to its last:
//   m = max(x + b); x <- exp(x + b − m); Z = Σ x; loss = (log Z − (x_y + b_y − m)) · ok; hit = ok ∧ x_y + b_y ≥ m;
//   with ``bias_grad``: x <- x / Z − onehot(y) (0 for rows that are not targets), and bias_grad += Σ_rows x.
// Each thread adds its rows' gradients into its own (V,) sum; the sums join in thread order (deterministic
// for a given thread count).
void softmax_cross_entropy_rows(at::Tensor logits, const at::Tensor& bias, const at::Tensor& labels,
                                const at::Tensor& valid, at::Tensor losses, at::Tensor hits,
                                std::optional<at::Tensor> bias_grad, int64_t start, int64_t end) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.is_contiguous(), "logits: contiguous float32 (N, V)");
  const int64_t N = logits.size(0), V = logits.size(1);
  TORCH_CHECK(bias.scalar_type() == at::kFloat && bias.is_contiguous() && bias.numel() == V, "bias: contiguous float32 (V,)");
  TORCH_CHECK(labels.scalar_type() == at::kLong && labels.is_contiguous() && labels.numel() == N, "labels: contiguous int64 (N,)");
  TORCH_CHECK(valid.scalar_type() == at::kBool && valid.is_contiguous() && valid.numel() == N, "valid: contiguous bool (N,)");
  TORCH_CHECK(losses.scalar_type() == at::kFloat && losses.is_contiguous() && losses.numel() == N, "losses: contiguous float32 (N,)");
  TORCH_CHECK(hits.scalar_type() == at::kBool && hits.is_contiguous() && hits.numel() == N, "hits: contiguous bool (N,)");
  TORCH_CHECK(0 <= start && start <= end && end <= N, "rows out of range");
  const bool gradient = bias_grad.has_value();
  if (gradient) {
    TORCH_CHECK(bias_grad->scalar_type() == at::kFloat && bias_grad->is_contiguous() && bias_grad->numel() == V,
                "bias_grad: contiguous float32 (V,)");
  }
  float* rows = logits.data_ptr<float>();
  const float* b = bias.data_ptr<float>();
  const int64_t* y = labels.data_ptr<int64_t>();
  const bool* ok = valid.data_ptr<bool>();
  float* loss = losses.data_ptr<float>();
  bool* hit = hits.data_ptr<bool>();
  for (int64_t r = start; r < end; ++r) TORCH_CHECK(0 <= y[r] && y[r] < V, "label ", y[r], " out of range [0, ", V, ")");

  const int threads = at::get_num_threads();
  std::vector<float> sums(gradient ? static_cast<size_t>(threads) * V : 0, 0.0f);
  std::vector<char> used(threads, 0);
  at::parallel_for(start, end, 1, [&](int64_t first, int64_t last) {
    const int thread = at::get_thread_num();
    float* sum = gradient ? sums.data() + static_cast<size_t>(thread) * V : nullptr;
    used[thread] = 1;
    for (int64_t r = first; r < last; ++r) {
      float* x = rows + r * V;
      const int64_t label = y[r];
      const float m = shifted_max(x, b, V);
      const float label_logit = x[label] + b[label];
      const float partition = exp_in_place(x, b, m, V);
      loss[r] = ok[r] ? std::log(partition) - (label_logit - m) : 0.0f;
      hit[r] = ok[r] && label_logit >= m;
      if (!gradient) continue;
      if (!ok[r]) {
        std::fill(x, x + V, 0.0f);
        continue;
      }
      scale_and_accumulate(x, 1.0f / partition, sum, V);
      x[label] -= 1.0f;
      sum[label] -= 1.0f;
    }
  });
  if (gradient) {
    float* out = bias_grad->data_ptr<float>();
    for (int t = 0; t < threads; ++t) {
      if (!used[t]) continue;
      const float* sum = sums.data() + static_cast<size_t>(t) * V;
      int64_t v = 0;
      for (; v + Vec::size() <= V; v += Vec::size()) (Vec::loadu(out + v) + Vec::loadu(sum + v)).store(out + v);
      for (; v < V; ++v) out[v] += sum[v];
    }
  }
}

// Σ x² over every element of ``tensors`` (contiguous float32), for the gradient-clipping norm: the squares
// are added in float32 over 1,024 elements at a time (64 per vector lane) and those sums in float64, in a
// fixed order of 32,768-element pieces, so the result does not depend on the thread count. One call for
// all of a model's gradients, where torch.linalg.vector_norm takes one per gradient (and accumulates a
// large one serially in float32: 2·10⁻⁴ off on a 7.8M-element embedding gradient).
double sum_of_squares(const std::vector<at::Tensor>& tensors) {
  constexpr int64_t kPiece = 32768, kBlock = 1024;
  std::vector<std::pair<const float*, int64_t>> pieces;
  for (const at::Tensor& t : tensors) {
    TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.device().is_cpu(),
                "sum_of_squares: contiguous float32 CPU tensors");
    const float* data = t.data_ptr<float>();
    for (int64_t start = 0; start < t.numel(); start += kPiece) pieces.emplace_back(data + start, std::min(kPiece, t.numel() - start));
  }
  std::vector<double> sums(pieces.size(), 0.0);
  at::parallel_for(0, static_cast<int64_t>(pieces.size()), 1, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i) {
      const float* const x = pieces[i].first;
      const int64_t n = pieces[i].second;
      double sum = 0.0;
      for (int64_t block = 0; block < n; block += kBlock) {
        const int64_t end = std::min(n, block + kBlock);
        Vec squares(0.0f);
        int64_t v = block;
        for (; v + Vec::size() <= end; v += Vec::size()) {
          const Vec value = Vec::loadu(x + v);
          squares = at::vec::fmadd(value, value, squares);
        }
        float partial = at::vec::vec_reduce_all<float>([](Vec& p, Vec& q) { return p + q; }, squares);
        for (; v < end; ++v) partial += x[v] * x[v];
        sum += partial;
      }
      sums[i] = sum;
    }
  });
  double total = 0.0;
  for (const double sum : sums) total += sum;
  return total;
}

// SplitMix64 (see spanlm/models/splitmix.py): output j of the stream keyed by ``key``
inline uint64_t splitmix64(uint64_t key, uint64_t j) {
  uint64_t z = key + (j + 1) * 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// out = x · dropout's multiplier, formed on the fly: element i of x, in its logical (row-major) order, is
// kept (times ``kept``) when the i-th 16-bit quarter of the SplitMix64 words from ``key`` — four per word,
// low quarter first, as NumPy's int16 view of the words on a little-endian machine — read as a signed
// int16 is ≥ ``threshold``: spanlm.accel.dropout's decisions. No mask is stored; the backward pass applies
// the same function to the upstream gradient (dropout is linear in x). x and out have equal sizes and may
// be one tensor or strided views (e.g. with two leading dimensions transposed) whose trailing dimensions
// are dense; the result is x · kept or x · 0, exactly what the float multiplier gives (NaN stays NaN).
void dropout_apply(const at::Tensor& x, at::Tensor out, uint64_t key, int64_t threshold, double kept) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && out.scalar_type() == at::kFloat && x.sizes() == out.sizes(),
              "dropout_apply: float32 x and out of equal sizes");
  TORCH_CHECK(-32768 <= threshold && threshold <= 32767, "dropout_apply: bad threshold");
  const int64_t numel = x.numel();
  if (numel == 0) return;
  // The longest run of trailing dimensions that is dense in both tensors: rows of ``inner`` elements.
  const int64_t dims = x.dim();
  int64_t inner = 1, outer_dims = dims;
  while (outer_dims > 0 && x.stride(outer_dims - 1) == inner && out.stride(outer_dims - 1) == inner) {
    inner *= x.size(outer_dims - 1);
    --outer_dims;
  }
  TORCH_CHECK(inner > 1 || dims == 0 || numel == 1, "dropout_apply: the last dimension must be dense");
  std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().begin() + outer_dims);
  std::vector<int64_t> x_strides(x.strides().begin(), x.strides().begin() + outer_dims);
  std::vector<int64_t> out_strides(out.strides().begin(), out.strides().begin() + outer_dims);
  const float* const x_base = x.data_ptr<float>();
  float* const out_base = out.data_ptr<float>();
  const float value = static_cast<float>(kept);
  const int16_t level = static_cast<int16_t>(threshold);
  constexpr int64_t kWords = 256;
  const int64_t words = (numel + 3) / 4;
  at::parallel_for(0, words, 16 * kWords, [&, value, level, key, inner](int64_t first, int64_t last) {
    const float keep = value;
    const int16_t drop_below = level;
    const uint64_t stream = key;
    uint64_t buffer[kWords];
    int16_t quarters[4 * kWords];
    for (int64_t w = first; w < last; w += kWords) {
      const int64_t count = std::min(kWords, last - w);
      for (int64_t t = 0; t < count; ++t) buffer[t] = splitmix64(stream, static_cast<uint64_t>(w + t));
      std::memcpy(quarters, buffer, count * sizeof(uint64_t));
      const int64_t begin = 4 * w, end = std::min(begin + 4 * count, numel);
      for (int64_t e = begin; e < end;) {  // one dense stretch of a row at a time
        const int64_t row = e / inner, column = e - row * inner, stretch = std::min(inner - column, end - e);
        int64_t x_offset = column, out_offset = column;
        for (int64_t d = outer_dims - 1, rest = row; d >= 0; --d) {
          const int64_t index = rest % sizes[d];
          rest /= sizes[d];
          x_offset += index * x_strides[d];
          out_offset += index * out_strides[d];
        }
        const float* const in = x_base + x_offset;
        float* const to = out_base + out_offset;
        const int16_t* const q = quarters + (e - begin);
        for (int64_t t = 0; t < stretch; ++t) to[t] = in[t] * (q[t] >= drop_below ? keep : 0.0f);
        e += stretch;
      }
    }
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("sum_of_squares", &sum_of_squares, "Σ x² over all elements of a list of float32 tensors (see kernels.cpp)");
  m.def("dropout_apply", &dropout_apply, "x times dropout's keep multipliers, formed on the fly (see kernels.cpp)");
  m.def("softmax_cross_entropy_rows", &softmax_cross_entropy_rows,
        "cross-entropy of logit rows [start, end) in place (see kernels.cpp)");
}
