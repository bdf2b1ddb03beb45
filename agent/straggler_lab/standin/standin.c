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
 * Every call returns 0 (CUDA_SUCCESS / cudaSuccess / ncclSuccess), except the NCCL calls on a
 * communicator of ncclCommInitRank when its exchange fails (below).
 *
 * With the variables above only, that is all (no thread, no file, no socket). On top of it,
 * a synchronous job can be built (straggler.demo.syncjob), with these, read at load too:
 *
 *   STRAGGLER_STANDIN_KERNEL_US  (default 0) "GPU" time of a kernel. When > 0, each launch
 *       (cuLaunchKernel*, cudaLaunchKernel*) still busy-waits LAUNCH_US on the host and also
 *       puts a kernel on the process's DEVICE: one background thread (started at the first
 *       use, named "standin-gpu") that runs a FIFO queue in order; a kernel takes
 *       KERNEL_US x gpu_factor of device time (it sleeps; device time is kept on its own
 *       clock, so the device thread's own scheduling delays do not stretch it, as on a GPU).
 *   STRAGGLER_STANDIN_KERNEL_BLOCKS  (default 0: every kernel alike) the grid, in blocks
 *       (gridDimX x gridDimY x gridDimZ), that KERNEL_US is the device time of: when > 0, a kernel
 *       of B blocks takes KERNEL_US x B / KERNEL_BLOCKS (x gpu_factor) — more blocks, more GPU time,
 *       as a GPU whose SMs are all busy (a longer batch launches the same kernels on bigger grids).
 *       Synchronize calls (cuCtxSynchronize, cuStreamSynchronize*, cudaStreamSynchronize*,
 *       cudaDeviceSynchronize) first wait, asleep (a condition variable: off-CPU, blocked),
 *       until the device queue is empty, then sleep SYNC_US as before (set it to 0 then).
 *       There is one device per process: it lives in libcuda.so.1; libcudart.so.12 and
 *       libnccl.so.2 reach it by opening the libcuda.so.1 that lies beside them.
 *   STRAGGLER_STANDIN_CONTROL=PATH  run-time faults: a file of `key=value` lines, re-read when
 *       its mtime/size/inode change (checked with one stat() per synchronize call and per 1000
 *       launches, only when the device is in use). Keys read here: gpu_factor=<float>
 *       (default 1.0; it scales the device time of the kernels launched after it is read).
 *       Other keys are ignored (the job's own program reads the same file). No file = defaults.
 *       (The file is read as standin_control.h says, where the stand-in NVML's keys are listed.)
 *   STRAGGLER_STANDIN_NVML_CONFIG=PATH  the stand-in NVML's GPUs file (nvml.c, standin_control.h):
 *       when set, loading libcuda.so.1 records this process in its registry as a user of the GPU(s)
 *       whose control file is STRAGGLER_STANDIN_CONTROL (or STRAGGLER_STANDIN_GPU=INDEX).
 *   STRAGGLER_STANDIN_NCCL_ROOT=ADDR:PORT  rendezvous of ncclCommInitRank: a REAL collective.
 *       ncclGetUniqueId's id starts with a hash of ADDR:PORT (as NCCL's starts with a magic every
 *       rank of the communicator shares); ncclCommInitRank(comm, nranks, id, rank) ignores it: rank 0 listens on ADDR:PORT, the others connect to it
 *       (retried until the timeout below). Collectives on such a communicator move the data
 *       over TCP through rank 0 (a star: every rank sends its buffer to rank 0, rank 0 reduces
 *       or gathers and sends each rank its result), so a rank that arrives late makes all the
 *       others wait, for real, asleep in recv(). ncclAllReduce, ncclBroadcast, ncclAllGather,
 *       ncclReduceScatter; sum/prod/max/min/avg on int8/uint8/int32/uint32/int64/uint64/
 *       float32/float64 (copies: any type). Called with a communicator that ncclCommInitRank
 *       did not make (NULL, or any other pointer), the collectives sleep NCCL_US as before.
 *   STRAGGLER_STANDIN_NCCL_MODE  blocking (default) | enqueue. blocking: a collective first
 *       waits for the device queue to drain, then does the exchange in the calling thread
 *       and returns with the result. enqueue: as real NCCL on a GPU, the collective goes on
 *       the device queue and the call returns at once; the device thread does the exchange
 *       after the kernels before it, and the next synchronize waits for it. An exchange that
 *       fails there is reported by the next collective on that communicator and by
 *       ncclCommGetAsyncError.
 *   STRAGGLER_STANDIN_NCCL_TIMEOUT_S  (default 30) how long ncclCommInitRank tries to meet the
 *       other ranks, and how long one send or receive of a collective may wait for a peer;
 *       past it the call fails with ncclSystemError (the communicator is then broken).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "standin_control.h"

#define API __attribute__((visibility("default"), noinline))

static long launch_ns = 5000, alloc_ns = 20000, copy_ns = 10000, sync_ns = 100000, nccl_ns = 200000;
static long kernel_ns = 0;
static long kernel_blocks = 0;   /* the grid KERNEL_US is for (0: every kernel alike) */

static long env_us(const char *name, long dflt_ns)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return dflt_ns;
    return atol(v) * 1000L;
}

/* True when this library may have to reach the process's device (libcuda.so.1's queue). */
static int device_used = 0;

static int env_is(const char *name, const char *value)
{
    const char *v = getenv(name);
    return v && strcmp(v, value) == 0;
}

__attribute__((constructor)) static void standin_read_env(void)
{
    launch_ns = env_us("STRAGGLER_STANDIN_LAUNCH_US", launch_ns);
    alloc_ns = env_us("STRAGGLER_STANDIN_ALLOC_US", alloc_ns);
    copy_ns = env_us("STRAGGLER_STANDIN_COPY_US", copy_ns);
    sync_ns = env_us("STRAGGLER_STANDIN_SYNC_US", sync_ns);
    nccl_ns = env_us("STRAGGLER_STANDIN_NCCL_US", nccl_ns);
    kernel_ns = env_us("STRAGGLER_STANDIN_KERNEL_US", kernel_ns);
    const char *blocks = getenv("STRAGGLER_STANDIN_KERNEL_BLOCKS");
    if (blocks && *blocks)
        kernel_blocks = strtol(blocks, NULL, 10);
    const char *root = getenv("STRAGGLER_STANDIN_NCCL_ROOT");
    device_used = kernel_ns > 0 || (root && *root) || env_is("STRAGGLER_STANDIN_NCCL_MODE", "enqueue");
}

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Busy-wait: the CPU stays busy, like the host side of a kernel launch. */
__attribute__((unused)) static void spin_ns(long ns)
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
__attribute__((unused)) static uint64_t fake_alloc(size_t bytes)
{
    uint64_t p = __atomic_fetch_add(&next_device_ptr, (bytes + 255) & ~255ull, __ATOMIC_RELAXED);
    return p;
}

/* The process's device, as libcuda.so.1 exports it to the other two stand-in libraries. */
struct standin_device_api {
    int version;                                   /* 2 */
    void (*kernel)(unsigned long blocks);          /* enqueue one kernel of that grid (KERNEL_US x gpu_factor,
                                                      scaled by its blocks when KERNEL_BLOCKS is set) */
    int (*host_fn)(void (*fn)(void *), void *arg); /* enqueue fn(arg), run by the device thread; 0 ok */
    void (*drain)(void);                           /* wait, asleep, until the queue is empty */
};

#ifdef STANDIN_DRIVER
/* ---------------- the device (lives in libcuda.so.1) ---------------- */
struct dev_item {
    struct dev_item *next;
    long ns;                  /* a kernel: device time */
    void (*fn)(void *);       /* or a host function (an enqueued collective) */
    void *arg;
    uint64_t enqueued_ns;
};

static pthread_mutex_t dev_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t dev_work_cv = PTHREAD_COND_INITIALIZER;
static pthread_cond_t dev_idle_cv = PTHREAD_COND_INITIALIZER;
static struct dev_item *dev_head, *dev_tail;
static int dev_busy;          /* the device thread is running an item */
static int dev_started;       /* 1: thread running; -1: it could not be started */
static uint64_t dev_clock;    /* device time: when the last kernel ended (ns, CLOCK_MONOTONIC) */
static double gpu_factor = 1.0;
static unsigned long dev_launches;

/* ---- the control file (STRAGGLER_STANDIN_CONTROL) ---- */
static pthread_mutex_t ctl_mu = PTHREAD_MUTEX_INITIALIZER;
static int ctl_seen;          /* the file existed at the last check */
static struct stat ctl_stat;

static void control_check(void)
{
    const char *path = getenv("STRAGGLER_STANDIN_CONTROL");
    if (!path || !*path)
        return;
    pthread_mutex_lock(&ctl_mu);
    struct stat st;
    double factor = 1.0;
    if (stat(path, &st) != 0) {
        if (ctl_seen) {
            ctl_seen = 0;
            pthread_mutex_lock(&dev_mu);
            gpu_factor = 1.0;
            pthread_mutex_unlock(&dev_mu);
        }
        pthread_mutex_unlock(&ctl_mu);
        return;
    }
    if (ctl_seen && st.st_ino == ctl_stat.st_ino && st.st_dev == ctl_stat.st_dev && st.st_size == ctl_stat.st_size &&
        st.st_mtim.tv_sec == ctl_stat.st_mtim.tv_sec && st.st_mtim.tv_nsec == ctl_stat.st_mtim.tv_nsec) {
        pthread_mutex_unlock(&ctl_mu);
        return;
    }
    ctl_seen = 1;
    ctl_stat = st;
    FILE *f = fopen(path, "r");
    if (f) {
        struct standin_control ctl;   /* the keys as the stand-in NVML reads them too (standin_control.h) */
        standin_control_defaults(&ctl);
        standin_control_parse(f, &ctl);
        factor = ctl.gpu_factor;
        fclose(f);
    }
    pthread_mutex_lock(&dev_mu);
    gpu_factor = factor;
    pthread_mutex_unlock(&dev_mu);
    pthread_mutex_unlock(&ctl_mu);
}

static void sleep_until(uint64_t t)
{
    struct timespec ts = {(time_t)(t / 1000000000ull), (long)(t % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

static void *device_main(void *unused)
{
    (void)unused;
    pthread_setname_np(pthread_self(), "standin-gpu");
    pthread_mutex_lock(&dev_mu);
    for (;;) {
        while (!dev_head)
            pthread_cond_wait(&dev_work_cv, &dev_mu);
        struct dev_item *item = dev_head;
        dev_head = item->next;
        if (!dev_head)
            dev_tail = NULL;
        dev_busy = 1;
        pthread_mutex_unlock(&dev_mu);
        if (item->fn) {
            item->fn(item->arg);
            dev_clock = now_ns();
        } else {
            /* a kernel starts when it was launched or when the one before it ended */
            uint64_t start = item->enqueued_ns > dev_clock ? item->enqueued_ns : dev_clock;
            dev_clock = start + (uint64_t)item->ns;
            sleep_until(dev_clock);
        }
        free(item);
        pthread_mutex_lock(&dev_mu);
        dev_busy = 0;
        if (!dev_head)
            pthread_cond_broadcast(&dev_idle_cv);
    }
    return NULL;
}

/* Start the device thread once (called with dev_mu held). 0 when it runs. */
static int device_start_locked(void)
{
    if (dev_started)
        return dev_started > 0 ? 0 : -1;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* the device thread takes no signals */
    pthread_t tid;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&tid, &attr, device_main, NULL);
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        fprintf(stderr, "stand-in libcuda: cannot start the device thread (%s): kernels take no device time\n",
                strerror(rc));
        dev_started = -1;
        return -1;
    }
    __atomic_store_n(&dev_started, 1, __ATOMIC_RELEASE);
    return 0;
}

static int device_push(long ns, void (*fn)(void *), void *arg)
{
    struct dev_item *item = calloc(1, sizeof *item);
    if (!item)
        return -1;
    item->ns = ns;
    item->fn = fn;
    item->arg = arg;
    item->enqueued_ns = now_ns();
    pthread_mutex_lock(&dev_mu);
    if (device_start_locked() != 0) {
        pthread_mutex_unlock(&dev_mu);
        free(item);
        return -1;
    }
    if (fn == NULL)
        item->ns = (long)((double)ns * gpu_factor);
    if (dev_tail)
        dev_tail->next = item;
    else
        dev_head = item;
    dev_tail = item;
    pthread_cond_signal(&dev_work_cv);
    pthread_mutex_unlock(&dev_mu);
    return 0;
}

static void device_kernel(unsigned long blocks)
{
    if (kernel_ns <= 0)
        return;
    if (__atomic_fetch_add(&dev_launches, 1, __ATOMIC_RELAXED) % 1000 == 0)
        control_check();
    device_push(kernel_blocks > 0 ? (long)((double)kernel_ns * (double)blocks / (double)kernel_blocks) : kernel_ns,
                NULL, NULL);
}

static int device_host_fn(void (*fn)(void *), void *arg)
{
    if (!fn)
        return -1;
    return device_push(0, fn, arg);
}

static void device_drain(void)
{
    if (!__atomic_load_n(&dev_started, __ATOMIC_ACQUIRE))
        return; /* nothing was ever put on the device: the defaults stay exactly as they were */
    control_check();
    pthread_mutex_lock(&dev_mu);
    while (dev_head || dev_busy)
        pthread_cond_wait(&dev_idle_cv, &dev_mu);
    pthread_mutex_unlock(&dev_mu);
}

static const struct standin_device_api the_device = {2, device_kernel, device_host_fn, device_drain};

/* ---- the stand-in NVML's process registry (standin_control.h) ----
 * With STRAGGLER_STANDIN_NVML_CONFIG set, a process that loads this library uses the stand-in GPU(s)
 * whose control= is its STRAGGLER_STANDIN_CONTROL (or the index in STRAGGLER_STANDIN_GPU): one line
 * `PID INDEX BYTES` is appended to the registry (O_APPEND, one write: whole lines), which the stand-in
 * NVML reads for its running compute processes. Without the variable: nothing. */
#define STANDIN_PROCESS_BYTES (1ull << 30)   /* the device memory a stand-in process "holds" */

__attribute__((constructor)) static void standin_register_gpu_use(void)
{
    const char *config = getenv("STRAGGLER_STANDIN_NVML_CONFIG");
    if (!config || !*config)
        return;
    static struct standin_gpus_file gpus;      /* large: not on the stack */
    if (standin_gpus_read(config, &gpus) != 0)
        return;
    const char *control = getenv("STRAGGLER_STANDIN_CONTROL");
    const char *wanted = getenv("STRAGGLER_STANDIN_GPU");
    char control_real[STANDIN_PATH_MAX], gpu_real[STANDIN_PATH_MAX];
    int have_control = control && *control && realpath(control, control_real) != NULL;
    int fd = -1;
    for (int i = 0; i < gpus.count; i++) {
        const struct standin_gpu_config *g = &gpus.gpus[i];
        int mine = 0;
        if (wanted && *wanted)
            mine = (long long)g->index == standin_count(wanted);
        else if (control && *control && g->control[0])
            mine = strcmp(control, g->control) == 0 ||
                   (have_control && realpath(g->control, gpu_real) && strcmp(control_real, gpu_real) == 0);
        if (!mine)
            continue;
        if (fd < 0)
            fd = open(gpus.registry, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0)
            return;
        char line[96];
        int n = snprintf(line, sizeof line, "%d %u %llu\n", (int)getpid(), g->index, STANDIN_PROCESS_BYTES);
        if (write(fd, line, (size_t)n) != n)
            break;
    }
    if (fd >= 0)
        close(fd);
}

/* For libcudart.so.12 and libnccl.so.2 (dlsym): the one device of this process. */
API const struct standin_device_api *straggler_standin_device(void) { return &the_device; }

static const struct standin_device_api *device(void) { return &the_device; }
#else
/* ---------------- the device, reached from libcudart.so.12 / libnccl.so.2 ---------------- */
static const struct standin_device_api *dev_api;
static pthread_once_t dev_once = PTHREAD_ONCE_INIT;

static void device_resolve(void)
{
    void *lib = NULL;
    Dl_info info;
    char path[4096];
    if (dladdr((void *)&device_resolve, &info) && info.dli_fname) {
        const char *slash = strrchr(info.dli_fname, '/');
        int dir_len = slash ? (int)(slash - info.dli_fname) + 1 : 0;
        if (snprintf(path, sizeof path, "%.*slibcuda.so.1", dir_len, info.dli_fname) < (int)sizeof path)
            lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    }
    if (!lib)
        lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    const struct standin_device_api *(*get)(void) = NULL;
    if (lib)
        *(void **)&get = dlsym(lib, "straggler_standin_device");
    if (get)
        dev_api = get();
    if (!dev_api || dev_api->version < 2) {
        dev_api = NULL;
        fprintf(stderr, "stand-in: the stand-in libcuda.so.1 (its device) was not found beside this library: "
                        "kernels and enqueued collectives run on no device\n");
    }
}

/* The device, or NULL when this process does not use one (or libcuda.so.1 is not the stand-in). */
static const struct standin_device_api *device(void)
{
    if (!device_used)
        return NULL;
    pthread_once(&dev_once, device_resolve);
    return dev_api;
}
#endif

/* Before a synchronize call's own sleep: wait until the device has run everything queued. */
__attribute__((unused)) static void sync_wait(void)
{
    const struct standin_device_api *dev = device();
    if (dev)
        dev->drain();
}

/* After a launch's host-side cost: the kernel goes on the device. */
__attribute__((unused)) static void launch_kernel(unsigned int gx, unsigned int gy, unsigned int gz)
{
    if (kernel_ns <= 0)
        return;
    const struct standin_device_api *dev = device();
    if (dev)
        dev->kernel((unsigned long)gx * gy * gz);
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
        launch_kernel(gridDimX, gridDimY, gridDimZ);                                                             \
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

API CUresult cuCtxSynchronize(void) { sync_wait(); sleep_ns(sync_ns); return 0; }
API CUresult cuStreamSynchronize(CUstream s) { (void)s; sync_wait(); sleep_ns(sync_ns); return 0; }
API CUresult cuStreamSynchronize_ptsz(CUstream s) { (void)s; sync_wait(); sleep_ns(sync_ns); return 0; }
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
        launch_kernel(gridDim.x, gridDim.y, gridDim.z);                                                          \
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
API cudaError_t cudaStreamSynchronize(cudaStream_t s) { (void)s; sync_wait(); sleep_ns(sync_ns); return 0; }
API cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t s) { (void)s; sync_wait(); sleep_ns(sync_ns); return 0; }
API cudaError_t cudaDeviceSynchronize(void) { sync_wait(); sleep_ns(sync_ns); return 0; }
#endif

#ifdef STANDIN_NCCL
/* ---------------- NCCL (libnccl.so.2) ---------------- */
typedef int ncclResult_t;
typedef int ncclDataType_t;
typedef int ncclRedOp_t;
typedef void *ncclComm_t;
typedef void *cudaStream_t;
typedef struct { char internal[128]; } ncclUniqueId; /* NCCL_UNIQUE_ID_BYTES = 128, passed by value */

enum { ncclSuccess = 0, ncclUnhandledCudaError = 1, ncclSystemError = 2, ncclInternalError = 3,
       ncclInvalidArgument = 4, ncclInvalidUsage = 5, ncclRemoteError = 6 };
enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 };
enum { COLL_ALLREDUCE = 1, COLL_BROADCAST = 2, COLL_ALLGATHER = 3, COLL_REDUCESCATTER = 4 };

#define WIRE_MAGIC 0x53544e43u  /* "STNC" */
#define DEFAULT_TIMEOUT_S 30

/* A communicator made by ncclCommInitRank. Only pointers found in `comms` are ever used as
 * one: anything else (NULL, a made-up handle) keeps the plain sleeping collectives. */
struct standin_comm {
    struct standin_comm *next;
    int nranks, rank;
    int fd;              /* rank > 0: its socket to rank 0 */
    int *peers;          /* rank 0: peers[r], the socket to rank r (r >= 1) */
    int timeout_s;
    uint64_t seq;        /* collectives so far (every rank counts the same) */
    int async_err;       /* sticky: the first failed exchange breaks the communicator */
    pthread_mutex_t mu;  /* one exchange at a time */
    char *scratch;
    size_t scratch_len;
};

struct wire_hdr {
    uint32_t magic;
    uint32_t kind;
    int32_t dtype, op, root, rank;
    uint64_t seq, count, nbytes;
};

struct wire_hello {
    uint32_t magic;
    int32_t rank, nranks, status;
};

static pthread_mutex_t comms_mu = PTHREAD_MUTEX_INITIALIZER;
static struct standin_comm *comms;

static struct standin_comm *comm_lookup(ncclComm_t comm)
{
    if (!comm)
        return NULL;
    struct standin_comm *c;
    pthread_mutex_lock(&comms_mu);
    for (c = comms; c && (void *)c != comm; c = c->next)
        ;
    pthread_mutex_unlock(&comms_mu);
    return c;
}

static int nccl_enqueue_mode(void)
{
    const char *mode = getenv("STRAGGLER_STANDIN_NCCL_MODE");
    return mode && strcmp(mode, "enqueue") == 0;
}

static size_t dtype_size(int dtype)
{
    switch (dtype) {
    case 0: case 1: return 1;          /* int8, uint8 */
    case 6: case 9: return 2;          /* float16, bfloat16 (copied, not reduced) */
    case 2: case 3: case 7: return 4;  /* int32, uint32, float32 */
    case 4: case 5: case 8: return 8;  /* int64, uint64, float64 */
    default: return 0;
    }
}

static int reducible(int dtype, int op)
{
    return dtype_size(dtype) && dtype != 6 && dtype != 9 && op >= ncclSum && op <= ncclAvg;
}

#define REDUCE_AS(T)                                                              \
    do {                                                                          \
        T *a = (T *)acc;                                                          \
        const T *b = (const T *)in;                                               \
        switch (op) {                                                             \
        case ncclSum: case ncclAvg: for (i = 0; i < n; i++) a[i] += b[i]; break;  \
        case ncclProd: for (i = 0; i < n; i++) a[i] *= b[i]; break;               \
        case ncclMax: for (i = 0; i < n; i++) if (b[i] > a[i]) a[i] = b[i]; break;\
        case ncclMin: for (i = 0; i < n; i++) if (b[i] < a[i]) a[i] = b[i]; break;\
        }                                                                         \
    } while (0)
#define DIVIDE_AS(T)                                                              \
    do {                                                                          \
        T *a = (T *)acc;                                                          \
        for (i = 0; i < n; i++) a[i] = (T)(a[i] / (T)nranks);                     \
    } while (0)

static void reduce_into(void *acc, const void *in, size_t n, int dtype, int op)
{
    size_t i;
    switch (dtype) {
    case 0: REDUCE_AS(int8_t); break;
    case 1: REDUCE_AS(uint8_t); break;
    case 2: REDUCE_AS(int32_t); break;
    case 3: REDUCE_AS(uint32_t); break;
    case 4: REDUCE_AS(int64_t); break;
    case 5: REDUCE_AS(uint64_t); break;
    case 7: REDUCE_AS(float); break;
    case 8: REDUCE_AS(double); break;
    }
}

static void average(void *acc, size_t n, int dtype, int nranks)
{
    size_t i;
    switch (dtype) {
    case 0: DIVIDE_AS(int8_t); break;
    case 1: DIVIDE_AS(uint8_t); break;
    case 2: DIVIDE_AS(int32_t); break;
    case 3: DIVIDE_AS(uint32_t); break;
    case 4: DIVIDE_AS(int64_t); break;
    case 5: DIVIDE_AS(uint64_t); break;
    case 7: DIVIDE_AS(float); break;
    case 8: DIVIDE_AS(double); break;
    }
}

/* Send or receive exactly len bytes. 0: done; -1: error or timeout (errno); -2: the peer closed. */
static int io_all(int fd, void *buf, size_t len, int sending)
{
    char *p = buf;
    while (len > 0) {
        ssize_t n = sending ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
        } else if (n == 0) {
            return -2;
        } else if (errno != EINTR) {
            return -1;
        }
    }
    return 0;
}

