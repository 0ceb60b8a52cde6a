// cp_attention: checks and the ranks' agreement, the needed keys out and in (one
// all_to_all_v of keys and values together) under the own keys' stage, then the received
// keys' stage, merged by log-sum-exp; the backward computes the received keys' gradients
// first and returns them to their owners under the own keys' stage.
#include "cpkit/optimized/cp_attention.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <tuple>
#include <vector>

#include "agreement.hpp"
#include "attention_flash.hpp"
#include "cpkit/optimized/error.hpp"
#include "cuda_glue.hpp"
#include "fault_injection.hpp"
#include "kernels/attention_launch.hpp"
#include "mesh_capsule.hpp"
#include "tensor_checks.hpp"

namespace cpkit {

namespace {

struct Shape {
  int64_t rows, len, hq, hkv, d;
};

Shape check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const AttentionPlan& plan, const MeshPtr& mesh,
                   const CpAttentionOptions& options) {
  for (const auto& [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}}) {
    detail::require_defined(*t, name);
    detail::require_dim(*t, 4, name);
    if (t->scalar_type() != at::kFloat && t->scalar_type() != at::kBFloat16 &&
        t->scalar_type() != at::kHalf)
      raise(name, "must be float32, bfloat16 or float16, got ", t->scalar_type());
    if (t->scalar_type() != q.scalar_type() || t->device() != q.device())
      raise(name, "must share q's dtype and device (", q.scalar_type(), ", ", q.device(), "), got ",
            t->scalar_type(), ", ", t->device());
  }
  if (!q.device().is_cpu() && !q.device().is_cuda())
    raise("q", "is on ", q.device(), ": cp_attention runs on CPU and CUDA tensors");
  const Shape s{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3)};
  if (q.device().is_cuda() && s.d > kernels::kMaxCudaHeadDim)
    raise("q", "has head size D = ", s.d,
          ": cp_attention's CUDA kernel takes D <= ", kernels::kMaxCudaHeadDim);
  if (k.sizes() != v.sizes())
    raise("v", "has shape ", detail::shape_of(v), " but k has ", detail::shape_of(k));
  if (k.size(0) != s.rows || k.size(1) != s.len || k.size(3) != s.d)
    raise("k", "has shape ", detail::shape_of(k), " but q ", detail::shape_of(q),
          " needs [rows, L, Hkv, D] = [", s.rows, ", ", s.len, ", Hkv, ", s.d, "]");
  if (s.hkv < 1 || s.hq % s.hkv != 0)
    raise("q", "has ", s.hq, " heads, not a multiple of k's ", s.hkv);
  if (s.rows != plan.rows || s.len != plan.local_len)
    raise("plan", "is for [rows, L] = [", plan.rows, ", ", plan.local_len, "] but q is [", s.rows,
          ", ", s.len, ", ...]");
  if (plan.cp_size != cp_size(mesh) || plan.rank != cp_rank(mesh))
    raise("plan", "is rank ", plan.rank, " of CP ", plan.cp_size, " but the mesh is rank ",
          cp_rank(mesh), " of ", cp_size(mesh));
  if (!(options.scale >= 0) || !std::isfinite(options.scale))
    raise("scale", "must be finite and >= 0 (0: 1 / sqrt(D)), got ", options.scale);
  if (!(options.softcap >= 0) || !std::isfinite(options.softcap))
    raise("softcap", "must be finite and >= 0, got ", options.softcap);
  if (options.sinks.defined() &&
      (options.sinks.dim() != 1 || options.sinks.size(0) != s.hq ||
       options.sinks.scalar_type() != at::kFloat || options.sinks.device() != q.device()))
    raise("sinks", "must be [Hq] = [", s.hq, "] float32 on ", q.device(), ", got ",
          detail::shape_of(options.sinks), " ", options.sinks.scalar_type(), " on ",
          options.sinks.device());
  return s;
}

