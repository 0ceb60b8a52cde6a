#include "rank_task.hpp"

#include <rapidcheck.h>

namespace cpkit::harness {

RankTask::RankTask(std::string name, pool::Task body) : name_(std::move(name)) {
  pool::register_task(name_, std::move(body));
}

std::vector<pool::Reply> RankTask::replies(int cp, const std::string& payload) const {
  return pool::RankPool::instance().run(cp, name_, payload);
}

std::vector<pool::Bundle> RankTask::run(int cp, const std::string& payload) const {
  const auto answers = replies(cp, payload);
  std::vector<pool::Bundle> out;
  for (std::size_t r = 0; r < answers.size(); ++r) {
    if (!answers[r].ok)
      RC_FAIL(name_ + ": rank " + std::to_string(r) + " raised: " + answers[r].bytes);
    out.push_back(pool::Bundle::parse(answers[r].bytes));
  }
  return out;
}

}  // namespace cpkit::harness
