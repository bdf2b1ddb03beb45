// A program for tests/test_nvidia_binaries.py, built by this machine's nvcc twice: with the CUDA
// runtime as a shared library (-cudart shared) and linked in statically (nvcc's default). It makes a
// known number of runtime calls and kernel launches and prints what each kind returned. Without a
// GPU every call fails at once with its real error code. Without a GPU the launches fail before they
// reach the device; cudaGetLastError() reports what they returned.
#include <cstdio>
#include <unistd.h>
#include <cuda_runtime.h>

__global__ void scale(float *x, float a, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] *= a;
}

int main(int argc, char **argv)
{
    // argv[1]: a file to wait for (at most 120 s) before the first call, so that the agent can
    // attach to this executable (with the runtime linked in) first
    for (int i = 0; argc > 1 && access(argv[1], F_OK) != 0; i++) {
        if (i == 2400)
            return 3;
        usleep(50000);
    }
    float *d = nullptr;
    int malloc_ret = 0, launch_ret = 0, sync_ret = 0;
    for (int i = 0; i < 20; i++)
        malloc_ret = (int)cudaMalloc((void **)&d, 1 << 20);
    for (int i = 0; i < 100; i++) {
        scale<<<(i % 7) + 1, 256>>>(d, 2.0f, 1 << 18);
        launch_ret = (int)cudaGetLastError();
    }
    for (int i = 0; i < 10; i++)
        sync_ret = (int)cudaDeviceSynchronize();
    printf("{\"cudaMalloc\": [20, %d], \"launch\": [100, %d], \"cudaDeviceSynchronize\": [10, %d]}\n",
           malloc_ret, launch_ret, sync_ret);
    return 0;
}
