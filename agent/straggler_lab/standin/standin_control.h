/*
 * STAND-IN -- NOT NVIDIA CODE, NO GPU INVOLVED.
 *
 * What the stand-in libcuda (standin.c) and the stand-in NVML (nvml.c) read the same way:
 *
 * 1. The run-time CONTROL FILE of a rank (STRAGGLER_STANDIN_CONTROL), `key=value` lines, other keys
 *    ignored (the job's own program reads the same file):
 *      gpu_factor=F        kernels take F x their device time (libcuda); with throttle=, the stand-in
 *                          NVML reports the SM clock lowered by F (max / F)
 *      throttle=R[,R...]   the clock-event reasons NVML reports: thermal (hw_thermal_slowdown),
 *                          sw_thermal, hw_slowdown, power (sw_power_cap), power_brake, none
 *      pcie_gen=G pcie_width=W          the PCIe link now (a degraded link: below the maximum)
 *      ecc_corrected=N ecc_uncorrected=N                 volatile ECC error counts
 *      remapped_corrected=N remapped_uncorrected=N remap_pending=0|1 remap_failure=0|1
 *      nvlink_replay=N nvlink_recovery=N nvlink_crc=N    NVLink error counters (on link 0)
 *      temperature=C power_w=W          override the reported temperature / power draw
 *      gpu_lost=1                       every NVML call on the GPU fails with NVML_ERROR_GPU_IS_LOST
 *    No file = the defaults (no fault).
 *
 * 2. The stand-in NVML's GPUS FILE (STRAGGLER_STANDIN_NVML_CONFIG), one GPU a line, `key=value` words:
 *      index=0 uuid=GPU-... pci=0000:c1:00.0 control=/path/rank0.ctl [minor=N] [name=...]
 *      [sm_max_mhz=1980] [mem_max_mhz=2619] [memory_gib=80] [pcie_gen_max=5] [pcie_width_max=16]
 *      [power_limit_w=700] [nvlinks=0] [unsupported=power,ecc,...]
 *    and optionally `registry=PATH` on a line of its own (default: the file's path + ".procs"): the
 *    stand-in libcuda appends `PID INDEX BYTES` there when a process loads it whose
 *    STRAGGLER_STANDIN_CONTROL is a GPU's control= (or STRAGGLER_STANDIN_GPU=INDEX), and the stand-in
 *    NVML lists the live ones as the GPU's running compute processes.
 */
#ifndef STANDIN_CONTROL_H
#define STANDIN_CONTROL_H

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* NVML's clock-event bits (nvmlClocksEventReason*) */
#define STANDIN_EVENT_SW_POWER_CAP 0x4ull
#define STANDIN_EVENT_HW_SLOWDOWN 0x8ull
#define STANDIN_EVENT_SW_THERMAL 0x20ull
#define STANDIN_EVENT_HW_THERMAL 0x40ull
#define STANDIN_EVENT_HW_POWER_BRAKE 0x80ull

struct standin_control {
    double gpu_factor;
    unsigned long long throttle;
    int pcie_gen, pcie_width;        /* 0: at the maximum */
    int temperature_c, power_w;      /* -1: the stand-in's own */
    unsigned long long ecc_corrected, ecc_uncorrected;
    unsigned int remapped_corrected, remapped_uncorrected, remap_pending, remap_failure;
    unsigned long long nvlink_replay, nvlink_recovery, nvlink_crc;
    int gpu_lost;
};

static __attribute__((unused)) void standin_control_defaults(struct standin_control *c)
{
    memset(c, 0, sizeof *c);
    c->gpu_factor = 1.0;
    c->temperature_c = -1;
    c->power_w = -1;
}

/* "key = value" -> key and value (trimmed, in place); 0 when the line is not one. */
static __attribute__((unused)) int standin_key_value(char *line, char **key, char **value)
{
    char *p = line;
    while (*p == ' ' || *p == '\t')
        p++;
    char *k = p;
    while (*p && (isalnum((unsigned char)*p) || *p == '_'))
        p++;
    if (p == k)
        return 0;
    char *k_end = p;
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p != '=')
        return 0;
    *k_end = '\0';
    p++;
    while (*p == ' ' || *p == '\t')
        p++;
    char *end = p + strlen(p);
    while (end > p && isspace((unsigned char)end[-1]))
        *--end = '\0';
    *key = k;
    *value = p;
    return 1;
}