// Every rank publishes what the exchange needs; the counts it sends to and expects from
// each peer ride along, so a rank whose plan came from another shard raises with the rest.
void check_ranks_agree(const Shape& s, const at::Tensor& q, const AttentionPlan& plan,
                       const MeshPtr& mesh, const CpAttentionOptions& options) {
  if (cp_size(mesh) == 1) return;
  const int cp = plan.cp_size;
  std::vector<int64_t> counts;
  for (const auto& list : plan.send) counts.push_back(static_cast<int64_t>(list.size()));
  for (const auto& list : plan.recv) counts.push_back(static_cast<int64_t>(list.size()));
  const std::vector<detail::Agreed> fields{
      {"q", "the number of rows", s.rows},
      {"q", "the local length L", s.len},
      {"q", "the number of query heads", s.hq},
      {"k", "the number of key heads", s.hkv},
      {"q", "the head size D", s.d},
      {"q", "the dtype", detail::dtype_code(q), detail::dtype_name},
      {"plan", "the window", plan.window},
      {"softcap", "the soft cap (bits)", std::bit_cast<int64_t>(options.softcap)},
      {"scale", "the scale (bits)", std::bit_cast<int64_t>(options.scale)},
      {"sinks", "sinks", options.sinks.defined() ? 1 : 0},
  };
  // On a GPU a new plan or shape is read once (then each layer reuses the plan unread).
  std::vector<int64_t> key = counts;
  for (const detail::Agreed& field : fields) key.push_back(field.value);
  const bool read = detail::agreement_needs_reading(q, mesh, std::move(key));
  const at::Tensor table = detail::exchange_agreed(
      detail::upload(at::tensor(counts, at::kLong), q.device(), "cp_attention's key counts"),
      fields, *mesh, read, "every CP rank must attend with one plan");
  if (!read) return;
  const at::Tensor host = table.cpu();
  const int64_t* t = host.const_data_ptr<int64_t>();
  const int64_t width = host.size(1), me = plan.rank;
  for (int o = 0; o < cp; ++o)
    if (t[o * width + me] != t[me * width + cp + o])
      raise("plan", "rank ", me, " expects ", t[me * width + cp + o], " keys from rank ", o,
            " but rank ", o, " plans to send ", t[o * width + me],
            ": every rank's plan must come from the same shard (attention_plan of the same "
            "sharder and microbatch, with one window)");
}

// The send lists as one index tensor on `device`, and the element counts of a
// [n, 2, Hkv, D] exchange.
at::Tensor send_index(const AttentionPlan& plan, const at::Device& device) {
  std::vector<int64_t> all;
  for (const auto& list : plan.send) all.insert(all.end(), list.begin(), list.end());
  return detail::upload(at::tensor(all, at::kLong), device, "cp_attention's send lists");
}

std::vector<std::size_t> element_counts(const std::vector<std::vector<int64_t>>& lists,
                                        int64_t per_key) {
  std::vector<std::size_t> out;
  for (const auto& list : lists) out.push_back(static_cast<std::size_t>(list.size() * per_key));
  return out;
}

// A KeyIndex where the kernel reads it: the plan's vectors on the CPU, an upload on a GPU
// (freed once the kernels reading it are enqueued: the allocator orders any reuse after them).
struct KernelIndex {
  const int64_t *slots, *begin, *end;
  std::vector<at::Tensor> uploads;
};

KernelIndex kernel_index(const KeyIndex& index, const at::Device& device) {
  if (device.is_cpu()) return {index.slots.data(), index.begin.data(), index.end.data(), {}};
  KernelIndex k{};
  for (const std::vector<int64_t>* part : {&index.slots, &index.begin, &index.end})
    k.uploads.push_back(
        detail::upload(at::tensor(*part, at::kLong), device, "cp_attention's key index"));
  k.slots = k.uploads[0].const_data_ptr<int64_t>();
  k.begin = k.uploads[1].const_data_ptr<int64_t>();
  k.end = k.uploads[2].const_data_ptr<int64_t>();
  return k;
}

double scale_of(const Shape& s, const CpAttentionOptions& options) {
  return options.scale > 0 ? options.scale : 1.0 / std::sqrt(static_cast<double>(s.d));
}

// The stages on torch's flash kernels where they take the inputs and the plan has a varlen
// form; else cpkit's own kernels run.
std::optional<detail::FlashStages> flash_stages_for(const at::Tensor& q, const AttentionPlan& plan,
                                                    const CpAttentionOptions& options) {
  if (!detail::flash_takes(q, options)) return std::nullopt;
  return detail::flash_stages(plan);
}

