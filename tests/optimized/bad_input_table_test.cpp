// The bad-input table shared with Python (tests/bad_inputs.json): every case through the C++
// API must raise cpkit::Error naming the case's argument with each of its fragments.
// python/tests/test_bad_input_table.py runs the same cases through the Python package.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

#include "cpkit/optimized/batch.hpp"
#include "cpkit/optimized/error.hpp"
#include "cpkit/optimized/gather.hpp"
#include "cpkit/optimized/loss.hpp"
#include "cpkit/optimized/packer.hpp"
#include "cpkit/optimized/policy_loss.hpp"
#include "cpkit/optimized/process_group.hpp"
#include "cpkit/optimized/sharder.hpp"
#include "cpkit/optimized/token_logprobs.hpp"

namespace cpkit {
namespace {

using nlohmann::json;

const json& table() {
  static const json t = [] {
    std::ifstream in(CPKIT_BAD_INPUTS_JSON);
    if (!in) throw std::runtime_error("cannot read " CPKIT_BAD_INPUTS_JSON);
    return json::parse(in);
  }();
  return t;
}

at::ScalarType dtype_of(const std::string& name) {
  static const std::unordered_map<std::string, at::ScalarType> types = {
      {"float32", at::kFloat}, {"float64", at::kDouble}, {"int64", at::kLong}, {"bool", at::kBool}};
  return types.at(name);
}

void flatten(const json& values, std::vector<double>& out, std::vector<int64_t>& shape,
             size_t depth) {
  if (!values.is_array()) {
    out.push_back(values.is_boolean() ? double(values.get<bool>()) : values.get<double>());
    return;
  }
  if (shape.size() == depth) shape.push_back(static_cast<int64_t>(values.size()));
  for (const json& v : values) flatten(v, out, shape, depth + 1);
}

// {dtype, values | zeros | ones, transpose?, device?} -> a tensor (the table's "about").
at::Tensor tensor_of(const json& spec) {
  const at::ScalarType dtype = dtype_of(spec.at("dtype"));
  at::Tensor t;
  if (spec.contains("values")) {
    std::vector<double> flat;
    std::vector<int64_t> shape;
    flatten(spec.at("values"), flat, shape, 0);
    t = at::tensor(flat, at::kDouble).reshape(shape).to(dtype);
  } else {
    const bool ones = spec.contains("ones");
    const auto shape = spec.at(ones ? "ones" : "zeros").get<std::vector<int64_t>>();
    t = ones ? at::ones(shape, dtype) : at::zeros(shape, dtype);
  }
  if (spec.contains("transpose")) {
    const auto dims = spec.at("transpose").get<std::vector<int64_t>>();
    t = t.transpose(dims.at(0), dims.at(1));
  }
  if (spec.contains("device")) t = t.to(at::Device(spec.at("device").get<std::string>()));
  return t;
}

c10::IValue value_of(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_array()) {
    std::vector<at::Tensor> list;
    for (const json& spec : v) list.push_back(tensor_of(spec));
    return list;
  }
  return tensor_of(v);
}

// The case's batch through CPBatch::from_map (the dict a Python caller passes).
CPBatch batch_of(const json& c) {
  json fields = table().at("batches").at(c.at("batch").get<std::string>());
  if (c.contains("set")) fields.merge_patch(c.at("set"));  // null removes a field
  std::unordered_map<std::string, c10::IValue> values;
  for (const auto& [key, v] : fields.items()) values.emplace(key, value_of(v));
  return CPBatch::from_map(values);
}

at::Tensor loss_input(const json& c, const std::string& name) {
  const json& set = c.value("set", json::object());
  return tensor_of(set.contains(name) ? set.at(name) : table().at("loss").at(name));
}

at::Tensor head_input(const json& c, const std::string& name) {
  const json& set = c.value("set", json::object());
  return tensor_of(set.contains(name) ? set.at(name) : table().at("head").at(name));
}

double number_of(const json& v) {
  if (!v.is_string()) return v.get<double>();
  const std::string s = v.get<std::string>();
  if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
  if (s == "inf") return std::numeric_limits<double>::infinity();
  throw std::invalid_argument("not a number in the table: " + s);
}

Sharder sharder_of(const json& c) {
  const std::string call = c.at("call");
  const int chunks = c.value("num_chunks", 1);
  const PadOptions pad{.pad_multiple = c.value("pad_multiple", 1),
                       .balance_slack = c.value("balance_slack", kDefaultBalanceSlack)};
  const bool primary = call != "cut_spliced";
  const bool packed = call.rfind("prepare_cp_inputs", 0) != 0;  // the rest take packed rows
  if (c.contains("cp")) {
    const int cp = c.at("cp").get<int>();
    return packed ? prepare_packed_cp_inputs_for(batch_of(c), cp, chunks, primary, pad)
                  : prepare_cp_inputs_for(batch_of(c), cp, chunks, primary, pad);
  }
  return packed ? prepare_packed_cp_inputs(batch_of(c), nullptr, chunks, primary, pad)
                : prepare_cp_inputs(batch_of(c), nullptr, chunks, primary, pad);
}

void run(const json& c) {
  const std::string call = c.at("call");
  if (call == "shifted_cp_loss") {
    shifted_cp_loss(loss_input(c, "logits"), loss_input(c, "labels"), loss_input(c, "valid"),
                    nullptr, {.softcap = number_of(c.value("softcap", json(0.0)))});
  } else if (call == "token_logprobs") {
    token_logprobs(
        head_input(c, "hidden"), head_input(c, "weight"), head_input(c, "labels"),
        head_input(c, "valid"), nullptr,
        {.softcap = number_of(c.value("softcap", json(0.0))),
         .temperature = number_of(c.value("temperature", json(1.0))),
         .logits_precision = parse_logits_precision(c.value("logits_precision", "fp32"))});
  } else if (call == "policy_loss") {
    PolicyLossOptions o;
    o.kind = parse_policy_kind(c.value("kind", "ppo"));
    o.kl = parse_kl_estimator(c.value("kl", "k3"));
    o.aggregation = parse_policy_aggregation(c.value("aggregation", "token_mean"));
    o.eps_low = number_of(c.value("eps_low", json(0.2)));
    o.dual_clip = number_of(c.value("dual_clip", json(0.0)));
    o.kl_coef = number_of(c.value("kl_coef", json(0.0)));
    policy_loss(head_input(c, "hidden"), head_input(c, "weight"), head_input(c, "labels"),
                head_input(c, "valid"), nullptr,
                {head_input(c, "advantages"), head_input(c, "old_logprobs"), {}, {}, {}}, o);
  } else if (call == "scale_loss_gradient_") {
    scale_loss_gradient_(tensor_of(c.at("grad_logits")), tensor_of(c.at("upstream")));
  } else if (call == "gather_tokens") {
    gather_tokens(tensor_of(c.at("value")), nullptr, true);
  } else if (call == "local") {
    sharder_of(c).local(c.at("microbatch").get<int>());
  } else if (call == "local_for") {
    sharder_of(c).local(0, c.at("rank").get<int>());
  } else if (call == "cut_spliced") {
    sharder_of(c).cut_spliced(0, tensor_of(c.at("spliced")));
  } else if (call == "pack_documents") {
    pack_documents(c.at("lengths").get<std::vector<int64_t>>(), c.at("rows").get<int64_t>(),
                   c.at("capacity").get<int64_t>(), c.value("window", int64_t{0}));
  } else if (call == "make_gloo_mesh") {
    make_gloo_mesh("/tmp/cpkit-never-used", c.at("rank").get<int>(), c.at("size").get<int>());
  } else if (call.rfind("prepare_", 0) == 0) {
    sharder_of(c);
  } else {
    throw std::invalid_argument("unknown call in the table: " + call);
  }
}

// Every row in one process (a sanitized process costs ~1 s to start and leak-check); each
// failure names its row.
TEST(BadInputTable, RaisesTheNamedError) {
  const auto rows = table().at("cases").get<std::vector<json>>();
  EXPECT_FALSE(rows.empty());
  for (const json& c : rows) {
    SCOPED_TRACE(c.at("name").get<std::string>());
    try {
      run(c);
      ADD_FAILURE() << "no error raised; expected one naming '" << c.at("argument") << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), c.at("argument").get<std::string>()) << e.what();
      for (const std::string& f : c.at("contains").get<std::vector<std::string>>())
        EXPECT_NE(std::string(e.what()).find(f), std::string::npos)
            << "message lacks '" << f << "': " << e.what();
    }
  }
}

}  // namespace
}  // namespace cpkit
