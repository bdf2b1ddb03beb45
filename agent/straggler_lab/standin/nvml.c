/*
 * STAND-IN NVML LIBRARY -- NOT NVIDIA CODE, NO GPU INVOLVED.
 *
 * Builds libnvidia-ml.so.1 for machines without a GPU (this project's tests and benchmarks): the NVML
 * calls the straggler agent makes (through nvidia-ml-py), with NVML's symbol names, C signatures,
 * struct layouts and return codes, answering for the stand-in GPUs listed in the file named by
 * STRAGGLER_STANDIN_NVML_CONFIG (format: standin_control.h). Each GPU's values follow its rank's
 * control file (the same STRAGGLER_STANDIN_CONTROL file whose gpu_factor slows the stand-in libcuda's
 * kernels), re-read when it changes:
 *   SM clock         sm_max_mhz, or sm_max_mhz / gpu_factor while throttle= names a reason; an idle GPU
 *                    (no process uses it) idles at SM_IDLE_MHZ, as a real one drops to its idle clock
 *   clock events     the bits of throttle= (0 without); an idle GPU also sets gpu_idle (0x1), and no
 *                    slowdown reason is needed for its low clock
 *   temperature      45 C, 90 C while throttled for a thermal reason, or temperature=
 *   power            300 W, the limit while throttled for power, or power_w=; limit power_limit_w
 *   utilization      95 % GPU / 40 % memory while a process uses the GPU, else 0
 *   memory           memory_gib total; 512 MiB + 1 GiB per process in use
 *   PCIe             pcie_gen_max/pcie_width_max, or pcie_gen=/pcie_width= below them; 1000/2000 KB/s
 *   NVLink           nvlinks= links up (0: NVML_ERROR_NOT_SUPPORTED), nvlink_*= counters on link 0
 *   ECC, remapping   ecc_*=, remapped_*=, remap_pending=, remap_failure= (0 without)
 *   processes        the registry's live processes of this GPU (the stand-in libcuda writes it)
 * A GPU's unsupported= features (clocks, clock_events, temperature, power, utilization, memory, pcie,
 * pcie_throughput, nvlink, ecc, remapped_rows, processes, minor) answer NVML_ERROR_NOT_SUPPORTED; with
 * gpu_lost=1 in its control file every call on it answers NVML_ERROR_GPU_IS_LOST.
 * Without STRAGGLER_STANDIN_NVML_CONFIG (or an unreadable file) nvmlInit fails with
 * NVML_ERROR_DRIVER_NOT_LOADED, as on a node without the driver.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "standin_control.h"

#define API __attribute__((visibility("default"), noinline))

/* ---- NVML's types, as its header declares them (same sizes, same order) ---- */
typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2, NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6, NVML_ERROR_INSUFFICIENT_SIZE = 7, NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13, NVML_ERROR_GPU_IS_LOST = 15, NVML_ERROR_UNKNOWN = 999
};
typedef struct standin_nvml_gpu *nvmlDevice_t;
typedef int nvmlClockType_t;            /* NVML_CLOCK_GRAPHICS 0, _SM 1, _MEM 2, _VIDEO 3 */
typedef int nvmlTemperatureSensors_t;   /* NVML_TEMPERATURE_GPU 0 */
typedef int nvmlPcieUtilCounter_t;      /* TX 0, RX 1 */
typedef int nvmlEnableState_t;          /* DISABLED 0, ENABLED 1 */
typedef int nvmlNvLinkErrorCounter_t;   /* DL_REPLAY 0, DL_RECOVERY 1, DL_CRC_FLIT 2, DL_CRC_DATA 3, DL_ECC_DATA 4 */
typedef int nvmlMemoryErrorType_t;      /* CORRECTED 0, UNCORRECTED 1 */
typedef int nvmlEccCounterType_t;       /* VOLATILE 0, AGGREGATE 1 */

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; } nvmlProcessInfo_v1_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_v2_t;