static void socket_timeouts(int fd, int seconds)
{
    struct timeval tv = {seconds, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

static void socket_for_data(int fd, int seconds)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    socket_timeouts(fd, seconds);
}

static const char *io_what(int rc)
{
    return rc == -2 ? "the peer closed the connection" : errno == EAGAIN || errno == EWOULDBLOCK ? "timed out" : strerror(errno);
}

/* The first failure breaks the communicator (as a real NCCL error does); later calls return it. */
static ncclResult_t comm_fail(struct standin_comm *c, ncclResult_t err, int peer, const char *what)
{
    if (!__atomic_load_n(&c->async_err, __ATOMIC_ACQUIRE)) {
        fprintf(stderr, "stand-in libnccl: rank %d/%d, collective %llu, with rank %d: %s; the communicator is broken\n",
                c->rank, c->nranks, (unsigned long long)c->seq, peer, what);
        __atomic_store_n(&c->async_err, err, __ATOMIC_RELEASE);
    }
    return err;
}

static char *scratch(struct standin_comm *c, size_t len)
{
    if (c->scratch_len < len) {
        char *p = realloc(c->scratch, len);
        if (!p)
            return NULL;
        c->scratch = p;
        c->scratch_len = len;
    }
    return c->scratch;
}

static ncclResult_t exchange_locked(struct standin_comm *c, int kind, const void *sendbuff, void *recvbuff, size_t count,
                                    int dtype, int op, int root)
{
    const size_t sz = dtype_size(dtype);
    const int n = c->nranks;
    const size_t bytes = count * sz;     /* one rank's share */
    size_t in_bytes, out_bytes;
    switch (kind) {
    case COLL_ALLREDUCE: in_bytes = out_bytes = bytes; break;
    case COLL_BROADCAST: in_bytes = c->rank == root ? bytes : 0; out_bytes = bytes; break;
    case COLL_ALLGATHER: in_bytes = bytes; out_bytes = bytes * (size_t)n; break;
    default: in_bytes = bytes * (size_t)n; out_bytes = bytes; break; /* reduce-scatter */
    }
    uint64_t seq = ++c->seq;
    if (n == 1) {
        if (out_bytes && recvbuff != sendbuff)
            memmove(recvbuff, sendbuff, out_bytes);
        return ncclSuccess;
    }
    struct wire_hdr hdr = {WIRE_MAGIC, (uint32_t)kind, dtype, op, root, c->rank, seq, count, in_bytes};
    int rc;
    if (c->rank != 0) {
        if ((rc = io_all(c->fd, &hdr, sizeof hdr, 1)) != 0 || (in_bytes && (rc = io_all(c->fd, (void *)sendbuff, in_bytes, 1)) != 0))
            return comm_fail(c, rc == -2 ? ncclRemoteError : ncclSystemError, 0, io_what(rc));
        struct wire_hdr back;
        if ((rc = io_all(c->fd, &back, sizeof back, 0)) != 0)
            return comm_fail(c, rc == -2 ? ncclRemoteError : ncclSystemError, 0, io_what(rc));
        if (back.magic != WIRE_MAGIC || back.seq != seq || back.nbytes != out_bytes)
            return comm_fail(c, back.magic == WIRE_MAGIC ? (ncclResult_t)back.op : ncclInternalError, 0,
                             "rank 0 answered another collective (the ranks' calls do not match)");
        if ((rc = io_all(c->fd, recvbuff, out_bytes, 0)) != 0)
            return comm_fail(c, rc == -2 ? ncclRemoteError : ncclSystemError, 0, io_what(rc));
        return ncclSuccess;
    }
    /* rank 0: gather every rank's input, compute, send each rank its result */
    size_t acc_len = kind == COLL_ALLGATHER || kind == COLL_REDUCESCATTER ? bytes * (size_t)n : bytes;
    size_t tmp_len = kind == COLL_ALLREDUCE || kind == COLL_REDUCESCATTER ? acc_len : 0;
    char *acc = scratch(c, acc_len + tmp_len + 1);
    if (!acc)
        return comm_fail(c, ncclSystemError, 0, "out of memory");
    char *tmp = acc + acc_len;
    const char *result = acc;
    switch (kind) {
    case COLL_ALLREDUCE: case COLL_REDUCESCATTER: memcpy(acc, sendbuff, acc_len); break;
    case COLL_ALLGATHER: memcpy(acc, sendbuff, bytes); break;
    case COLL_BROADCAST: if (root == 0) result = sendbuff; break;
    }
    for (int r = 1; r < n; r++) {
        struct wire_hdr in;
        if ((rc = io_all(c->peers[r], &in, sizeof in, 0)) != 0)
            return comm_fail(c, rc == -2 ? ncclRemoteError : ncclSystemError, r, io_what(rc));
        size_t want = kind == COLL_BROADCAST ? (r == root ? bytes : 0) : in_bytes;
        if (in.magic != WIRE_MAGIC || in.seq != seq || in.kind != (uint32_t)kind || in.dtype != dtype || in.op != op ||
            in.root != root || in.count != count || in.nbytes != want) {
            char what[200];
            snprintf(what, sizeof what, "its call does not match rank 0's (collective %llu kind %u count %llu dtype %d op %d "
                     "vs %llu kind %d count %zu dtype %d op %d)", (unsigned long long)in.seq, in.kind,
                     (unsigned long long)in.count, in.dtype, in.op, (unsigned long long)seq, kind, count, dtype, op);
            return comm_fail(c, ncclInvalidUsage, r, what);
        }
        char *into = kind == COLL_ALLGATHER ? acc + (size_t)r * bytes : kind == COLL_BROADCAST ? acc : tmp;
        if (want && (rc = io_all(c->peers[r], into, want, 0)) != 0)
            return comm_fail(c, rc == -2 ? ncclRemoteError : ncclSystemError, r, io_what(rc));
        if (kind == COLL_ALLREDUCE || kind == COLL_REDUCESCATTER)
            reduce_into(acc, tmp, acc_len / sz, dtype, op);
    }
    if (op == ncclAvg && (kind == COLL_ALLREDUCE || kind == COLL_REDUCESCATTER))
        average(acc, acc_len / sz, dtype, n);
    for (int r = 1; r < n; r++) {
        const char *part = kind == COLL_REDUCESCATTER ? result + (size_t)r * bytes : result;
        struct wire_hdr out = {WIRE_MAGIC, (uint32_t)kind, dtype, ncclSuccess, root, 0, seq, count, out_bytes};
        if ((rc = io_all(c->peers[r], &out, sizeof out, 1)) != 0 || (rc = io_all(c->peers[r], (void *)part, out_bytes, 1)) != 0)
            return comm_fail(c, rc == -2 ? ncclRemoteError : ncclSystemError, r, io_what(rc));
    }
    if (recvbuff != result)
        memmove(recvbuff, result, out_bytes);
    return ncclSuccess;
}

static ncclResult_t exchange(struct standin_comm *c, int kind, const void *sendbuff, void *recvbuff, size_t count,
                             int dtype, int op, int root)
{
    pthread_mutex_lock(&c->mu);
    ncclResult_t rc = __atomic_load_n(&c->async_err, __ATOMIC_ACQUIRE);
    if (rc == ncclSuccess)
        rc = exchange_locked(c, kind, sendbuff, recvbuff, count, dtype, op, root);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* An enqueued collective, run by the device thread. */
struct pending_coll {
    struct standin_comm *c;
    int kind, dtype, op, root;
    const void *sendbuff;
    void *recvbuff;
    size_t count;
};

static void run_pending(void *arg)
{
    struct pending_coll *p = arg;
    exchange(p->c, p->kind, p->sendbuff, p->recvbuff, p->count, p->dtype, p->op, p->root);
    free(p);
}

static ncclResult_t collective(int kind, const void *sendbuff, void *recvbuff, size_t count, int dtype, int op, int root,
                               ncclComm_t comm)
{
    struct standin_comm *c = comm_lookup(comm);
    if (!c) {  /* not a communicator of ncclCommInitRank: the plain stand-in */
        sleep_ns(nccl_ns);
        return ncclSuccess;
    }
    size_t sz = dtype_size(dtype);
    if (!sz || ((kind == COLL_ALLREDUCE || kind == COLL_REDUCESCATTER) && !reducible(dtype, op)) ||
        (kind == COLL_BROADCAST && (root < 0 || root >= c->nranks)) || count > SIZE_MAX / 2 / sz / (size_t)c->nranks ||
        (count && (!recvbuff || (!sendbuff && (kind != COLL_BROADCAST || c->rank == root)))))
        return ncclInvalidArgument;
    ncclResult_t err = __atomic_load_n(&c->async_err, __ATOMIC_ACQUIRE);
    if (err != ncclSuccess)
        return err;
    const struct standin_device_api *dev = device();
    if (dev && nccl_enqueue_mode()) {
        struct pending_coll *p = malloc(sizeof *p);
        if (p) {
            *p = (struct pending_coll){c, kind, dtype, op, root, sendbuff, recvbuff, count};
            if (dev->host_fn(run_pending, p) == 0)
                return ncclSuccess;
            free(p);
        }
    }
    if (dev)
        dev->drain();
    return exchange(c, kind, sendbuff, recvbuff, count, dtype, op, root);
}

API ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{ (void)stream; return collective(COLL_ALLREDUCE, sendbuff, recvbuff, count, datatype, op, 0, comm); }
API ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                               ncclComm_t comm, cudaStream_t stream)
{ (void)stream; return collective(COLL_BROADCAST, sendbuff, recvbuff, count, datatype, ncclSum, root, comm); }
API ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                               ncclComm_t comm, cudaStream_t stream)
{ (void)stream; return collective(COLL_ALLGATHER, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm); }
API ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                                   ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{ (void)stream; return collective(COLL_REDUCESCATTER, sendbuff, recvbuff, recvcount, datatype, op, 0, comm); }