/* A whole non-negative number, or -1. */
static __attribute__((unused)) long long standin_count(const char *v)
{
    char *end;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    if (end == v || *end || errno || n < 0)
        return -1;
    return n;
}

static __attribute__((unused)) unsigned long long standin_throttle_bits(const char *v)
{
    unsigned long long bits = 0;
    char buf[128];
    snprintf(buf, sizeof buf, "%s", v);
    for (char *save = NULL, *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
        if (!strcmp(tok, "thermal") || !strcmp(tok, "hw_thermal") || !strcmp(tok, "hw_thermal_slowdown"))
            bits |= STANDIN_EVENT_HW_THERMAL;
        else if (!strcmp(tok, "sw_thermal") || !strcmp(tok, "sw_thermal_slowdown"))
            bits |= STANDIN_EVENT_SW_THERMAL;
        else if (!strcmp(tok, "hw_slowdown"))
            bits |= STANDIN_EVENT_HW_SLOWDOWN;
        else if (!strcmp(tok, "power") || !strcmp(tok, "sw_power_cap"))
            bits |= STANDIN_EVENT_SW_POWER_CAP;
        else if (!strcmp(tok, "power_brake") || !strcmp(tok, "hw_power_brake_slowdown"))
            bits |= STANDIN_EVENT_HW_POWER_BRAKE;
    }
    return bits;
}

/* Read a control file's keys over the defaults; a value that is not valid leaves its default. */
static __attribute__((unused)) void standin_control_parse(FILE *f, struct standin_control *c)
{
    char line[256];
    while (fgets(line, sizeof line, f)) {
        char *key, *v;
        if (!standin_key_value(line, &key, &v))
            continue;
        long long n = standin_count(v);
        if (!strcmp(key, "gpu_factor")) {
            char *end;
            double x = strtod(v, &end);
            if (end != v && isfinite(x) && x >= 0.0 && x <= 1000.0)
                c->gpu_factor = x;
        } else if (!strcmp(key, "throttle")) {
            c->throttle = standin_throttle_bits(v);
        } else if (n < 0) {
            continue;
        } else if (!strcmp(key, "pcie_gen")) {
            c->pcie_gen = (int)(n > 64 ? 64 : n);
        } else if (!strcmp(key, "pcie_width")) {
            c->pcie_width = (int)(n > 64 ? 64 : n);
        } else if (!strcmp(key, "temperature")) {
            c->temperature_c = (int)(n > 200 ? 200 : n);
        } else if (!strcmp(key, "power_w")) {
            c->power_w = (int)(n > 100000 ? 100000 : n);
        } else if (!strcmp(key, "ecc_corrected")) {
            c->ecc_corrected = (unsigned long long)n;
        } else if (!strcmp(key, "ecc_uncorrected")) {
            c->ecc_uncorrected = (unsigned long long)n;
        } else if (!strcmp(key, "remapped_corrected")) {
            c->remapped_corrected = (unsigned int)n;
        } else if (!strcmp(key, "remapped_uncorrected")) {
            c->remapped_uncorrected = (unsigned int)n;
        } else if (!strcmp(key, "remap_pending")) {
            c->remap_pending = n != 0;
        } else if (!strcmp(key, "remap_failure")) {
            c->remap_failure = n != 0;
        } else if (!strcmp(key, "nvlink_replay")) {
            c->nvlink_replay = (unsigned long long)n;
        } else if (!strcmp(key, "nvlink_recovery")) {
            c->nvlink_recovery = (unsigned long long)n;
        } else if (!strcmp(key, "nvlink_crc")) {
            c->nvlink_crc = (unsigned long long)n;
        } else if (!strcmp(key, "gpu_lost")) {
            c->gpu_lost = n != 0;
        }
    }
}

/* ---- the GPUs file ---- */
#define STANDIN_MAX_GPUS 64
#define STANDIN_PATH_MAX 4096

