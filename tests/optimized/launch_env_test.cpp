// read_launch_env: torchrun's and Slurm's variables, and a clear error for every missing or
// inconsistent one.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "cpkit/optimized/error.hpp"
#include "cpkit/optimized/launch.hpp"

namespace cpkit {
namespace {

using Vars = std::map<std::string, std::string>;

LaunchEnv read(const Vars& vars, const std::string& addr = "", int port = 0) {
  return read_launch_env(
      [&vars](const char* name) -> const char* {
        const auto it = vars.find(name);
        return it == vars.end() ? nullptr : it->second.c_str();
      },
      addr, port);
}

// The error's argument and that its message holds `text`.
void expect_error(const Vars& vars, const std::string& argument, const std::string& text) {
  try {
    read(vars);
    ADD_FAILURE() << "no error; expected one naming " << argument;
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), argument) << e.what();
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

const Vars kTorchrun = {{"RANK", "5"},
                        {"WORLD_SIZE", "8"},
                        {"LOCAL_RANK", "1"},
                        {"MASTER_ADDR", "node0"},
                        {"MASTER_PORT", "29500"},
                        {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                        {"TORCHELASTIC_RESTART_COUNT", "2"}};

TEST(LaunchEnv, ReadsTorchrun) {
  const LaunchEnv env = read(kTorchrun);
  EXPECT_EQ(env.launcher, "torchrun");
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.master_addr, "node0");
  EXPECT_EQ(env.master_port, 29500);
  EXPECT_TRUE(env.agent_store);
  EXPECT_EQ(env.restart_count, 2);
}

TEST(LaunchEnv, ReadsSlurmWithAnExplicitAddress) {
  const Vars slurm = {{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "3"}};
  const LaunchEnv env = read(slurm, "10.1.2.3", 12345);
  EXPECT_EQ(env.launcher, "slurm");
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 3);
  EXPECT_EQ(env.master_addr, "10.1.2.3");
  EXPECT_EQ(env.master_port, 12345);
  EXPECT_FALSE(env.agent_store);
  expect_error(slurm, "MASTER_ADDR", "first node");
}

TEST(LaunchEnv, MissingVariablesAreNamed) {
  expect_error({}, "RANK", "SLURM_PROCID");
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}) {
    Vars vars = kTorchrun;
    vars.erase(name);
    expect_error(vars, name, "not set");
  }
}

TEST(LaunchEnv, InconsistentVariablesAreNamedWithTheirValues) {
  Vars vars = kTorchrun;
  vars["RANK"] = "8";
  expect_error(vars, "RANK", "is 8 but WORLD_SIZE is 8");
  vars = kTorchrun;
  vars["WORLD_SIZE"] = "0";
  expect_error(vars, "WORLD_SIZE", "must be >= 1, got 0");
  vars = kTorchrun;
  vars["LOCAL_RANK"] = "6";
  expect_error(vars, "LOCAL_RANK", "is 6 but RANK is only 5");
  vars = kTorchrun;
  vars["RANK"] = "two";
  expect_error(vars, "RANK", "\"two\"");
  vars = kTorchrun;
  vars["MASTER_PORT"] = "70000";
  expect_error(vars, "MASTER_PORT", "70000");
}

}  // namespace
}  // namespace cpkit
