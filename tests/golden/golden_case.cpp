#include "golden_case.hpp"

#include <dirent.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <stdexcept>

namespace cpkit::golden {

std::vector<std::string> golden_case_names(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (const dirent* e = readdir(d)) {
      const std::string file = e->d_name;
      if (file.size() > 5 && file.substr(file.size() - 5) == ".json")
        names.push_back(file.substr(0, file.size() - 5));
    }
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

namespace {

// A case's batch and layout fields (its microbatches are read by each loader).
GoldenCase batch_of(const Json& j) {
  GoldenCase c;
  c.name = j.at("name");
  c.format = j.at("format");
  c.cp = j.at("cp");
  c.num_chunks = j.at("num_chunks");
  c.pad_multiple = j.at("pad_multiple");
  c.pad_token_id = j.at("pad_token_id");
  c.softcap = j.at("softcap");
  c.layout = j.value("layout", "contiguous");
  c.vocab = j.at("vocab");
  c.inputs = j.at("inputs");
  return c;
}

}  // namespace

GoldenCase load_golden_case(const std::string& name) {
  std::ifstream in(std::string(CPKIT_GOLDEN_DIR) + "/" + name + ".json");
  if (!in) throw std::runtime_error("golden case " + name + " not found");
  const Json j = Json::parse(in);
  GoldenCase c = batch_of(j);
  for (const Json& m : j.at("microbatches")) {
    ExpectedMicrobatch mb;
    mb.rows = m.at("rows").get<std::vector<int>>();
    mb.padded_len = m.at("padded_len");
    mb.single_device_loss = m.at("single_device_loss");
    mb.targets = m.at("targets");
    mb.logits = m.at("logits").get<std::vector<std::vector<std::vector<float>>>>();
    for (const Json& r : m.at("ranks")) {
      ExpectedRank e;
      e.rank = r.at("rank");
      if (r.contains("positions")) {
        e.positions = r.at("positions").get<std::vector<std::int64_t>>();
      } else {
        for (std::int64_t t = r.at("begin"); t < r.at("end").get<std::int64_t>(); ++t)
          e.positions.push_back(t);
      }
      e.input_ids = r.at("input_ids").get<std::vector<std::vector<std::int64_t>>>();
      e.labels = r.at("labels").get<std::vector<std::vector<std::int64_t>>>();
      e.position_ids = r.at("position_ids").get<std::vector<std::vector<std::int64_t>>>();
      e.document_ids = r.at("document_ids").get<std::vector<std::vector<std::int64_t>>>();
      e.padding = r.at("padding").get<std::vector<std::vector<bool>>>();
      e.valid = r.at("valid").get<std::vector<std::vector<bool>>>();
      e.loss = r.at("loss");
      e.grad = r.at("grad").get<std::vector<std::vector<std::vector<float>>>>();
      mb.ranks.push_back(e);
    }
    c.microbatches.push_back(mb);
  }
  return c;
}

LinearCase load_linear_case(const std::string& name) {
  std::ifstream in(std::string(CPKIT_GOLDEN_LINEAR_DIR) + "/" + name + ".json");
  if (!in) throw std::runtime_error("golden linear case " + name + " not found");
  const Json j = Json::parse(in);
  LinearCase c;
  c.batch = batch_of(j);
  c.hidden_size = j.at("hidden_size");
  c.weight = j.at("weight").get<Floats2>();
  for (const Json& m : j.at("microbatches")) {
    LinearMicrobatch mb;
    mb.rows = m.at("rows").get<std::vector<int>>();
    mb.hidden = m.at("hidden").get<Floats3>();
    for (const Json& r : m.at("ranks")) {
      LinearRank e;
      e.rank = r.at("rank");
      e.loss = r.at("loss");
      e.dhidden = r.at("dhidden").get<Floats3>();
      e.dweight = r.at("dweight").get<Floats2>();
      mb.ranks.push_back(e);
    }
    c.microbatches.push_back(mb);
  }
  return c;
}

LogprobsCase load_logprobs_case(const std::string& name) {
  std::ifstream in(std::string(CPKIT_GOLDEN_LOGPROBS_DIR) + "/" + name + ".json");
  if (!in) throw std::runtime_error("golden logprobs case " + name + " not found");
  const Json j = Json::parse(in);
  LogprobsCase c;
  c.batch = batch_of(j);
  c.temperature = j.at("temperature");
  c.weight = j.at("weight").get<Floats2>();
  for (const Json& m : j.at("microbatches")) {
    LogprobsMicrobatch mb;
    mb.rows = m.at("rows").get<std::vector<int>>();
    mb.hidden = m.at("hidden").get<Floats3>();
    mb.upstream = m.at("upstream").get<Floats3>();
    for (const Json& r : m.at("ranks")) {
      LogprobsRank e;
      e.rank = r.at("rank");
      e.logprobs = r.at("logprobs").get<Floats2>();
      e.entropy = r.at("entropy").get<Floats2>();
      e.has_target = r.at("has_target").get<std::vector<std::vector<bool>>>();
      e.dhidden = r.at("dhidden").get<Floats3>();
      e.dweight = r.at("dweight").get<Floats2>();
      mb.ranks.push_back(e);
    }
    c.microbatches.push_back(mb);
  }
  return c;
}

namespace {

// [rows][tokens][values] with null for -inf.
Floats3 with_infinities(const Json& rows) {
  Floats3 out;
  for (const Json& row : rows) {
    Floats2& r = out.emplace_back();
    for (const Json& token : row) {
      std::vector<float>& t = r.emplace_back();
      for (const Json& x : token) t.push_back(x.is_null() ? -INFINITY : x.get<float>());
    }
  }
  return out;
}

}  // namespace

AttentionCase load_attention_case(const std::string& name) {
  std::ifstream in(std::string(CPKIT_GOLDEN_ATTENTION_DIR) + "/" + name + ".json");
  if (!in) throw std::runtime_error("golden attention case " + name + " not found");
  const Json j = Json::parse(in);
  AttentionCase c;
  c.batch = batch_of(j);
  c.window = j.at("window");
  c.scale = j.at("scale");
  const auto heads = j.at("heads").get<std::vector<std::int64_t>>();
  c.hq = heads.at(0);
  c.hkv = heads.at(1);
  c.head_dim = heads.at(2);
  const Json& m = j.at("microbatches").at(0);
  c.q = m.at("q").get<Floats3>();
  c.k = m.at("k").get<Floats3>();
  c.v = m.at("v").get<Floats3>();
  c.upstream = m.at("upstream").get<Floats3>();
  c.sinks = m.at("sinks").get<std::vector<float>>();
  for (const Json& r : m.at("ranks")) {
    AttentionRank e;
    e.rank = r.at("rank");
    e.positions = r.at("positions").get<std::vector<std::int64_t>>();
    e.out = r.at("out").get<Floats3>();
    e.lse = with_infinities(r.at("lse"));
    e.dq = r.at("dq").get<Floats3>();
    e.dk = r.at("dk").get<Floats3>();
    e.dv = r.at("dv").get<Floats3>();
    if (r.contains("dsinks")) e.dsinks = r.at("dsinks").get<std::vector<float>>();
    c.ranks.push_back(e);
  }
  return c;
}

PolicyCase load_policy_case(const std::string& name) {
  std::ifstream in(std::string(CPKIT_GOLDEN_POLICY_DIR) + "/" + name + ".json");
  if (!in) throw std::runtime_error("golden policy case " + name + " not found");
  const Json j = Json::parse(in);
  PolicyCase c;
  c.batch = batch_of(j);
  c.policy = j.at("policy");
  c.hidden = j.at("hidden").get<Floats3>();
  c.weight = j.at("weight").get<Floats2>();
  c.per_position = j.at("per_position").get<Floats3>();
  for (const Json& r : j.at("ranks")) {
    PolicyRank e;
    e.rank = r.at("rank");
    e.positions = r.at("positions").get<std::vector<std::int64_t>>();
    e.loss = r.at("loss");
    e.logprobs = r.at("logprobs").get<Floats2>();
    e.ratio = r.at("ratio").get<Floats2>();
    e.dhidden = r.at("dhidden").get<Floats3>();
    e.dweight = r.at("dweight").get<Floats2>();
    c.ranks.push_back(e);
  }
  return c;
}

OffsetsCase load_offsets_case(const std::string& name) {
  std::ifstream in(std::string(CPKIT_GOLDEN_OFFSETS_DIR) + "/" + name + ".json");
  if (!in) throw std::runtime_error("golden offsets case " + name + " not found");
  const Json j = Json::parse(in);
  OffsetsCase c;
  c.name = j.at("name");
  c.format = j.at("format");
  c.cp = j.at("cp");
  c.inputs = j.at("inputs");
  for (const Json& r : j.at("ranks")) {
    OffsetsRank rank;
    rank.rank = r.at("rank");
    rank.cu_seqlens_q = r.at("cu_seqlens_q").get<std::vector<std::int64_t>>();
    rank.cu_seqlens_k = r.at("cu_seqlens_k").get<std::vector<std::int64_t>>();
    rank.max_seqlen_q = r.at("max_seqlen_q");
    rank.max_seqlen_k = r.at("max_seqlen_k");
    rank.k_begin = r.at("k_begin");
    rank.k_end = r.at("k_end");
    c.ranks.push_back(rank);
  }
  return c;
}

}  // namespace cpkit::golden
