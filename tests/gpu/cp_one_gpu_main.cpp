// CP > 1 on one GPU: skip with exit code 77 where no CUDA device is present. The device is
// probed in a forked child, so this process (which forks the rank processes) never
// initialises CUDA: a child of a CUDA-initialised process cannot use the GPU.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include <cuda_runtime.h>

int main(int argc, char** argv) {
  const pid_t child = fork();
  if (child == 0) {
    int devices = 0;
    _exit(cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0 ? 0 : 1);
  }
  int status = 0;
  waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::printf("SKIPPED: no CUDA device\n");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
