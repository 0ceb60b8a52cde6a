// Sharding one rank's shard (CP = 4): cpkit's Sharder, the narrow().contiguous() a user
// writes with LibTorch, and the reference. Bytes: the shard's primary read once + written once.
#include <ATen/ATen.h>

#include "bench_util.hpp"
#include "cpkit/optimized/sharder.hpp"
#include "cpkit/reference/sharder.hpp"

namespace {

constexpr int kCp = 4;
constexpr int kRank = 1;

at::ScalarType dtype_of(int64_t code) { return code == 16 ? at::kBFloat16 : at::kFloat; }

cpkit::CPBatch bshd_batch(int64_t S, int64_t H, at::ScalarType dtype) {
  cpkit::CPBatch b;
  // B = 2: a slice of one row of [1, S, H] would be a zero-copy view for every contender.
  b.inputs_embeds = at::randn({2, S, H}).to(dtype);
  b.labels = at::randint(0, 32000, {2, S}, at::kLong);
  return b;
}

double shard_bytes(int64_t S, int64_t H, at::ScalarType dtype) {
  return 2.0 * 2.0 * static_cast<double>(S / kCp * H) *
         static_cast<double>(c10::elementSize(dtype));
}

void run_bshd_optimized(benchmark::State& state) {
  const auto dtype = dtype_of(state.range(2));
  const cpkit::CPBatch batch = bshd_batch(state.range(0), state.range(1), dtype);
  const auto step = [&] {
    const cpkit::Sharder s = cpkit::prepare_cp_inputs_for(batch, kCp);
    const cpkit::LocalShard local = s.local(0, kRank);
    benchmark::DoNotOptimize(local.inputs_embeds.data_ptr());
  };
  step();  // untimed first step (steady state, as in training)
  for (auto _ : state) step();
  cpkit::bench::set_bytes(state, shard_bytes(state.range(0), state.range(1), dtype));
}

// Args: S, H, dtype bits (32 or 16)
void BM_ShardBshd_Optimized(benchmark::State& state) { run_bshd_optimized(state); }

void BM_ShardBshd_OptimizedNoCache(benchmark::State& state) {
  const cpkit::bench::HostCacheOff off;
  run_bshd_optimized(state);
}

void BM_ShardBshd_Torch(benchmark::State& state) {
  const auto dtype = dtype_of(state.range(2));
  const cpkit::CPBatch batch = bshd_batch(state.range(0), state.range(1), dtype);
  const int64_t L = state.range(0) / kCp;
  const auto step = [&] {
    const at::Tensor embeds = batch.inputs_embeds.narrow(1, kRank * L, L).contiguous();
    const at::Tensor labels = batch.labels.narrow(1, kRank * L, L).contiguous();
    const at::Tensor positions = at::arange(kRank * L, (kRank + 1) * L, at::kLong);
    benchmark::DoNotOptimize(embeds.data_ptr());
    benchmark::DoNotOptimize(labels.data_ptr());
    benchmark::DoNotOptimize(positions.data_ptr());
  };
  step();  // the same untimed first step
  for (auto _ : state) step();
  cpkit::bench::set_bytes(state, shard_bytes(state.range(0), state.range(1), dtype));
}

void BM_ShardBshd_Reference(benchmark::State& state) {
  const int64_t S = state.range(0), H = state.range(1);
  cpkit::reference::BshdBatch batch;
  batch.inputs_embeds = cpkit::reference::FloatRows(2, cpkit::reference::FloatMatrix::Random(S, H));
  batch.labels = cpkit::reference::IntMatrix::Ones(2, S);
  for (auto _ : state) {
    const auto s = cpkit::reference::prepare_cp_inputs(batch, {.cp_size = kCp});
    const auto local = s.local(0, kRank);
    benchmark::DoNotOptimize((*local.inputs_embeds)[0].data());
  }
  cpkit::bench::set_bytes(state, shard_bytes(S, H, at::kFloat));
}

void bshd_sizes(benchmark::internal::Benchmark* b) {
  for (int64_t S : {8192, 32768})
    for (int64_t H : {1024, 4096})
      for (int64_t bits : {32, 16}) b->Args({S, H, bits});
  b->Unit(benchmark::kMillisecond)->MinTime(0.3);
}

void bshd_reference_sizes(benchmark::internal::Benchmark* b) {
  for (int64_t S : {8192, 32768}) b->Args({S, 1024, 32});
  b->Unit(benchmark::kMillisecond)->MinTime(0.3);
}

BENCHMARK(BM_ShardBshd_Optimized)->Apply(bshd_sizes);
BENCHMARK(BM_ShardBshd_OptimizedNoCache)->Apply(bshd_sizes);
BENCHMARK(BM_ShardBshd_Torch)->Apply(bshd_sizes);
BENCHMARK(BM_ShardBshd_Reference)->Apply(bshd_reference_sizes);

// THD metadata for T tokens in D documents: ids, labels, positions, document ids, padding,
// valid of one rank. Bytes: the shard's six streams written + ids and labels read.
struct Packed {
  cpkit::CPBatch batch;
  std::vector<int64_t> lens, slots;
};

Packed packed_batch(int64_t T, int64_t D) {
  at::manual_seed(1);
  Packed p;
  const at::Tensor cuts =
      std::get<0>(at::randperm(T - 1, at::kLong).narrow(0, 0, D - 1).sort()) + 1;
  int64_t prev = 0;
  for (int64_t d = 0; d < D; ++d) {
    const int64_t next = d + 1 < D ? cuts[d].item<int64_t>() : T;
    p.slots.push_back(next - prev);
    p.lens.push_back(std::max<int64_t>(0, next - prev - (d % 3)));  // some slot padding
    prev = next;
  }
  p.batch.qkv_format = "thd";
  p.batch.input_ids = at::randint(1, 32000, {1, T}, at::kLong);
  p.batch.labels = p.batch.input_ids.clone();
  p.batch.seq_lens = at::tensor(p.lens, at::kLong).unsqueeze(0);
  p.batch.seq_lens_padded = at::tensor(p.slots, at::kLong).unsqueeze(0);
  return p;
}

double thd_bytes(int64_t T) { return static_cast<double>(T / kCp) * (8 * 4 + 1 * 2 + 8 * 2); }

// Args: T, D
void BM_ShardThd_Optimized(benchmark::State& state) {
  const Packed p = packed_batch(state.range(0), state.range(1));
  for (auto _ : state) {
    const cpkit::Sharder s = cpkit::prepare_packed_cp_inputs_for(p.batch, kCp, 1);
    const cpkit::LocalShard local = s.local(0, kRank);
    benchmark::DoNotOptimize(local.valid.data_ptr());
  }
  cpkit::bench::set_bytes(state, thd_bytes(state.range(0)));
}

// What a user writes with LibTorch ops: expand the per-document tables, then cut.
void BM_ShardThd_Torch(benchmark::State& state) {
  const Packed p = packed_batch(state.range(0), state.range(1));
  const int64_t T = state.range(0), L = T / kCp;
  const at::Tensor slots = at::tensor(p.slots, at::kLong), lens = at::tensor(p.lens, at::kLong);
  for (auto _ : state) {
    const at::Tensor starts = at::cumsum(slots, 0) - slots;
    const at::Tensor doc =
        at::repeat_interleave(at::arange(1, slots.numel() + 1, at::kLong), slots);
    const at::Tensor pos = at::arange(T, at::kLong) - at::repeat_interleave(starts, slots);
    const at::Tensor pad = pos >= at::repeat_interleave(lens, slots);
    const at::Tensor labels = at::where(pad, -100, p.batch.labels[0]);
    const at::Tensor valid = (~pad) & (labels != -100) & (pos > 0);
    const auto cut = [&](const at::Tensor& t) { return t.narrow(0, kRank * L, L).contiguous(); };
    benchmark::DoNotOptimize(cut(doc).data_ptr());
    benchmark::DoNotOptimize(cut(pos).data_ptr());
    benchmark::DoNotOptimize(cut(valid).data_ptr());
    benchmark::DoNotOptimize(cut(labels).data_ptr());
    benchmark::DoNotOptimize(cut(p.batch.input_ids[0]).data_ptr());
  }
  cpkit::bench::set_bytes(state, thd_bytes(T));
}

void BM_ShardThd_Reference(benchmark::State& state) {
  const Packed p = packed_batch(state.range(0), state.range(1));
  cpkit::reference::PackedBatch b;
  const int64_t T = state.range(0), D = state.range(1);
  b.input_ids =
      Eigen::Map<const cpkit::reference::IntMatrix>(p.batch.input_ids.data_ptr<int64_t>(), 1, T);
  b.labels = *b.input_ids;
  b.seq_lens = Eigen::Map<const cpkit::reference::IntMatrix>(p.lens.data(), 1, D);
  b.seq_lens_padded = Eigen::Map<const cpkit::reference::IntMatrix>(p.slots.data(), 1, D);
  for (auto _ : state) {
    const auto s = cpkit::reference::prepare_packed_cp_inputs(b, {.cp_size = kCp});
    const auto local = s.local(0, kRank);
    benchmark::DoNotOptimize(local.valid.data());
  }
  cpkit::bench::set_bytes(state, thd_bytes(T));
}

void thd_sizes(benchmark::internal::Benchmark* b) {
  for (int64_t T : {8192, 32768}) b->Args({T, 300});
  b->Unit(benchmark::kMicrosecond)->MinTime(0.3);
}

BENCHMARK(BM_ShardThd_Optimized)->Apply(thd_sizes);
BENCHMARK(BM_ShardThd_Torch)->Apply(thd_sizes);
BENCHMARK(BM_ShardThd_Reference)->Apply(thd_sizes);

}  // namespace