/* ---- the stand-in GPUs ---- */
struct standin_nvml_gpu {
    struct standin_gpu_config cfg;
    struct standin_control ctl;
    int ctl_seen;
    struct stat ctl_stat;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct standin_gpus_file config;
static struct standin_nvml_gpu gpus[STANDIN_MAX_GPUS];
static int gpu_count;
static int init_count;

static int unsupported(const struct standin_nvml_gpu *g, const char *feature)
{
    char needle[64];
    snprintf(needle, sizeof needle, ",%s,", feature);
    return strstr(g->cfg.unsupported, needle) != NULL;
}

/* Re-read the GPU's control file when it changed (called with mu held). */
static void control_refresh(struct standin_nvml_gpu *g)
{
    struct stat st;
    if (!g->cfg.control[0] || stat(g->cfg.control, &st) != 0) {   /* no file: no fault */
        standin_control_defaults(&g->ctl);
        g->ctl_seen = 0;
        return;
    }
    if (g->ctl_seen && st.st_ino == g->ctl_stat.st_ino && st.st_size == g->ctl_stat.st_size &&
        st.st_mtim.tv_sec == g->ctl_stat.st_mtim.tv_sec && st.st_mtim.tv_nsec == g->ctl_stat.st_mtim.tv_nsec)
        return;
    FILE *f = fopen(g->cfg.control, "r");
    if (!f)
        return;
    standin_control_defaults(&g->ctl);
    standin_control_parse(f, &g->ctl);
    fclose(f);
    g->ctl_seen = 1;
    g->ctl_stat = st;
}

/* Validate and lock: every device call starts here. On NVML_SUCCESS mu is held (unlock with done()). */
static nvmlReturn_t begin(nvmlDevice_t device, const char *feature)
{
    pthread_mutex_lock(&mu);
    if (!init_count) {
        pthread_mutex_unlock(&mu);
        return NVML_ERROR_UNINITIALIZED;
    }
    if (device < gpus || device >= gpus + gpu_count) {
        pthread_mutex_unlock(&mu);
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    control_refresh(device);
    if (device->ctl.gpu_lost) {
        pthread_mutex_unlock(&mu);
        return NVML_ERROR_GPU_IS_LOST;
    }
    if (feature && unsupported(device, feature)) {
        pthread_mutex_unlock(&mu);
        return NVML_ERROR_NOT_SUPPORTED;
    }
    return NVML_SUCCESS;
}

static nvmlReturn_t done(nvmlReturn_t ret)
{
    pthread_mutex_unlock(&mu);
    return ret;
}

static int process_alive(int pid)
{
    return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM);
}

/* The live processes of the registry on this GPU (called with mu held): at most max, pids into out. */
static unsigned int gpu_processes(const struct standin_nvml_gpu *g, unsigned int *out, unsigned int max)
{
    FILE *f = fopen(config.registry, "r");
    if (!f)
        return 0;
    unsigned int n = 0;
    int pid;
    unsigned int index;
    unsigned long long bytes;
    while (fscanf(f, "%d %u %llu", &pid, &index, &bytes) == 3) {
        if (index != g->cfg.index || !process_alive(pid))
            continue;
        int dup = 0;
        for (unsigned int i = 0; i < n && i < max; i++)
            dup |= out[i] == (unsigned int)pid;
        if (dup)
            continue;
        if (n < max)
            out[n] = (unsigned int)pid;
        n++;
    }
    fclose(f);
    return n;
}

#define STANDIN_MAX_PROCS 256
#define PROCESS_BYTES (1ull << 30)
#define BASE_USED_BYTES (512ull << 20)

#define SM_IDLE_MHZ 210
#define EVENT_GPU_IDLE 0x1ull

static int gpu_idle(const struct standin_nvml_gpu *g)
{
    unsigned int pids[1];
    return gpu_processes(g, pids, 1) == 0;
}

static unsigned int sm_clock_now(const struct standin_nvml_gpu *g)
{
    if (gpu_idle(g))
        return SM_IDLE_MHZ < g->cfg.sm_max_mhz ? SM_IDLE_MHZ : g->cfg.sm_max_mhz;
    if (g->ctl.throttle && g->ctl.gpu_factor > 1.0)
        return (unsigned int)(g->cfg.sm_max_mhz / g->ctl.gpu_factor + 0.5);
    return g->cfg.sm_max_mhz;
}

/* ---- library ---- */
static nvmlReturn_t init(void)
{
    pthread_mutex_lock(&mu);
    if (init_count) {
        init_count++;
        pthread_mutex_unlock(&mu);
        return NVML_SUCCESS;
    }
    const char *path = getenv("STRAGGLER_STANDIN_NVML_CONFIG");
    if (!path || !*path || standin_gpus_read(path, &config) != 0) {
        pthread_mutex_unlock(&mu);
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    gpu_count = 0;
    /* NVML orders GPUs by index; the file may list them in any order */
    for (unsigned int want = 0; want < 1024 && gpu_count < config.count; want++)
        for (int i = 0; i < config.count; i++)
            if (config.gpus[i].index == want) {
                memset(&gpus[gpu_count], 0, sizeof gpus[gpu_count]);
                gpus[gpu_count].cfg = config.gpus[i];
                standin_control_defaults(&gpus[gpu_count].ctl);
                gpu_count++;
            }
    init_count = 1;
    pthread_mutex_unlock(&mu);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlInit_v2(void) { return init(); }
API nvmlReturn_t nvmlInit(void) { return init(); }
API nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return init(); }

API nvmlReturn_t nvmlShutdown(void)
{
    pthread_mutex_lock(&mu);
    nvmlReturn_t ret = init_count ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (init_count)
        init_count--;
    pthread_mutex_unlock(&mu);
    return ret;
}

API const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t copy_text(const char *text, char *out, unsigned int length)
{
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    return copy_text("stand-in", version, length);
}

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&mu);
    nvmlReturn_t ret = init_count ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (init_count)
        *count = (unsigned int)gpu_count;
    pthread_mutex_unlock(&mu);
    return ret;
}
API nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (!device)
        return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&mu);
    nvmlReturn_t ret = !init_count ? NVML_ERROR_UNINITIALIZED
                     : index >= (unsigned int)gpu_count ? NVML_ERROR_INVALID_ARGUMENT : NVML_SUCCESS;
    if (ret == NVML_SUCCESS)
        *device = &gpus[index];
    pthread_mutex_unlock(&mu);
    return ret;
}
API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    nvmlReturn_t ret = begin(device, NULL);
    if (ret)
        return ret;
    if (!index)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    *index = device->cfg.index;
    return done(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor)
{
    nvmlReturn_t ret = begin(device, "minor");
    if (ret)
        return ret;
    if (!minor)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    *minor = device->cfg.minor;
    return done(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    nvmlReturn_t ret = begin(device, NULL);
    return ret ? ret : done(copy_text(device->cfg.uuid, uuid, length));
}

API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    nvmlReturn_t ret = begin(device, NULL);
    return ret ? ret : done(copy_text(device->cfg.name, name, length));
}

