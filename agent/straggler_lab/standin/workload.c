/*
 * A tiny workload for the STAND-IN CUDA libraries (tests and benchmarks; no GPU involved).
 *
 * It dlopen()s libcuda.so.1, libcudart.so.12 and libnccl.so.2 from --lib-dir (so the
 * libraries appear in /proc/PID/maps only once it starts, like a job launched later) and
 * calls them with fixed, known arguments, so a test can check what the agent recorded:
 *
 *   --mode mix     each iteration makes one call of every traced function (see MIX below)
 *   --mode launch  cuLaunchKernel only (for rates, floods and benchmarks)
 *   --mode sync    cuCtxSynchronize only
 *   --iterations N | --seconds S    how long
 *   --rate R       at most R calls per second (paced in small batches); 0 = as fast as possible
 *   --wait-file F  after loading the libraries, wait (at most 60 s) until F exists, then start
 *   --delay-ms D   sleep D ms before loading the libraries
 *   --hold-ms H    sleep H ms after the calls, before exiting
 *   --log F        write one line per call of the first 10000: "op before_ns after_ns" (CLOCK_MONOTONIC)
 *
 * At the end it prints one JSON line: pid, tid, calls per function, total, elapsed ns, ns per call,
 * and the CPU time (user + system, so including the kernel's probe handling) per call.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef struct { unsigned int x, y, z; } dim3;
typedef int (*fn_launch)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **, void **);
typedef int (*fn_alloc)(uint64_t *, size_t);
typedef int (*fn_free)(uint64_t);
typedef int (*fn_copy3)(uint64_t, uint64_t, size_t);
typedef int (*fn_copy4)(uint64_t, uint64_t, size_t, void *);
typedef int (*fn_void)(void);
typedef int (*fn_stream)(void *);
typedef int (*fn_rt_launch)(const void *, dim3, dim3, void **, size_t, void *);
typedef int (*fn_rt_malloc)(void **, size_t);
typedef int (*fn_rt_free)(void *);
typedef int (*fn_rt_memcpy)(void *, const void *, size_t, int);
typedef int (*fn_rt_memcpy_async)(void *, const void *, size_t, int, void *);
typedef int (*fn_nccl7)(const void *, void *, size_t, int, int, void *, void *);
typedef int (*fn_nccl6)(const void *, void *, size_t, int, void *, void *);

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void *must_sym(void *lib, const char *name)
{
    void *p = dlsym(lib, name);
    if (!p) {
        fprintf(stderr, "workload: symbol %s not found: %s\n", name, dlerror());
        exit(2);
    }
    return p;
}

static void *must_open(const char *dir, const char *name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "workload: cannot load %s: %s\n", path, dlerror());
        exit(2);
    }
    return lib;
}

#define NOPS 20
static const char *op_names[NOPS] = {
    "cuMemAlloc_v2", "cuMemcpyHtoD_v2", "cuMemcpyDtoHAsync_v2_ptsz", "cuLaunchKernel", "cuLaunchKernel_ptsz",
    "cuCtxSynchronize", "cuStreamSynchronize", "cuMemFree_v2",
    "cudaMalloc", "cudaMemcpy", "cudaMemcpyAsync", "cudaLaunchKernel", "cudaStreamSynchronize",
    "cudaDeviceSynchronize", "cudaFree",
    "ncclAllReduce", "ncclBroadcast", "ncclAllGather", "ncclReduceScatter", "cuMemcpyPeer"};
static unsigned long op_calls[NOPS];

struct logrec { int op; uint64_t before, after; };
static struct logrec *logbuf;
static size_t log_n, log_cap;

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

int main(int argc, char **argv)
{
    const char *lib_dir = NULL, *mode = "mix", *wait_file = NULL, *log_path = NULL;
    long iterations = -1, delay_ms = 0, hold_ms = 0;
    double seconds = -1, rate = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) { fprintf(stderr, "workload: %s needs a value\n", a); return 2; }
        if (!strcmp(a, "--lib-dir")) lib_dir = v;
        else if (!strcmp(a, "--mode")) mode = v;
        else if (!strcmp(a, "--iterations")) iterations = atol(v);
        else if (!strcmp(a, "--seconds")) seconds = atof(v);
        else if (!strcmp(a, "--rate")) rate = atof(v);
        else if (!strcmp(a, "--wait-file")) wait_file = v;
        else if (!strcmp(a, "--delay-ms")) delay_ms = atol(v);
        else if (!strcmp(a, "--hold-ms")) hold_ms = atol(v);
        else if (!strcmp(a, "--log")) log_path = v;
        else { fprintf(stderr, "workload: unknown option %s\n", a); return 2; }
        i++;
    }
    if (!lib_dir) { fprintf(stderr, "workload: --lib-dir is required\n"); return 2; }
    if (iterations < 0 && seconds < 0) iterations = 1;
    if (delay_ms > 0) sleep_ms(delay_ms);

    void *cu = must_open(lib_dir, "libcuda.so.1");
    void *rt = must_open(lib_dir, "libcudart.so.12");
    void *nc = must_open(lib_dir, "libnccl.so.2");
    fn_alloc cuMemAlloc_v2 = (fn_alloc)must_sym(cu, "cuMemAlloc_v2");
    fn_copy3 cuMemcpyHtoD_v2 = (fn_copy3)must_sym(cu, "cuMemcpyHtoD_v2");
    fn_copy4 cuMemcpyDtoHAsync_v2_ptsz = (fn_copy4)must_sym(cu, "cuMemcpyDtoHAsync_v2_ptsz");
    fn_launch cuLaunchKernel = (fn_launch)must_sym(cu, "cuLaunchKernel");
    fn_launch cuLaunchKernel_ptsz = (fn_launch)must_sym(cu, "cuLaunchKernel_ptsz");
    fn_void cuCtxSynchronize = (fn_void)must_sym(cu, "cuCtxSynchronize");
    fn_stream cuStreamSynchronize = (fn_stream)must_sym(cu, "cuStreamSynchronize");
    fn_free cuMemFree_v2 = (fn_free)must_sym(cu, "cuMemFree_v2");
    int (*cuMemcpyPeer)(uint64_t, void *, uint64_t, void *, size_t) = must_sym(cu, "cuMemcpyPeer");
    fn_rt_malloc cudaMalloc = (fn_rt_malloc)must_sym(rt, "cudaMalloc");
    fn_rt_memcpy cudaMemcpy = (fn_rt_memcpy)must_sym(rt, "cudaMemcpy");
    fn_rt_memcpy_async cudaMemcpyAsync = (fn_rt_memcpy_async)must_sym(rt, "cudaMemcpyAsync");
    fn_rt_launch cudaLaunchKernel = (fn_rt_launch)must_sym(rt, "cudaLaunchKernel");
    fn_stream cudaStreamSynchronize = (fn_stream)must_sym(rt, "cudaStreamSynchronize");
    fn_void cudaDeviceSynchronize = (fn_void)must_sym(rt, "cudaDeviceSynchronize");
    fn_rt_free cudaFree = (fn_rt_free)must_sym(rt, "cudaFree");
    fn_nccl7 ncclAllReduce = (fn_nccl7)must_sym(nc, "ncclAllReduce");
    fn_nccl7 ncclBroadcast = (fn_nccl7)must_sym(nc, "ncclBroadcast");
    fn_nccl6 ncclAllGather = (fn_nccl6)must_sym(nc, "ncclAllGather");
    fn_nccl7 ncclReduceScatter = (fn_nccl7)must_sym(nc, "ncclReduceScatter");

    if (wait_file) {
        struct stat st;
        uint64_t give_up = now_ns() + 60ull * 1000000000ull;
        while (stat(wait_file, &st) != 0) {
            if (now_ns() > give_up) { fprintf(stderr, "workload: %s did not appear within 60 s\n", wait_file); return 3; }
            sleep_ms(10);
        }
    }
    if (log_path) { log_cap = 10000; logbuf = calloc(log_cap, sizeof *logbuf); }

    void *stream = (void *)0x5157, *fn = (void *)0xf00d, *comm = (void *)0xc033;
    void *params[1] = {0};
    char host[64];
#define CALL(idx, expr) do { op_calls[idx]++; \
        if (logbuf && log_n < log_cap) { uint64_t b_ = now_ns(); (void)(expr); uint64_t a_ = now_ns(); \
            logbuf[log_n].op = idx; logbuf[log_n].before = b_; logbuf[log_n].after = a_; log_n++; } \
        else { (void)(expr); } } while (0)

    int is_mix = !strcmp(mode, "mix"), is_launch = !strcmp(mode, "launch"), is_sync = !strcmp(mode, "sync");
    if (!is_mix && !is_launch && !is_sync) { fprintf(stderr, "workload: unknown --mode %s\n", mode); return 2; }
    int calls_per_iter = is_mix ? NOPS : 1;
    long batch = 1;
    if (rate > 0) { batch = (long)(rate / 1000.0); if (batch < 1) batch = 1; } /* pace in ~1 ms batches */
    uint64_t start = now_ns(), deadline = seconds >= 0 ? start + (uint64_t)(seconds * 1e9) : 0;
    unsigned long total = 0;
    for (long it = 0; iterations < 0 || it < iterations; it++) {
        if (deadline && now_ns() >= deadline) break;
        if (is_mix) {
            uint64_t d = 0; void *p = NULL;
            CALL(0, cuMemAlloc_v2(&d, 1048576));
            CALL(1, cuMemcpyHtoD_v2(d, (uint64_t)(uintptr_t)host, 4096));
            CALL(2, cuMemcpyDtoHAsync_v2_ptsz((uint64_t)(uintptr_t)host, d, 512, stream));
            CALL(3, cuLaunchKernel(fn, 4, 5, 6, 32, 8, 2, 1024, stream, params, NULL));
            CALL(4, cuLaunchKernel_ptsz(fn, 40000, 3, 2, 256, 1, 1, 0, stream, params, NULL));
            CALL(5, cuCtxSynchronize());
            CALL(6, cuStreamSynchronize(stream));
            CALL(7, cuMemFree_v2(d));
            CALL(8, cudaMalloc(&p, 2097152));
            CALL(9, cudaMemcpy(p, host, 8192, 1));
            CALL(10, cudaMemcpyAsync(host, p, 16384, 2, stream));
            dim3 grid = {7, 8, 9}, block = {64, 2, 3};
            CALL(11, cudaLaunchKernel(fn, grid, block, params, 0, stream));
            CALL(12, cudaStreamSynchronize(stream));
            CALL(13, cudaDeviceSynchronize());
            CALL(14, cudaFree(p));
            CALL(15, ncclAllReduce(host, host, 1000, 7 /* ncclFloat32 */, 0, comm, stream));
            CALL(16, ncclBroadcast(host, host, 100, 8 /* ncclFloat64 */, 0, comm, stream));
            CALL(17, ncclAllGather(host, host, 50, 2 /* ncclInt32 */, comm, stream));
            CALL(18, ncclReduceScatter(host, host, 10, 9 /* ncclBfloat16 */, 0, comm, stream));
            CALL(19, cuMemcpyPeer(d, NULL, d, NULL, 65536));
        } else if (is_launch) {
            CALL(3, cuLaunchKernel(fn, 4, 5, 6, 32, 8, 2, 1024, stream, params, NULL));
        } else {
            CALL(5, cuCtxSynchronize());
        }
        total += calls_per_iter;
        if (rate > 0 && (it + 1) % batch == 0) {
            uint64_t due = start + (uint64_t)((double)total / rate * 1e9), t = now_ns();
            if (due > t) { struct timespec ts = {0, (long)(due - t)}; if (due - t >= 1000000000ull) ts.tv_sec = (due - t) / 1000000000ull, ts.tv_nsec = (due - t) % 1000000000ull; nanosleep(&ts, NULL); }
        }
    }
    uint64_t elapsed = now_ns() - start;
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    double cpu_ns = (usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1e9 + (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e3;
    if (log_path) {
        FILE *f = fopen(log_path, "w");
        if (!f) { fprintf(stderr, "workload: cannot write %s\n", log_path); return 2; }
        for (size_t i = 0; i < log_n; i++)
            fprintf(f, "%s %llu %llu\n", op_names[logbuf[i].op], (unsigned long long)logbuf[i].before, (unsigned long long)logbuf[i].after);
        fclose(f);
    }
    if (hold_ms > 0) sleep_ms(hold_ms);
    printf("{\"pid\": %d, \"tid\": %ld, \"mode\": \"%s\", \"calls\": {", getpid(), (long)syscall(SYS_gettid), mode);
    int first = 1;
    for (int i = 0; i < NOPS; i++) {
        if (!op_calls[i]) continue;
        printf("%s\"%s\": %lu", first ? "" : ", ", op_names[i], op_calls[i]);
        first = 0;
    }
    printf("}, \"total_calls\": %lu, \"elapsed_ns\": %llu, \"ns_per_call\": %.1f, \"cpu_ns_per_call\": %.1f}\n", total,
           (unsigned long long)elapsed, total ? (double)elapsed / (double)total : 0.0, total ? cpu_ns / (double)total : 0.0);
    fflush(stdout);
    return 0;
}