// The kernel's arguments over `index`, reading key slots from `keys` / `values` starting at
// slot `first_slot`; sinks only where `with_sinks` (the first stage holds them).
kernels::AttentionArgs kernel_args(const Shape& s, const at::Tensor& q, const at::Tensor& keys,
                                   const at::Tensor& values, const KernelIndex& index,
                                   int64_t first_slot, const CpAttentionOptions& options,
                                   bool with_sinks) {
  kernels::AttentionArgs a{};
  a.q = q.const_data_ptr<float>();
  a.k = keys.const_data_ptr<float>();
  a.v = values.const_data_ptr<float>();
  a.key_slots = index.slots;
  a.key_begin = index.begin;
  a.key_end = index.end;
  a.slot_offset = first_slot;
  a.sinks = with_sinks && options.sinks.defined() ? options.sinks.const_data_ptr<float>() : nullptr;
  a.queries = s.rows * s.len;
  a.keys = keys.size(0);
  a.hq = s.hq;
  a.hkv = s.hkv;
  a.d = s.d;
  a.scale = static_cast<float>(scale_of(s, options));
  a.softcap = static_cast<float>(options.softcap);
  return a;
}

// The kernels on `on`'s device.
void forward_kernel(const kernels::AttentionArgs& a, const at::Tensor& on) {
  if (on.is_cpu()) return kernels::attention_forward_cpu(a);
  detail::launch_on(on, [&](void* stream) { kernels::attention_forward_cuda(a, stream); });
}

void backward_kernel(const kernels::AttentionArgs& a, const at::Tensor& on) {
  if (on.is_cpu()) return kernels::attention_backward_cpu(a);
  detail::launch_on(on, [&](void* stream) { kernels::attention_backward_cuda(a, stream); });
}

// One stage of the forward: out [rows, L, Hq, D] and lse [rows, L, Hq] over `index`'s keys.
std::pair<at::Tensor, at::Tensor> attend(const Shape& s, const at::Tensor& q32,
                                         const at::Tensor& keys, const at::Tensor& values,
                                         const KeyIndex& index, int64_t first_slot,
                                         const CpAttentionOptions& options, bool with_sinks) {
  at::Tensor out = at::empty({s.rows, s.len, s.hq, s.d}, q32.options());
  at::Tensor lse = at::empty({s.rows, s.len, s.hq}, q32.options());
  const KernelIndex on_device = kernel_index(index, q32.device());
  kernels::AttentionArgs a =
      kernel_args(s, q32, keys, values, on_device, first_slot, options, with_sinks);
  a.out = out.data_ptr<float>();
  a.lse = lse.data_ptr<float>();
  forward_kernel(a, q32);
  return {out, lse};
}

// The rows of k or v as the kernel's fp32 [slots, Hkv, D].
at::Tensor as_slots(const Shape& s, const at::Tensor& t) {
  return t.reshape({-1, s.hkv, s.d}).to(at::kFloat).contiguous();
}

// One forward stage on the flash kernels: out [rows, L, Hq, D] and lse [rows, L, Hq] (float32)
// over `runs`' sequences, written into `into` when given (other queries keep their values),
// else into zeros and -inf (what a query that sees nothing gets).
std::pair<at::Tensor, at::Tensor> flash_attend(const Shape& s, const at::Tensor& q,
                                               const at::Tensor& keys, const at::Tensor& values,
                                               int64_t first_slot, const detail::VarlenRuns& runs,
                                               const CpAttentionOptions& options,
                                               std::pair<at::Tensor, at::Tensor> into = {}) {
  if (!into.first.defined()) {
    const auto f32 = q.options().dtype(at::kFloat);
    into = {at::zeros({s.rows, s.len, s.hq, s.d}, f32),
            at::full({s.rows, s.len, s.hq}, -std::numeric_limits<float>::infinity(), f32)};
  }
  at::Tensor out = into.first.view({-1, s.hq, s.d}), lse = into.second.view({-1, s.hq});
  detail::flash_forward({q.reshape({-1, s.hq, s.d}), keys.reshape({-1, s.hkv, s.d}),
                         values.reshape({-1, s.hkv, s.d}), first_slot, scale_of(s, options)},
                        runs, out, lse);
  return into;
}

// The process's CpAttentionStats.
std::mutex stats_mutex;
CpAttentionStats stats;