API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    nvmlReturn_t ret = begin(device, NULL);
    if (ret)
        return ret;
    if (!pci)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    memset(pci, 0, sizeof *pci);
    const struct standin_gpu_config *c = &device->cfg;
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", c->domain & 0xffff, c->bus & 0xff,
             c->device & 0x1f, c->function & 7);
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.%X", c->domain, c->bus & 0xff, c->device & 0x1f,
             c->function & 7);
    pci->domain = c->domain;
    pci->bus = c->bus;
    pci->device = c->device;
    pci->pciDeviceId = 0x0000ffffu;     /* no real vendor/device: the stand-in claims none */
    return done(NVML_SUCCESS);
}
API nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci) { return nvmlDeviceGetPciInfo_v3(device, pci); }
API nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci) { return nvmlDeviceGetPciInfo_v3(device, pci); }

API nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock)
{
    nvmlReturn_t ret = begin(device, "clocks");
    if (ret)
        return ret;
    if (!clock || type < 0 || type > 3)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    *clock = type == 2 ? device->cfg.mem_max_mhz : sm_clock_now(device);
    return done(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock)
{
    nvmlReturn_t ret = begin(device, "clocks");
    if (ret)
        return ret;
    if (!clock || type < 0 || type > 3)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    *clock = type == 2 ? device->cfg.mem_max_mhz : device->cfg.sm_max_mhz;
    return done(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons)
{
    nvmlReturn_t ret = begin(device, "clock_events");
    if (ret)
        return ret;
    if (!reasons)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    *reasons = device->ctl.throttle | (gpu_idle(device) ? EVENT_GPU_IDLE : 0);
    return done(NVML_SUCCESS);
}
API nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons)
{
    return nvmlDeviceGetCurrentClocksEventReasons(device, reasons);
}

API nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensor, unsigned int *temp)
{
    nvmlReturn_t ret = begin(device, "temperature");
    if (ret)
        return ret;
    if (!temp || sensor != 0)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    const struct standin_control *c = &device->ctl;
    *temp = c->temperature_c >= 0 ? (unsigned int)c->temperature_c
          : (c->throttle & (STANDIN_EVENT_HW_THERMAL | STANDIN_EVENT_SW_THERMAL)) ? 90 : 45;
    return done(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    nvmlReturn_t ret = begin(device, "power");
    if (ret)
        return ret;
    if (!power)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    const struct standin_control *c = &device->ctl;
    unsigned int watts = c->power_w >= 0 ? (unsigned int)c->power_w
                       : (c->throttle & (STANDIN_EVENT_SW_POWER_CAP | STANDIN_EVENT_HW_POWER_BRAKE))
                         ? device->cfg.power_limit_w : 300;
    *power = watts * 1000u;
    return done(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit)
{
    nvmlReturn_t ret = begin(device, "power");
    if (ret)
        return ret;
    if (!limit)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    *limit = device->cfg.power_limit_w * 1000u;
    return done(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *util)
{
    nvmlReturn_t ret = begin(device, "utilization");
    if (ret)
        return ret;
    if (!util)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    int busy = !gpu_idle(device);
    util->gpu = busy ? 95 : 0;
    util->memory = busy ? 40 : 0;
    return done(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    nvmlReturn_t ret = begin(device, "memory");
    if (ret)
        return ret;
    if (!memory)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int pids[STANDIN_MAX_PROCS];
    unsigned int n = gpu_processes(device, pids, STANDIN_MAX_PROCS);
    memory->total = (unsigned long long)device->cfg.memory_gib << 30;
    memory->used = BASE_USED_BYTES + (unsigned long long)n * PROCESS_BYTES;
    if (memory->used > memory->total)
        memory->used = memory->total;
    memory->free = memory->total - memory->used;
    return done(NVML_SUCCESS);
}

static nvmlReturn_t pcie_value(nvmlDevice_t device, unsigned int *value, int what)
{
    nvmlReturn_t ret = begin(device, "pcie");
    if (ret)
        return ret;
    if (!value)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    const struct standin_gpu_config *g = &device->cfg;
    const struct standin_control *c = &device->ctl;
    switch (what) {
    case 0: *value = c->pcie_gen > 0 && (unsigned int)c->pcie_gen < g->pcie_gen_max ? (unsigned int)c->pcie_gen : g->pcie_gen_max; break;
    case 1: *value = g->pcie_gen_max; break;
    case 2: *value = c->pcie_width > 0 && (unsigned int)c->pcie_width < g->pcie_width_max ? (unsigned int)c->pcie_width : g->pcie_width_max; break;
    default: *value = g->pcie_width_max; break;
    }
    return done(NVML_SUCCESS);
}
API nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t d, unsigned int *v) { return pcie_value(d, v, 0); }
API nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t d, unsigned int *v) { return pcie_value(d, v, 1); }
API nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t d, unsigned int *v) { return pcie_value(d, v, 2); }
API nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t d, unsigned int *v) { return pcie_value(d, v, 3); }

API nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, nvmlPcieUtilCounter_t counter, unsigned int *value)
{
    nvmlReturn_t ret = begin(device, "pcie_throughput");
    if (ret)
        return ret;
    if (!value || counter < 0 || counter > 1)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    *value = counter == 0 ? 1000 : 2000;
    return done(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *active)
{
    nvmlReturn_t ret = begin(device, "nvlink");
    if (ret)
        return ret;
    if (!device->cfg.nvlinks)
        return done(NVML_ERROR_NOT_SUPPORTED);
    if (!active || link >= device->cfg.nvlinks)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    *active = 1;
    return done(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link,
                                                 nvmlNvLinkErrorCounter_t counter, unsigned long long *value)
{
    nvmlReturn_t ret = begin(device, "nvlink");
    if (ret)
        return ret;
    if (!device->cfg.nvlinks)
        return done(NVML_ERROR_NOT_SUPPORTED);
    if (!value || link >= device->cfg.nvlinks || counter < 0 || counter > 4)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    const struct standin_control *c = &device->ctl;
    *value = 0;
    if (link == 0)
        *value = counter == 0 ? c->nvlink_replay : counter == 1 ? c->nvlink_recovery : counter == 2 ? c->nvlink_crc : 0;
    return done(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t type,
                                             nvmlEccCounterType_t counter, unsigned long long *count)
{
    nvmlReturn_t ret = begin(device, "ecc");
    if (ret)
        return ret;
    if (!count || type < 0 || type > 1 || counter < 0 || counter > 1)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    *count = type == 0 ? device->ctl.ecc_corrected : device->ctl.ecc_uncorrected;
    return done(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrected, unsigned int *uncorrected,
                                           unsigned int *pending, unsigned int *failure)
{
    nvmlReturn_t ret = begin(device, "remapped_rows");
    if (ret)
        return ret;
    if (!corrected || !uncorrected || !pending || !failure)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    const struct standin_control *c = &device->ctl;
    *corrected = c->remapped_corrected;
    *uncorrected = c->remapped_uncorrected;
    *pending = c->remap_pending;
    *failure = c->remap_failure;
    return done(NVML_SUCCESS);
}

/* NVML's contract: infos NULL or *count too small -> *count = how many, NVML_ERROR_INSUFFICIENT_SIZE
 * (NVML_SUCCESS when there are none); else the first *count filled. v1 and v2/v3 differ in the struct. */
static nvmlReturn_t running_processes(nvmlDevice_t device, unsigned int *count, void *infos, int v2)
{
    nvmlReturn_t ret = begin(device, "processes");
    if (ret)
        return ret;
    if (!count)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int pids[STANDIN_MAX_PROCS];
    unsigned int n = gpu_processes(device, pids, STANDIN_MAX_PROCS);
    if (n > STANDIN_MAX_PROCS)
        n = STANDIN_MAX_PROCS;
    if (!infos || *count < n) {
        *count = n;
        return done(n ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS);
    }
    for (unsigned int i = 0; i < n; i++) {
        if (v2) {
            nvmlProcessInfo_v2_t *p = (nvmlProcessInfo_v2_t *)infos + i;
            p->pid = pids[i];
            p->usedGpuMemory = PROCESS_BYTES;
            p->gpuInstanceId = p->computeInstanceId = 0xFFFFFFFFu;
        } else {
            nvmlProcessInfo_v1_t *p = (nvmlProcessInfo_v1_t *)infos + i;
            p->pid = pids[i];
            p->usedGpuMemory = PROCESS_BYTES;
        }
    }
    *count = n;
    return done(NVML_SUCCESS);
}
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_v2_t *infos)
{ return running_processes(d, count, infos, 1); }
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_v2_t *infos)
{ return running_processes(d, count, infos, 1); }
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_v1_t *infos)
{ return running_processes(d, count, infos, 0); }