/* ---- communicators: the rendezvous of STRAGGLER_STANDIN_NCCL_ROOT ---- */

static int split_addr(const char *spec, char *host, size_t host_len, char *port, size_t port_len)
{
    const char *colon = strrchr(spec, ':');
    if (!colon || !colon[1])
        return -1;
    const char *h = spec;
    size_t hl = (size_t)(colon - spec);
    if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') { /* [v6]:port */
        h++;
        hl -= 2;
    }
    if (hl >= host_len || strlen(colon + 1) >= port_len)
        return -1;
    memcpy(host, h, hl);
    host[hl] = 0;
    strcpy(port, colon + 1);
    return 0;
}

static long ms_left(uint64_t deadline)
{
    uint64_t now = now_ns();
    return now >= deadline ? 0 : (long)((deadline - now) / 1000000ull) + 1;
}

static int rendezvous_root(struct standin_comm *c, const char *host, const char *port, uint64_t deadline)
{
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int gai = getaddrinfo(*host ? host : NULL, port, &hints, &res);
    if (gai != 0) {
        fprintf(stderr, "stand-in libnccl: rank 0: cannot resolve %s:%s: %s\n", host, port, gai_strerror(gai));
        return -1;
    }
    int lfd = -1;
    for (;;) {
        lfd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int one = 1;
        if (lfd >= 0 && setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0 &&
            bind(lfd, res->ai_addr, res->ai_addrlen) == 0 && listen(lfd, c->nranks + 4) == 0)
            break;
        int err = errno;
        if (lfd >= 0)
            close(lfd);
        lfd = -1;
        if (err != EADDRINUSE || ms_left(deadline) == 0) {
            fprintf(stderr, "stand-in libnccl: rank 0: cannot listen on %s:%s: %s\n", host, port, strerror(err));
            break;
        }
        sleep_ns(200000000L);
    }
    freeaddrinfo(res);
    if (lfd < 0)
        return -1;
    c->peers = malloc(sizeof(int) * (size_t)c->nranks);
    if (!c->peers) {
        close(lfd);
        return -1;
    }
    for (int r = 0; r < c->nranks; r++)
        c->peers[r] = -1;
    int joined = 0;
    while (joined < c->nranks - 1) {
        long left = ms_left(deadline);
        if (left == 0) {
            fprintf(stderr, "stand-in libnccl: rank 0: only %d of %d ranks joined at %s:%s in %d s\n", joined + 1,
                    c->nranks, host, port, c->timeout_s);
            close(lfd);
            return -1;
        }
        struct pollfd pfd = {lfd, POLLIN, 0};
        if (poll(&pfd, 1, (int)(left < 1000 ? left : 1000)) <= 0)
            continue;
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        socket_timeouts(fd, 5);
        struct wire_hello hello;
        if (io_all(fd, &hello, sizeof hello, 0) != 0 || hello.magic != WIRE_MAGIC || hello.nranks != c->nranks ||
            hello.rank < 1 || hello.rank >= c->nranks || c->peers[hello.rank] >= 0) {
            fprintf(stderr, "stand-in libnccl: rank 0: a connection that is not a new rank of this %d-rank "
                            "communicator was refused\n", c->nranks);
            close(fd);
            continue;
        }
        socket_for_data(fd, c->timeout_s);
        c->peers[hello.rank] = fd;
        joined++;
    }
    close(lfd);
    for (int r = 1; r < c->nranks; r++) {
        struct wire_hello ok = {WIRE_MAGIC, 0, c->nranks, 0};
        if (io_all(c->peers[r], &ok, sizeof ok, 1) != 0) {
            fprintf(stderr, "stand-in libnccl: rank 0: rank %d left during the rendezvous\n", r);
            return -1;
        }
    }
    return 0;
}

