// The fused head's GEMMs: fp32 throughout for fp32 heads and for bf16 heads under kFp32
// (upcast once per call), bf16 GEMMs with logits rounded to bf16 under kInput.
#include "head_gemms.hpp"

#include <ATen/ATen.h>

#include <algorithm>

#include "cpkit/optimized/error.hpp"
#include "tensor_checks.hpp"

namespace cpkit {

LogitsPrecision parse_logits_precision(const std::string& name) {
  if (name == "input") return LogitsPrecision::kInput;
  if (name == "fp32") return LogitsPrecision::kFp32;
  raise("logits_precision", "must be \"fp32\" or \"input\", got \"", name, "\"");
}

namespace detail {

void check_head_inputs(const at::Tensor& hidden, const at::Tensor& weight, double softcap,
                       int64_t chunk_rows) {
  if (chunk_rows < 0) raise("chunk_rows", "must be >= 0 (0: the default), got ", chunk_rows);
  check_softcap(softcap);
  require_defined(hidden, "hidden");
  require_defined(weight, "weight");
  require_dim(hidden, 3, "hidden");
  require_dim(weight, 2, "weight");
  if (hidden.scalar_type() != at::kFloat && hidden.scalar_type() != at::kBFloat16)
    raise("hidden", "must be float32 or bfloat16, got ", hidden.scalar_type());
  if (weight.scalar_type() != hidden.scalar_type())
    raise("weight", "dtype ", weight.scalar_type(), " differs from hidden's ",
          hidden.scalar_type());
  if (weight.device() != hidden.device())
    raise("weight", "is on ", weight.device(), " but hidden is on ", hidden.device());
  if (hidden.size(0) == 0 || hidden.size(1) == 0)
    raise("hidden", "empty batch: shape ", shape_of(hidden));
  if (hidden.size(2) == 0) raise("hidden", "has no features: shape ", shape_of(hidden));
  if (weight.size(1) != hidden.size(2))
    raise("weight", "must be [V, H] with H = ", hidden.size(2), " (hidden's last dimension), got ",
          shape_of(weight));
  if (weight.size(0) < 2) raise("weight", "vocabulary size must be >= 2, got ", weight.size(0));
}

namespace {

constexpr int64_t kCudaChunkBytes = int64_t{1} << 30;
// On the CPU every chunk repacks the whole [V, H] weight for two GEMMs and reads and writes
// d weight once; past 512 rows nothing more was gained (docs/performance.md).
constexpr int64_t kCpuMaxChunkRows = 512;
constexpr int64_t kChunkRowMultiple = 64;  // whole tiles for the matmuls

}  // namespace

int64_t default_chunk_rows(int64_t vocab, int64_t rows, bool cuda, int64_t cpu_budget) {
  const int64_t budget = cuda ? kCudaChunkBytes : cpu_budget;
  int64_t chunk = std::max<int64_t>(1, budget / (vocab * static_cast<int64_t>(sizeof(float))));
  if (!cuda) chunk = std::min(chunk, kCpuMaxChunkRows);
  if (chunk >= kChunkRowMultiple) chunk -= chunk % kChunkRowMultiple;
  return std::max<int64_t>(1, std::min(chunk, rows));
}

bool vocab_major(const at::Tensor& z, const char* name) {
  // First: a single row is both, and vocab-major is the layout every CPU kernel reads.
  if (z.dim() == 2 && z.t().is_contiguous()) {
    if (z.is_cuda() && z.size(0) > 1)
      raise(name, "the CUDA kernels read row-major logits, got vocab-major ", shape_of(z));
    return true;
  }
  if (z.is_contiguous()) return false;
  raise(name, "must be contiguous [n, V] or its vocab-major transpose, got shape ", shape_of(z),
        " and strides ", z.strides());
}

HeadGemms::HeadGemms(const at::Tensor& hidden, const at::Tensor& weight, LogitsPrecision precision,
                     int64_t chunk_rows, int64_t cpu_budget)
    : round_(hidden.scalar_type() != at::kFloat && precision == LogitsPrecision::kInput),
      chunk_(chunk_rows > 0 ? std::min(chunk_rows, hidden.size(0))
                            : default_chunk_rows(weight.size(0), hidden.size(0), hidden.is_cuda(),
                                                 cpu_budget)),
      vocab_major_(!hidden.is_cuda()) {
  hidden_ = round_ ? hidden : hidden.to(at::kFloat);
  weight_ = round_ ? weight : weight.to(at::kFloat);
  buffer_ = at::empty({chunk_ * weight.size(0)}, hidden.options().dtype(at::kFloat));
}

at::Tensor HeadGemms::logits(int64_t begin, int64_t n) const {
  const int64_t V = weight_.size(0);
  const at::Tensor z = buffer_.narrow(0, 0, n * V);
  at::Tensor out = vocab_major_ ? z.view({V, n}).t() : z.view({n, V});
  const at::Tensor h = hidden_.narrow(0, begin, n);
  if (round_)
    out.copy_(at::mm(h, weight_.t()));  // the bf16 head's logits, then fp32 (HF's .float())
  else
    at::mm_out(out, h, weight_.t());  // writes into the strided view, no copy
  return out;
}

at::Tensor HeadGemms::gradient_operand(const at::Tensor& g) const {
  return round_ ? g.to(hidden_.scalar_type()) : g;
}

void HeadGemms::grad_hidden(const at::Tensor& g, const at::Tensor& out) const {
  at::Tensor o = out;
  if (o.scalar_type() == g.scalar_type())
    at::mm_out(o, g, weight_);
  else
    o.copy_(at::mm(g, weight_));  // fp32 products and sums, rounded once to bf16
}

// bf16 g and h (kInput): products and sums in fp32, never rounded to bf16 between chunks; on
// CUDA one bf16 tensor-core GEMM with fp32 output (an fp32 GEMM of upcast copies runs ~10x
// slower there), on the CPU the same values through an fp32 GEMM.
void HeadGemms::accumulate_grad_weight(const at::Tensor& acc, const at::Tensor& g, int64_t begin,
                                       bool first) const {
  const at::Tensor h = hidden_.narrow(0, begin, g.size(0));
  at::Tensor out = acc;
  if (g.scalar_type() == at::kFloat || !g.is_cuda()) {
    const at::Tensor g32 = g.to(at::kFloat), h32 = h.to(at::kFloat);
    if (first)
      at::mm_out(out, g32.t(), h32);
    else
      out.addmm_(g32.t(), h32);
  } else if (first) {
    at::mm_out(out, g.t(), h, at::kFloat);
  } else {
    at::addmm_out(out, out, g.t(), h, at::kFloat);
  }
}

}  // namespace detail
}  // namespace cpkit
