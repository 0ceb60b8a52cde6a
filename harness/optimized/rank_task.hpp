// A rank-process task, defined next to the properties that send it: a property runs the
// RankTask object that registered the body, so no task name is written twice.
#pragma once

#include <string>
#include <vector>

#include "bundle.hpp"
#include "rank_pool.hpp"

namespace cpkit::harness {

class RankTask {
 public:
  // Registers `body` with the rank pool (at static initialisation, before the pool forks).
  RankTask(std::string name, pool::Task body);
  // Runs on ranks [0, cp); every rank must answer without an exception (else RC_FAIL).
  std::vector<pool::Bundle> run(int cp, const std::string& payload) const;
  // The raw replies, for properties about errors.
  std::vector<pool::Reply> replies(int cp, const std::string& payload) const;

 private:
  std::string name_;
};

}  // namespace cpkit::harness