static int rendezvous_peer(struct standin_comm *c, const char *host, const char *port, uint64_t deadline)
{
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    int gai = getaddrinfo(host, port, &hints, &res);
    if (gai != 0) {
        fprintf(stderr, "stand-in libnccl: rank %d: cannot resolve %s:%s: %s\n", c->rank, host, port, gai_strerror(gai));
        return -1;
    }
    int fd = -1, err = 0;
    while (fd < 0) {
        for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
            fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (fd < 0) {
                err = errno;
                continue;
            }
            socket_timeouts(fd, 2);
            if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
                err = errno;
                close(fd);
                fd = -1;
                continue;
            }
            socket_for_data(fd, c->timeout_s);
            struct wire_hello hello = {WIRE_MAGIC, c->rank, c->nranks, 0}, ok;
            long left = ms_left(deadline);
            socket_timeouts(fd, (int)(left / 1000) + 1);
            int rc = io_all(fd, &hello, sizeof hello, 1);
            if (rc == 0)
                rc = io_all(fd, &ok, sizeof ok, 0);
            if (rc != 0 || ok.magic != WIRE_MAGIC || ok.status != 0) {
                err = rc == -2 ? ECONNRESET : errno;
                close(fd);
                fd = -1;
                continue;
            }
            socket_for_data(fd, c->timeout_s);
        }
        if (fd >= 0 || ms_left(deadline) == 0)
            break;
        sleep_ns(100000000L);
    }
    freeaddrinfo(res);
    if (fd < 0) {
        fprintf(stderr, "stand-in libnccl: rank %d: could not join rank 0 at %s:%s in %d s: %s\n", c->rank, host, port,
                c->timeout_s, strerror(err));
        return -1;
    }
    c->fd = fd;
    return 0;
}

