/*
 * STAND-IN CUDA LIBRARY -- NOT NVIDIA CODE, NO GPU INVOLVED.
 *
 * For machines without a GPU (this project's CI and test bed), this file builds small
 * shared libraries that export the real symbol names and C signatures of
 *   libcuda.so.1      (driver API:  -DSTANDIN_DRIVER)
 *   libcudart.so.12   (runtime API: -DSTANDIN_RUNTIME)
 *   libnccl.so.2      (NCCL:        -DSTANDIN_NCCL)
 * so that the agent attaches its uprobes to them exactly as it would to the real libraries
 * (by path + symbol name). The bodies do nothing useful; they take a known time:
 *   launch-type calls busy-wait      STRAGGLER_STANDIN_LAUNCH_US  (default 5)
 *   alloc/free busy-wait             STRAGGLER_STANDIN_ALLOC_US   (default 20)
 *   copies busy-wait                 STRAGGLER_STANDIN_COPY_US    (default 10)
 *   synchronize-type calls sleep     STRAGGLER_STANDIN_SYNC_US    (default 100)  (looks like a GPU wait)
 *   NCCL collectives sleep           STRAGGLER_STANDIN_NCCL_US    (default 200)  (looks like waiting for peers)
 * read once, when the library is loaded. 0 makes a call return at once (for overhead benchmarks).
 * Every call returns 0 (CUDA_SUCCESS / cudaSuccess / ncclSuccess).
 */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#define API __attribute__((visibility("default"), noinline))

static long launch_ns = 5000, alloc_ns = 20000, copy_ns = 10000, sync_ns = 100000, nccl_ns = 200000;

static long env_us(const char *name, long dflt_ns)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return dflt_ns;
    return atol(v) * 1000L;
}

__attribute__((constructor)) static void standin_read_env(void)
{
    launch_ns = env_us("STRAGGLER_STANDIN_LAUNCH_US", launch_ns);
    alloc_ns = env_us("STRAGGLER_STANDIN_ALLOC_US", alloc_ns);
    copy_ns = env_us("STRAGGLER_STANDIN_COPY_US", copy_ns);
    sync_ns = env_us("STRAGGLER_STANDIN_SYNC_US", sync_ns);
    nccl_ns = env_us("STRAGGLER_STANDIN_NCCL_US", nccl_ns);
}

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Busy-wait: the CPU stays busy, like the host side of a kernel launch. */
static void spin_ns(long ns)
{
    if (ns <= 0)
        return;
    uint64_t end = now_ns() + (uint64_t)ns;
    while (now_ns() < end)
        __asm__ __volatile__("pause");
}

/* Sleep: the thread leaves the CPU, like a wait for the GPU or for other ranks. */
static void sleep_ns(long ns)
{
    if (ns <= 0)
        return;
    struct timespec ts = {ns / 1000000000L, ns % 1000000000L};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* A fake device allocator: hands out increasing addresses; nothing is allocated. */
static uint64_t next_device_ptr = 0x7f0000000000ull;
static uint64_t fake_alloc(size_t bytes)
{
    uint64_t p = __atomic_fetch_add(&next_device_ptr, (bytes + 255) & ~255ull, __ATOMIC_RELAXED);
    return p;
}

#ifdef STANDIN_DRIVER
/* ---------------- driver API (libcuda.so.1) ---------------- */
typedef int CUresult;
typedef uint64_t CUdeviceptr;
typedef void *CUfunction;
typedef void *CUstream;
typedef void *CUcontext;

API CUresult cuInit(unsigned int flags) { (void)flags; return 0; }
API CUresult cuDriverGetVersion(int *v) { if (v) *v = 12040; return 0; }

/* cuLaunchKernel and its per-thread-default-stream twin: the same signature, the same body. */
#define CU_LAUNCH(name)                                                                                        \
    API CUresult name(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,         \
                      unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,                    \
                      unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)          \
    {                                                                                                            \
        (void)f; (void)gridDimX; (void)gridDimY; (void)gridDimZ; (void)blockDimX; (void)blockDimY;              \
        (void)blockDimZ; (void)sharedMemBytes; (void)hStream; (void)kernelParams; (void)extra;                  \
        spin_ns(launch_ns);                                                                                      \
        return 0;                                                                                                \
    }
CU_LAUNCH(cuLaunchKernel)
CU_LAUNCH(cuLaunchKernel_ptsz)

/* The legacy (v1, 32-bit pointer) allocator and the _v2 one that cuda.h maps cuMemAlloc to. */
API CUresult cuMemAlloc(unsigned int *dptr, unsigned int bytesize) { spin_ns(alloc_ns); if (dptr) *dptr = (unsigned int)fake_alloc(bytesize); return 0; }
API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) { spin_ns(alloc_ns); if (dptr) *dptr = fake_alloc(bytesize); return 0; }
API CUresult cuMemFree(unsigned int dptr) { (void)dptr; spin_ns(alloc_ns); return 0; }
API CUresult cuMemFree_v2(CUdeviceptr dptr) { (void)dptr; spin_ns(alloc_ns); return 0; }

