/*
 * Block I/O of every process in scope, attributed to the process that SUBMITTED it.
 *
 * block_bio_queue runs in the submitter's context (pid/comm from the helpers are the real
 * culprit, not the kworker or interrupt that later issues or completes the request); the
 * request is matched by its start sector at block_rq_issue (device start, bytes) and at
 * block_rq_complete, where one record is sent: submitted at ts, total latency dur, device
 * time (issue -> complete) a2, bytes a0, sector a1, dev (the disk, from the request) in
 * dims[0], rwbs in comm2. A bio split to the device's limits (block_split, also in the
 * submitter's context) hands its submitter on to the second part.
 * The key is the sector alone: a bio on a partition carries the partition's dev_t while its
 * request carries the disk's (the sector is absolute by then). Two disks writing the same
 * sector at the same moment could swap owners; rare enough for a tracer.
 * Writeback of the page cache is submitted by kernel threads and is attributed to them.
 */
#include "common.h"

struct bio_info {
    u64 ts;
    u64 issue_ts;
    u32 tgid;
    u32 tid;
    u32 bytes;
    u32 cpu;
    char comm[COMM_LEN];
};
BPF_TABLE("lru_hash", u64, struct bio_info, bio_submit, 65536);  /* start sector -> submitter */

TRACEPOINT_PROBE(block, block_bio_queue)
{
    count_hit(HIT_BLOCK);
    struct config *c = get_config();
    if (!c)
        return 0;
    u64 pid_tgid = bpf_get_current_pid_tgid();
    u32 tgid = pid_tgid >> 32;
    if (tgid == c->self_tgid || !tgid_in_scope(c, tgid))
        return 0;
    u64 key = args->sector;
    struct bio_info info = {};
    info.ts = bpf_ktime_get_ns();
    info.tgid = tgid;
    info.tid = (u32)pid_tgid;
    info.bytes = args->nr_sector * 512;
    info.cpu = bpf_get_smp_processor_id();
    bpf_get_current_comm(&info.comm, sizeof(info.comm));
    bio_submit.update(&key, &info);
    return 0;
}

TRACEPOINT_PROBE(block, block_split)
{
    count_hit(HIT_BLOCK);
    u64 key = args->sector, second = args->new_sector;
    struct bio_info *info = bio_submit.lookup(&key);
    if (!info || second <= key)
        return 0;
    struct bio_info copy = *info;
    u64 end = key + info->bytes / 512;
    copy.bytes = end > second ? (end - second) * 512 : 0;
    info->bytes = (second - key) * 512;
    bio_submit.update(&second, &copy);
    return 0;
}

/* A bio merged into a request that another bio starts: its entry would never be matched (and
 * would crowd the LRU map until live entries get evicted). The request keeps its first
 * submitter; its bytes (at issue) include the merged bio. */
TRACEPOINT_PROBE(block, block_bio_backmerge)
{
    count_hit(HIT_BLOCK);
    u64 key = args->sector;
    bio_submit.delete(&key);
    return 0;
}

/* A bio merged in front of a request: it is the request's start now; the old start is not. */
TRACEPOINT_PROBE(block, block_bio_frontmerge)
{
    count_hit(HIT_BLOCK);
    u64 old_start = args->sector + args->nr_sector;
    bio_submit.delete(&old_start);
    return 0;
}

TRACEPOINT_PROBE(block, block_rq_issue)
{
    count_hit(HIT_BLOCK);
    u64 key = args->sector;
    struct bio_info *info = bio_submit.lookup(&key);
    if (info) {
        info->issue_ts = bpf_ktime_get_ns();
        if (args->bytes)
            info->bytes = args->bytes;  /* the request, after merges */
    }
    return 0;
}

TRACEPOINT_PROBE(block, block_rq_complete)
{
    u64 now = bpf_ktime_get_ns();
    count_hit(HIT_BLOCK);
    u64 key = args->sector;
    struct bio_info *info = bio_submit.lookup(&key);
    if (!info)
        return 0;
    struct event *e = sys_events.ringbuf_reserve(sizeof(struct event));
    if (!e) {
        count_lost(LOST_BLOCK);
    } else {
        __builtin_memset(e, 0, sizeof(*e));
        e->kind = EV_BLOCK;
        e->ts = info->ts;
        e->dur = now - info->ts;
        e->a0 = info->bytes;
        e->a1 = args->sector;
        e->a2 = info->issue_ts ? now - info->issue_ts : 0;
        e->tgid = info->tgid;
        e->tid = info->tid;
        e->cpu = info->cpu;
        e->dims[0] = args->dev;
        __builtin_memcpy(e->comm, info->comm, sizeof(e->comm));
        bpf_probe_read_kernel(&e->comm2, 10, args->rwbs);
        sys_events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
    }
    bio_submit.delete(&key);
    return 0;
}