struct standin_gpu_config {
    unsigned int index, minor;
    char uuid[96], name[96], control[STANDIN_PATH_MAX];
    unsigned int domain, bus, device, function;
    unsigned int sm_max_mhz, mem_max_mhz, memory_gib, pcie_gen_max, pcie_width_max, power_limit_w, nvlinks;
    char unsupported[256];           /* ",power,ecc," */
};

struct standin_gpus_file {
    int count;
    struct standin_gpu_config gpus[STANDIN_MAX_GPUS];
    char registry[STANDIN_PATH_MAX];
};

/* Read the GPUs file; 0 on success, -1 when it cannot be read (no GPU then). Lines without index= and
 * uuid= are skipped. */
static __attribute__((unused)) int standin_gpus_read(const char *path, struct standin_gpus_file *out)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    snprintf(out->registry, sizeof out->registry, "%s.procs", path);
    char line[8192];
    while (fgets(line, sizeof line, f) && out->count < STANDIN_MAX_GPUS) {
        if (line[0] == '#')
            continue;
        struct standin_gpu_config g;
        memset(&g, 0, sizeof g);
        int has_index = 0, has_uuid = 0, has_minor = 0;
        snprintf(g.name, sizeof g.name, "Stand-in GPU (not NVIDIA)");
        g.sm_max_mhz = 1980; g.mem_max_mhz = 2619; g.memory_gib = 80; g.pcie_gen_max = 5; g.pcie_width_max = 16;
        g.power_limit_w = 700;
        snprintf(g.unsupported, sizeof g.unsupported, ",");
        for (char *save = NULL, *word = strtok_r(line, " \t\r\n", &save); word; word = strtok_r(NULL, " \t\r\n", &save)) {
            char *key, *v;
            if (!standin_key_value(word, &key, &v))
                continue;
            long long n = standin_count(v);
            if (!strcmp(key, "registry")) {
                snprintf(out->registry, sizeof out->registry, "%s", v);
            } else if (!strcmp(key, "index") && n >= 0 && n < 1024) {
                g.index = (unsigned int)n; has_index = 1;
            } else if (!strcmp(key, "minor") && n >= 0 && n < 1024) {
                g.minor = (unsigned int)n; has_minor = 1;
            } else if (!strcmp(key, "uuid")) {
                snprintf(g.uuid, sizeof g.uuid, "%s", v); has_uuid = 1;
            } else if (!strcmp(key, "name")) {
                snprintf(g.name, sizeof g.name, "%s", v);
                for (char *c = g.name; *c; c++)
                    if (*c == '_')
                        *c = ' ';
            } else if (!strcmp(key, "control")) {
                snprintf(g.control, sizeof g.control, "%s", v);
            } else if (!strcmp(key, "pci")) {
                if (sscanf(v, "%x:%x:%x.%x", &g.domain, &g.bus, &g.device, &g.function) < 3)
                    g.domain = g.bus = g.device = g.function = 0;
            } else if (!strcmp(key, "unsupported")) {
                snprintf(g.unsupported, sizeof g.unsupported, ",%s,", v);
            } else if (n >= 0 && n < 1000000) {
                if (!strcmp(key, "sm_max_mhz")) g.sm_max_mhz = (unsigned int)n;
                else if (!strcmp(key, "mem_max_mhz")) g.mem_max_mhz = (unsigned int)n;
                else if (!strcmp(key, "memory_gib")) g.memory_gib = (unsigned int)n;
                else if (!strcmp(key, "pcie_gen_max")) g.pcie_gen_max = (unsigned int)n;
                else if (!strcmp(key, "pcie_width_max")) g.pcie_width_max = (unsigned int)n;
                else if (!strcmp(key, "power_limit_w")) g.power_limit_w = (unsigned int)n;
                else if (!strcmp(key, "nvlinks")) g.nvlinks = (unsigned int)(n > 18 ? 18 : n);
            }
        }
        if (!has_index || !has_uuid)
            continue;
        if (!has_minor)
            g.minor = g.index;
        out->gpus[out->count++] = g;
    }
    fclose(f);
    return 0;
}

#endif