static void comm_free(struct standin_comm *c)
{
    if (c->fd >= 0)
        close(c->fd);
    if (c->peers) {
        for (int r = 1; r < c->nranks; r++)
            if (c->peers[r] >= 0)
                close(c->peers[r]);
        free(c->peers);
    }
    pthread_mutex_destroy(&c->mu);
    free(c->scratch);
    free(c);
}

API ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId)
{
    if (!uniqueId)
        return ncclInvalidArgument;
    memset(uniqueId, 0, sizeof *uniqueId);
    /* NCCL's id starts with a random 64-bit magic that every rank of the communicator is given (rank 0 makes
     * it, the job passes it on). The stand-in meets at STRAGGLER_STANDIN_NCCL_ROOT instead, and every rank
     * calls this itself, so its magic is a hash (FNV-1a) of that address: the same on every rank of one
     * meeting, as a tracer sees on real NCCL. The rest of the id is not used. */
    const char *root = getenv("STRAGGLER_STANDIN_NCCL_ROOT");
    uint64_t magic = 0xcbf29ce484222325ull;
    for (const char *p = root ? root : ""; *p; p++)
        magic = (magic ^ (unsigned char)*p) * 0x100000001b3ull;
    memcpy(uniqueId->internal, &magic, sizeof magic);
    snprintf(uniqueId->internal + 8, sizeof uniqueId->internal - 8, "straggler-standin-nccl pid %d", (int)getpid());
    return ncclSuccess;
}

API ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    (void)commId;
    if (!comm || nranks < 1 || rank < 0 || rank >= nranks)
        return ncclInvalidArgument;
    *comm = NULL;
    struct standin_comm *c = calloc(1, sizeof *c);
    if (!c)
        return ncclSystemError;
    c->nranks = nranks;
    c->rank = rank;
    c->fd = -1;
    const char *t = getenv("STRAGGLER_STANDIN_NCCL_TIMEOUT_S");
    c->timeout_s = t && atoi(t) > 0 ? atoi(t) : DEFAULT_TIMEOUT_S;
    pthread_mutex_init(&c->mu, NULL);
    const char *mode = getenv("STRAGGLER_STANDIN_NCCL_MODE");
    if (mode && *mode && strcmp(mode, "enqueue") != 0 && strcmp(mode, "blocking") != 0)
        fprintf(stderr, "stand-in libnccl: STRAGGLER_STANDIN_NCCL_MODE=%s is neither blocking nor enqueue: blocking\n", mode);
    if (nranks > 1) {
        const char *spec = getenv("STRAGGLER_STANDIN_NCCL_ROOT");
        char host[256], port[32];
        if (!spec || !*spec || split_addr(spec, host, sizeof host, port, sizeof port) != 0) {
            fprintf(stderr, "stand-in libnccl: ncclCommInitRank of %d ranks needs STRAGGLER_STANDIN_NCCL_ROOT=ADDR:PORT "
                            "(where rank 0 listens), got %s\n", nranks, spec && *spec ? spec : "nothing");
            comm_free(c);
            return ncclInvalidUsage;
        }
        uint64_t deadline = now_ns() + (uint64_t)c->timeout_s * 1000000000ull;
        if ((rank == 0 ? rendezvous_root(c, host, port, deadline) : rendezvous_peer(c, host, port, deadline)) != 0) {
            comm_free(c);
            return ncclSystemError;
        }
    }
    pthread_mutex_lock(&comms_mu);
    c->next = comms;
    comms = c;
    pthread_mutex_unlock(&comms_mu);
    *comm = c;
    return ncclSuccess;
}

API ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    struct standin_comm *c = comm_lookup(comm);
    if (!c)
        return ncclSuccess;
    const struct standin_device_api *dev = device();
    if (dev)
        dev->drain(); /* its enqueued collectives first */
    pthread_mutex_lock(&comms_mu);
    for (struct standin_comm **p = &comms; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            break;
        }
    pthread_mutex_unlock(&comms_mu);
    comm_free(c);
    return ncclSuccess;
}

API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    if (!asyncError)
        return ncclInvalidArgument;
    struct standin_comm *c = comm_lookup(comm);
    *asyncError = c ? __atomic_load_n(&c->async_err, __ATOMIC_ACQUIRE) : ncclSuccess;
    return ncclSuccess;
}

API ncclResult_t ncclCommCount(ncclComm_t comm, int *count)
{
    struct standin_comm *c = comm_lookup(comm);
    if (!c || !count)
        return ncclInvalidArgument;
    *count = c->nranks;
    return ncclSuccess;
}

API ncclResult_t ncclCommUserRank(ncclComm_t comm, int *rank)
{
    struct standin_comm *c = comm_lookup(comm);
    if (!c || !rank)
        return ncclInvalidArgument;
    *rank = c->rank;
    return ncclSuccess;
}

API const char *ncclGetErrorString(ncclResult_t result)
{
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error (stand-in: a socket failed or timed out)";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    default: return "unknown result code";
    }
}
#endif