#define COPY3(name) API CUresult name(uint64_t dst, uint64_t src, size_t bytes) { (void)dst; (void)src; (void)bytes; spin_ns(copy_ns); return 0; }
#define COPY4(name) API CUresult name(uint64_t dst, uint64_t src, size_t bytes, CUstream s) { (void)dst; (void)src; (void)bytes; (void)s; spin_ns(copy_ns); return 0; }
COPY3(cuMemcpy)
COPY3(cuMemcpy_ptds)
COPY4(cuMemcpyAsync)
COPY4(cuMemcpyAsync_ptsz)
COPY3(cuMemcpyHtoD_v2)
COPY3(cuMemcpyHtoD_v2_ptds)
COPY3(cuMemcpyDtoH_v2)
COPY3(cuMemcpyDtoH_v2_ptds)
COPY3(cuMemcpyDtoD_v2)
COPY3(cuMemcpyDtoD_v2_ptds)
COPY4(cuMemcpyHtoDAsync_v2)
COPY4(cuMemcpyHtoDAsync_v2_ptsz)
COPY4(cuMemcpyDtoHAsync_v2)
COPY4(cuMemcpyDtoHAsync_v2_ptsz)
COPY4(cuMemcpyDtoDAsync_v2)
COPY4(cuMemcpyDtoDAsync_v2_ptsz)
API CUresult cuMemcpyPeer(CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t bytes)
{ (void)dst; (void)dctx; (void)src; (void)sctx; (void)bytes; spin_ns(copy_ns); return 0; }
API CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t bytes, CUstream s)
{ (void)dst; (void)dctx; (void)src; (void)sctx; (void)bytes; (void)s; spin_ns(copy_ns); return 0; }

API CUresult cuCtxSynchronize(void) { sleep_ns(sync_ns); return 0; }
API CUresult cuStreamSynchronize(CUstream s) { (void)s; sleep_ns(sync_ns); return 0; }
API CUresult cuStreamSynchronize_ptsz(CUstream s) { (void)s; sleep_ns(sync_ns); return 0; }
#endif

#ifdef STANDIN_RUNTIME
/* ---------------- runtime API (libcudart.so.12) ---------------- */
typedef int cudaError_t;
typedef void *cudaStream_t;
typedef struct { unsigned int x, y, z; } dim3; /* 12 bytes: passed by value in two registers each (SysV x86-64) */

#define CUDA_LAUNCH(name)                                                                                       \
    API cudaError_t name(const void *func, dim3 gridDim, dim3 blockDim, void **args, size_t sharedMem,           \
                         cudaStream_t stream)                                                                    \
    {                                                                                                            \
        (void)func; (void)gridDim; (void)blockDim; (void)args; (void)sharedMem; (void)stream;                   \
        spin_ns(launch_ns);                                                                                      \
        return 0;                                                                                                \
    }
CUDA_LAUNCH(cudaLaunchKernel)
CUDA_LAUNCH(cudaLaunchKernel_ptsz)
API cudaError_t cudaMalloc(void **devPtr, size_t size) { spin_ns(alloc_ns); if (devPtr) *devPtr = (void *)fake_alloc(size); return 0; }
API cudaError_t cudaFree(void *devPtr) { (void)devPtr; spin_ns(alloc_ns); return 0; }
API cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, int kind) { (void)dst; (void)src; (void)count; (void)kind; spin_ns(copy_ns); return 0; }
API cudaError_t cudaMemcpy_ptds(void *dst, const void *src, size_t count, int kind) { (void)dst; (void)src; (void)count; (void)kind; spin_ns(copy_ns); return 0; }
API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, int kind, cudaStream_t s) { (void)dst; (void)src; (void)count; (void)kind; (void)s; spin_ns(copy_ns); return 0; }
API cudaError_t cudaMemcpyAsync_ptsz(void *dst, const void *src, size_t count, int kind, cudaStream_t s) { (void)dst; (void)src; (void)count; (void)kind; (void)s; spin_ns(copy_ns); return 0; }
API cudaError_t cudaStreamSynchronize(cudaStream_t s) { (void)s; sleep_ns(sync_ns); return 0; }
API cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t s) { (void)s; sleep_ns(sync_ns); return 0; }
API cudaError_t cudaDeviceSynchronize(void) { sleep_ns(sync_ns); return 0; }
#endif

#ifdef STANDIN_NCCL
/* ---------------- NCCL (libnccl.so.2) ---------------- */
typedef int ncclResult_t;
typedef int ncclDataType_t;
typedef int ncclRedOp_t;
typedef void *ncclComm_t;
typedef void *cudaStream_t;

API ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{ (void)sendbuff; (void)recvbuff; (void)count; (void)datatype; (void)op; (void)comm; (void)stream; sleep_ns(nccl_ns); return 0; }
API ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                               ncclComm_t comm, cudaStream_t stream)
{ (void)sendbuff; (void)recvbuff; (void)count; (void)datatype; (void)root; (void)comm; (void)stream; sleep_ns(nccl_ns); return 0; }
API ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                               ncclComm_t comm, cudaStream_t stream)
{ (void)sendbuff; (void)recvbuff; (void)sendcount; (void)datatype; (void)comm; (void)stream; sleep_ns(nccl_ns); return 0; }
API ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                                   ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{ (void)sendbuff; (void)recvbuff; (void)recvcount; (void)datatype; (void)op; (void)comm; (void)stream; sleep_ns(nccl_ns); return 0; }
#endif
