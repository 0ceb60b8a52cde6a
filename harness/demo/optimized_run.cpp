// cpkit-demo --impl optimized: the demo batch through prepare_packed_cp_inputs and
// shifted_cp_loss in real rank processes; each rank sends its shard back as text.
#include <ATen/ATen.h>

#include <sstream>

#include "cpkit/optimized/launch.hpp"
#include "cpkit/optimized/layout.hpp"
#include "cpkit/optimized/loss.hpp"
#include "cpkit/optimized/sharder.hpp"
#include "demo.hpp"
#include "rank_processes.hpp"

namespace cpkit::demo {

namespace {

at::Tensor to_tensor(const reference::IntMatrix& m) {
  return at::from_blob(const_cast<std::int64_t*>(m.data()), {m.rows(), m.cols()}, at::kLong)
      .clone();
}

at::Tensor layout_positions_tensor(const LocalShard& s) {
  return at::tensor(layout_positions(*s.layout.plan, s.layout.rank), at::kLong);
}

// One line per stream (the rank's global positions first): the values of its single row.
std::string serialise(const LocalShard& s, float loss) {
  std::ostringstream os;
  os << s.layout.padded_len << " " << s.layout.seq_len << " " << s.layout.local_len << "\n";
  for (const at::Tensor& t : {layout_positions_tensor(s), s.input_ids, s.labels, s.position_ids,
                              s.document_ids, s.padding.to(at::kLong), s.valid.to(at::kLong)}) {
    const at::Tensor row = t.flatten().contiguous();
    for (int64_t i = 0; i < row.numel(); ++i) os << row[i].item<int64_t>() << " ";
    os << "\n";
  }
  os.precision(9);
  os << loss << "\n";
  return os.str();
}

void parse(const std::string& text, reference::LocalShard& shard, double& loss) {
  std::istringstream in(text);
  auto& l = shard.layout;
  in >> l.padded_len >> l.seq_len >> l.local_len;
  l.positions.resize(static_cast<std::size_t>(l.local_len));
  for (std::int64_t& p : l.positions) in >> p;
  auto read_row = [&](auto& m) {
    m.resize(1, l.local_len);
    for (Eigen::Index j = 0; j < l.local_len; ++j) {
      std::int64_t v = 0;
      in >> v;
      m(0, j) = static_cast<typename std::decay_t<decltype(m)>::Scalar>(v);
    }
  };
  reference::IntMatrix ids, labels, positions, documents;
  reference::BoolMatrix padding, valid;
  read_row(ids);
  read_row(labels);
  read_row(positions);
  read_row(documents);
  read_row(padding);
  read_row(valid);
  shard.input_ids = ids;
  shard.labels = labels;
  shard.position_ids = positions;
  shard.document_ids = documents;
  shard.padding = padding;
  shard.valid = valid.transpose();
  in >> loss;
}

// The demo batch as the optimized path takes it, and its padded logits.
struct DemoInputs {
  CPBatch batch;
  at::Tensor logits;  // [1, T_pad, V]
  std::string layout;
  double balance_slack = 0;
};

DemoInputs demo_inputs(const DemoOptions& o) {
  const reference::PackedBatch packed = make_demo_batch(o);
  DemoInputs in;
  in.batch.qkv_format = "thd";
  in.batch.input_ids = to_tensor(*packed.input_ids);
  in.batch.labels = to_tensor(packed.labels);
  in.batch.seq_lens = to_tensor(packed.seq_lens);
  in.batch.seq_lens_padded = to_tensor(packed.seq_lens_padded);
  const std::int64_t T = packed.labels.cols();
  const std::int64_t T_pad = layout_padded_length(layout_kind(o.layout), T, o.cp, 1);
  const reference::FloatMatrix logits = make_demo_logits(o, T_pad);
  in.logits =
      at::from_blob(const_cast<float*>(logits.data()), {1, T_pad, o.vocab}, at::kFloat).clone();
  in.layout = o.layout;
  in.balance_slack = o.balance_slack;
  return in;
}

// One rank's part: its shard and its loss, as text.
std::string run_rank(const DemoInputs& in, const MeshPtr& mesh) {
  PadOptions pad;
  pad.layout = layout_kind(in.layout);
  pad.balance_slack = in.balance_slack;
  const Sharder sharder = prepare_packed_cp_inputs(in.batch, mesh, /*num_chunks=*/1, true, pad);
  const LocalShard shard = sharder.local(0);
  const at::Tensor local_logits = in.logits.index_select(1, layout_positions_tensor(shard));
  const at::Tensor loss =
      shifted_cp_loss(local_logits, shard.labels, shard.valid, mesh, {.layout = shard.layout.plan});
  return serialise(shard, loss.item<float>());
}

}  // namespace

DemoResult run_optimized(const DemoOptions& o) {
  const DemoInputs in = demo_inputs(o);
  const auto outcomes =
      ranks::run_ranks_collect(o.cp, [&](int, const MeshPtr& mesh) { return run_rank(in, mesh); });
  DemoResult result;
  for (const auto& outcome : outcomes) {
    if (!outcome.ok)
      throw std::runtime_error("rank " + std::to_string(outcome.rank) +
                               " failed: " + outcome.message);
    reference::LocalShard shard;
    reference::RankLoss loss;
    parse(outcome.output, shard, loss.value);
    loss.local_targets = loss.global_targets = -1;  // not reported by the optimized path
    result.shards.push_back(shard);
    result.losses.push_back(loss);
    result.combined += loss.value / o.cp;
  }
  result.single_device = run_reference(o).single_device;
  return result;
}

bool run_launched(const DemoOptions& options, std::ostream& os) {
  EnvMeshOptions mesh_options;
  mesh_options.cp_size = options.cp;
  const EnvMesh env = make_mesh_from_env(mesh_options);
  if (env.cp_size != options.cp)
    throw std::invalid_argument("--cp " + std::to_string(options.cp) + " but the CP group has " +
                                std::to_string(env.cp_size) + " ranks");
  DemoOptions group = options;
  group.seed = options.seed + static_cast<std::uint64_t>(env.cp_group);  // DP groups differ
  reference::LocalShard shard;
  double loss = 0;
  parse(run_rank(demo_inputs(group), env.mesh), shard, loss);
  const DemoResult expected = run_reference(group);
  std::ostringstream line;
  line << "world rank " << env.env.rank << "/" << env.env.world_size << " (" << env.env.launcher
       << ", CP group " << env.cp_group << " of " << env.num_groups << ", CP rank " << env.cp_rank
       << " of " << env.cp_size << "): ";
  const bool ok = same_rank(shard, loss, expected.shards[static_cast<std::size_t>(env.cp_rank)],
                            expected.losses[static_cast<std::size_t>(env.cp_rank)].value, line);
  os << line.str() << std::flush;
  return ok;
}

}  // namespace cpkit::demo
