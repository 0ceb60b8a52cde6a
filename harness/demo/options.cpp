#include <sstream>
#include <stdexcept>

#include "demo.hpp"

namespace cpkit::demo {

namespace {

std::int64_t parse_int(const std::string& flag, const std::string& text, std::int64_t min) {
  std::size_t used = 0;
  std::int64_t value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty())
    throw std::invalid_argument(flag + ": '" + text + "' is not an integer");
  if (value < min)
    throw std::invalid_argument(flag + ": " + text + " is below the minimum " +
                                std::to_string(min));
  return value;
}

}  // namespace

void print_help(std::ostream& os) {
  os << "cpkit-demo: one packed (THD) row cut across CP ranks, with the shifted loss.\n"
        "\n"
        "Prints, per rank, its token range, ids, positions, document ids, padding flags and\n"
        "valid-target mask, then each rank's loss, their mean over ranks and the single-device\n"
        "HF shifted mean cross-entropy, with the difference. Exits 1 if they differ.\n"
        "\n"
        "  --cp N             CP ranks (default 4)\n"
        "  --doc-lens A,B,..  real document lengths, 0 allowed (default 7,0,11,3,9)\n"
        "  --slot-multiple N  each slot is its length rounded up to N (default 2)\n"
        "  --tail N           row-tail padding tokens after the last slot (default 3)\n"
        "  --vocab N          vocabulary size, >= 2 (default 32)\n"
        "  --seed N           seed for ids and logits (default 1)\n"
        "  --layout KIND      which rank owns which tokens: contiguous (default), head_tail\n"
        "                     or balanced; each rank's line then shows its fragments, its\n"
        "                     causal attention work and the keys it needs from other ranks\n"
        "  --balance-slack X  balanced: how far above even work may be to cut fewer\n"
        "                     documents (default 0.02; 0: the most even plan)\n"
        "  --impl NAME        reference (the Eigen oracle; default) or optimized (LibTorch\n"
        "                     path in --cp real rank processes over Gloo, compared with the\n"
        "                     reference)\n"
        "  --launcher NAME    with --impl optimized: fork (default; --cp forked ranks) or env\n"
        "                     (this process is one rank started by torchrun or srun; the\n"
        "                     world is cut into CP groups of --cp contiguous ranks)\n"
        "  --help             this text\n";
}

DemoOptions parse_options(int argc, char** argv) {
  DemoOptions o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      o.help = true;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument(flag + ": missing value (see --help)");
    const std::string value = argv[++i];
    if (flag == "--cp") {
      o.cp = static_cast<int>(parse_int(flag, value, 1));
    } else if (flag == "--doc-lens") {
      o.doc_lens.clear();
      std::stringstream list(value);
      for (std::string item; std::getline(list, item, ',');)
        o.doc_lens.push_back(parse_int(flag, item, 0));
      if (o.doc_lens.empty()) throw std::invalid_argument(flag + ": no document length given");
    } else if (flag == "--slot-multiple") {
      o.slot_multiple = static_cast<int>(parse_int(flag, value, 1));
    } else if (flag == "--tail") {
      o.tail = static_cast<int>(parse_int(flag, value, 0));
    } else if (flag == "--vocab") {
      o.vocab = static_cast<int>(parse_int(flag, value, 2));
    } else if (flag == "--seed") {
      o.seed = static_cast<std::uint64_t>(parse_int(flag, value, 0));
    } else if (flag == "--layout") {
      if (value != "contiguous" && value != "head_tail" && value != "balanced")
        throw std::invalid_argument(flag + ": unknown layout '" + value +
                                    "' (available: contiguous, head_tail, balanced)");
      o.layout = value;
    } else if (flag == "--balance-slack") {
      std::size_t used = 0;
      try {
        o.balance_slack = std::stod(value, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != value.size() || !(o.balance_slack >= 0))
        throw std::invalid_argument(flag + ": '" + value + "' is not a number >= 0");
    } else if (flag == "--impl") {
      if (value != "reference" && value != "optimized")
        throw std::invalid_argument(flag + ": unknown implementation '" + value +
                                    "' (available: reference, optimized)");
      o.impl = value;
    } else if (flag == "--launcher") {
      if (value != "fork" && value != "env")
        throw std::invalid_argument(flag + ": unknown launcher '" + value +
                                    "' (available: fork, env)");
      o.launcher = value;
    } else {
      throw std::invalid_argument("unknown flag '" + flag + "' (see --help)");
    }
  }
  if (o.launcher == "env" && o.impl != "optimized")
    throw std::invalid_argument("--launcher env: needs --impl optimized");
  return o;
}

}  // namespace cpkit::demo