void record(const std::function<void(CpAttentionStats&)>& update) {
  const std::lock_guard<std::mutex> lock(stats_mutex);
  update(stats);
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

CpAttentionStats cp_attention_stats() {
  const std::lock_guard<std::mutex> lock(stats_mutex);
  return stats;
}

void reset_cp_attention_stats() {
  const std::lock_guard<std::mutex> lock(stats_mutex);
  stats = {};
}

std::int64_t cp_attention_received_bytes(const AttentionPlan& plan, std::int64_t hkv,
                                         std::int64_t head_dim, std::int64_t itemsize) {
  return 2 * plan.received_keys() * hkv * head_dim * itemsize;
}

CpAttentionForward cp_attention_forward(const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, const AttentionPlan& plan,
                                        const MeshPtr& mesh, const CpAttentionOptions& options) {
  const Shape s = check_inputs(q, k, v, plan, mesh, options);
  check_ranks_agree(s, q, plan, mesh, options);
  const int64_t own = s.rows * s.len, per_key = 2 * s.hkv * s.d;
  at::Tensor received = at::empty({plan.received_keys(), 2, s.hkv, s.d}, k.options());
  // Stage 0: the needed keys and values leave; the exchange runs under stage 1.
  at::Tensor outgoing;
  std::function<void()> arrived = [] {};
  if (cp_size(mesh) > 1) {
    const at::Tensor index = send_index(plan, k.device());
    outgoing = at::stack({k.reshape({-1, s.hkv, s.d}).index_select(0, index),
                          v.reshape({-1, s.hkv, s.d}).index_select(0, index)},
                         1)
                   .contiguous();
    arrived = mesh->start_all_to_all_v(outgoing.data_ptr(), element_counts(plan.send, per_key),
                                       received.data_ptr(), element_counts(plan.recv, per_key),
                                       detail::scalar_kind(k, "k"));
  }
  // Stage 1: own keys (and the sinks).
  const std::optional<detail::FlashStages> flash = flash_stages_for(q, plan, options);
  const at::Tensor q32 = flash ? at::Tensor() : q.to(at::kFloat).contiguous();
  auto [out, lse] =
      flash ? flash_attend(s, q, k, v, 0, flash->first, options)
            : attend(s, q32, as_slots(s, k), as_slots(s, v), plan.own_keys, 0, options, true);
  const auto waiting = Clock::now();
  arrived();
  const double exposed = seconds_since(waiting);
  record([&](CpAttentionStats& st) {
    ++st.calls;
    st.bytes_received += received.nbytes();
    st.bytes_sent += outgoing.defined() ? outgoing.nbytes() : 0;
    st.forward_exposed_seconds += exposed;
  });
  const at::Tensor received_k = received.select(1, 0), received_v = received.select(1, 1);
  if (flash && !flash->merge) {  // Stage 2: the other queries, over every key slot.
    if (!flash->second.empty())
      std::tie(out, lse) = flash_attend(s, q, at::cat({k.reshape({-1, s.hkv, s.d}), received_k}),
                                        at::cat({v.reshape({-1, s.hkv, s.d}), received_v}), 0,
                                        flash->second, options, {out, lse});
  } else if (received.size(0) > 0) {
    // Stage 2: the received keys, merged by log-sum-exp (softmaxes over disjoint key sets).
    const auto [remote_out, remote_lse] =
        flash ? flash_attend(s, q, received_k, received_v, own, flash->second, options)
              : attend(s, q32, as_slots(s, received_k), as_slots(s, received_v), plan.remote_keys,
                       own, options, false);
    const at::Tensor merged = at::logaddexp(lse, remote_lse);
    auto share = [&](const at::Tensor& part) {
      return at::exp(part - merged).nan_to_num(0.0).unsqueeze(-1);  // 0 where nothing is seen
    };
    out = out * share(lse) + remote_out * share(remote_lse);
    lse = merged;
  }
  return {{out.to(q.scalar_type()), lse.permute({0, 2, 1})}, received};
}

CpAttentionGrads cp_attention_backward(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v, const CpAttentionForward& forward,
                                       const at::Tensor& grad_out, const AttentionPlan& plan,
                                       const MeshPtr& mesh, const CpAttentionOptions& options) {
  const Shape s = check_inputs(q, k, v, plan, mesh, options);
  detail::require_defined(grad_out, "grad_out");
  if (grad_out.sizes() != q.sizes())
    raise("grad_out", "has shape ", detail::shape_of(grad_out), " but q is ", detail::shape_of(q));
  const std::optional<detail::FlashStages> flash = flash_stages_for(q, plan, options);
  // cpkit's kernels read float32 copies; flash reads q's dtype.
  auto as_kernel_input = [&](const at::Tensor& t) {
    return flash ? t.to(q.scalar_type()).contiguous() : t.to(at::kFloat).contiguous();
  };
  const at::Tensor q_in = as_kernel_input(q), out = as_kernel_input(forward.values.out);
  const at::Tensor lse = forward.values.lse.permute({0, 2, 1}).contiguous();
  const at::Tensor d_out = as_kernel_input(grad_out);
  // One stage of the backward: the gradients over key slots [first_slot, ...) of `keys` and
  // `values` ([slots, Hkv, D] in k's dtype), listed by `index` (cpkit's kernels) or `runs`
  // (flash's). Each probability comes from the merged lse and delta from the merged out, so
  // the key sets split exactly.
  auto gradients = [&](const at::Tensor& keys, const at::Tensor& values, const KeyIndex& index,
                       const detail::VarlenRuns* runs, int64_t first_slot, bool with_sinks) {
    if (runs != nullptr) {
      const auto f32 = q.options().dtype(at::kFloat);
      at::Tensor dq = at::zeros(q.sizes(), f32), dk = at::zeros({keys.size(0), s.hkv, s.d}, f32);
      at::Tensor dv = at::zeros_like(dk), dq_rows = dq.view({-1, s.hq, s.d});
      detail::flash_backward(
          {q_in.view({-1, s.hq, s.d}), keys, values, first_slot, scale_of(s, options)}, *runs,
          out.view({-1, s.hq, s.d}), lse.view({-1, s.hq}), d_out.view({-1, s.hq, s.d}), dq_rows, dk,
          dv);
      return std::tuple{dq, dk, dv, at::Tensor()};
    }
    const at::Tensor keys32 = as_slots(s, keys), values32 = as_slots(s, values);
    at::Tensor dq = at::empty_like(q_in), dk = at::empty_like(keys32);
    at::Tensor dv = at::empty_like(values32);
    at::Tensor dsinks =
        with_sinks && options.sinks.defined() ? at::zeros({s.hq}, q_in.options()) : at::Tensor();
    const KernelIndex on_device = kernel_index(index, q_in.device());
    kernels::AttentionArgs a =
        kernel_args(s, q_in, keys32, values32, on_device, first_slot, options, with_sinks);
    a.out = const_cast<float*>(out.const_data_ptr<float>());
    a.lse = const_cast<float*>(lse.const_data_ptr<float>());
    a.d_out = d_out.const_data_ptr<float>();
    a.dq = dq.data_ptr<float>();
    a.dk = dk.data_ptr<float>();
    a.dv = dv.data_ptr<float>();
    a.dsinks = dsinks.defined() ? dsinks.data_ptr<float>() : nullptr;
    backward_kernel(a, q_in);
    return std::tuple{dq, dk, dv, dsinks};
  };
  const int64_t own = s.rows * s.len, per_key = 2 * s.hkv * s.d;
  const at::Tensor own_k = k.reshape({-1, s.hkv, s.d}), own_v = v.reshape({-1, s.hkv, s.d});
  // Stage 1: the received keys' gradients, sent back to their owners under stage 2. On flash
  // with a window, stage 1 is the queries that see received keys, over every key slot: the
  // own slots' part stays here.
  at::Tensor dq_remote, dk_stay, dv_stay, outgoing, returned, index;
  std::function<void()> returned_arrived = [] {};
  if (cp_size(mesh) > 1) {
    const at::Tensor received_k = forward.received.select(1, 0);
    const at::Tensor received_v = forward.received.select(1, 1);
    const bool every_slot = flash && !flash->merge;
    auto [dq_r, dk_r, dv_r, unused] =
        every_slot ? gradients(at::cat({own_k, received_k}), at::cat({own_v, received_v}),
                               plan.all_keys, &flash->second, 0, false)
                   : gradients(received_k, received_v, plan.remote_keys,
                               flash ? &flash->second : nullptr, own, false);
    if (every_slot) {
      dk_stay = dk_r.narrow(0, 0, own);
      dv_stay = dv_r.narrow(0, 0, own);
      dk_r = dk_r.narrow(0, own, dk_r.size(0) - own);
      dv_r = dv_r.narrow(0, own, dv_r.size(0) - own);
    }
    dq_remote = dq_r;
    outgoing = at::stack({dk_r, dv_r}, 1).to(k.scalar_type()).contiguous();
    index = send_index(plan, k.device());
    returned = at::empty({index.size(0), 2, s.hkv, s.d}, k.options());
    returned_arrived = mesh->start_all_to_all_v(
        outgoing.data_ptr(), element_counts(plan.recv, per_key), returned.data_ptr(),
        element_counts(plan.send, per_key), detail::scalar_kind(k, "k"));
  }
  // Stage 2: own keys (and the sinks).
  auto [dq, dk_own, dv_own, dsinks] =
      gradients(own_k, own_v, plan.own_keys, flash ? &flash->first : nullptr, 0, true);
  if (cp_size(mesh) > 1) {
    const auto waiting = Clock::now();
    returned_arrived();
    const double exposed = seconds_since(waiting);
    record([&](CpAttentionStats& st) {
      st.bytes_received += returned.nbytes();
      st.bytes_sent += outgoing.nbytes();
      st.backward_exposed_seconds += exposed;
    });
    dq.add_(dq_remote);
    if (dk_stay.defined()) {
      dk_own.add_(dk_stay);
      dv_own.add_(dv_stay);
    }
    if (!detail::fault("attention_grads_not_returned")) {  // the owner's keys' other users
      dk_own.index_add_(0, index, returned.select(1, 0).to(at::kFloat));
      dv_own.index_add_(0, index, returned.select(1, 1).to(at::kFloat));
    }
  }
  return {dq.to(q.scalar_type()), dk_own.view(k.sizes()).to(k.scalar_type()),
          dv_own.view(v.sizes()).to(v.scalar_type()), dsinks};
}

namespace {

struct PlanHolder : torch::CustomClassHolder {
  explicit PlanHolder(std::shared_ptr<const AttentionPlan> p) : plan(std::move(p)) {}
  std::shared_ptr<const AttentionPlan> plan;
};

class CpAttentionFunction : public torch::autograd::Function<CpAttentionFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& v, const at::Tensor& sinks,
                                                const std::shared_ptr<const AttentionPlan>& plan,
                                                const MeshPtr& mesh, double scale, double softcap) {
    // An empty `sinks` stands for none (autograd inputs must be defined tensors).
    const CpAttentionOptions options{scale, softcap, sinks.numel() > 0 ? sinks : at::Tensor()};
    CpAttentionForward f = cp_attention_forward(q, k, v, *plan, mesh, options);
    ctx->save_for_backward({q, k, v, sinks, f.values.out, f.values.lse, f.received});
    ctx->saved_data["plan"] = c10::IValue::make_capsule(c10::make_intrusive<PlanHolder>(plan));
    ctx->saved_data["mesh"] = detail::mesh_capsule(mesh);
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["softcap"] = softcap;
    ctx->mark_non_differentiable({f.values.lse});
    return {f.values.out, f.values.lse};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto plan =
        c10::static_intrusive_pointer_cast<PlanHolder>(ctx->saved_data["plan"].toCapsule())->plan;
    const CpAttentionOptions options{ctx->saved_data["scale"].toDouble(),
                                     ctx->saved_data["softcap"].toDouble(),
                                     saved[3].numel() > 0 ? saved[3] : at::Tensor()};
    const CpAttentionForward f{{saved[4], saved[5]}, saved[6]};
    const at::Tensor grad_out = grads[0].defined() ? grads[0] : at::zeros_like(saved[4]);
    CpAttentionGrads g =
        cp_attention_backward(saved[0], saved[1], saved[2], f, grad_out, *plan,
                              detail::mesh_from_capsule(ctx->saved_data["mesh"]), options);
    return {g.q, g.k, g.v, g.sinks, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

CpAttentionOutput cp_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const std::shared_ptr<const AttentionPlan>& plan,
                               const MeshPtr& mesh, const CpAttentionOptions& options) {
  if (!plan) raise("plan", "is null: pass attention_plan(sharder, microbatch, rank, window)");
  const at::Tensor sinks = options.sinks.defined() ? options.sinks : at::empty({0}, q.options());
  const auto outs =
      CpAttentionFunction::apply(q, k, v, sinks, plan, mesh, options.scale, options.softcap);
  return {outs[0], outs[1]};
}

}  // namespace cpkit
