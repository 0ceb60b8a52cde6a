// CPKIT_HOST_DEVICE: a function nvcc compiles for host and device, and the host compiler as
// plain C++. Kernel arithmetic written once is tested on the CPU this way.
#pragma once

#if defined(__CUDACC__)
#define CPKIT_HOST_DEVICE __host__ __device__
#else
#define CPKIT_HOST_DEVICE
#endif
