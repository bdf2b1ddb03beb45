/*
 * Shared by cuda.c, sched.c, block.c and net.c, which the agent compiles together as ONE BCC
 * program (so the maps below are shared; net.c only where the kernel has its tracepoints). Reads
 * only tracepoint fields, uprobe registers/user stack and BPF helpers: never kernel structs (the
 * headers on the test machines do not match the kernel).
 *
 * The Python side (agent/straggler/probes/) mirrors every constant and struct here; change
 * both together.
 */
#ifndef STRAGGLER_COMMON_H
#define STRAGGLER_COMMON_H
#include <uapi/linux/ptrace.h>

#define COMM_LEN 16

/* struct event.kind */
#define EV_CALL  1
#define EV_SCHED 2
#define EV_BLOCK 3
#define EV_PROC  4

/* struct event.op for EV_PROC */
#define PROC_NEW  1   /* a process became a target (it called a traced function) */
#define PROC_FORK 2   /* a target forked a child process (now a target too) */
#define PROC_EXEC 3   /* a process exec'd (targets, and every in-scope process in --comm mode) */
#define PROC_EXIT 4   /* the last thread of a target exited */
#define PROC_SETNS 5  /* a process joined a namespace (setns): user space re-checks its scope */

/* call classes (probes/symbols.py CALL_CLASSES): 0 = not in a traced call */
#define NCLASSES 4

/* indexes into hits[] (probe hits, for agent_cost) */
#define HIT_UPROBE 0
#define HIT_URETPROBE 1
#define HIT_SCHED 2
#define HIT_BLOCK 3
#define HIT_PROC 4
#define HIT_NET 5
#define NHITS 6

/* indexes into lost[] (ring buffer full, or a map full): one per ring-buffer writer, and net.c's
 * connection table */
#define LOST_CALLS 0
#define LOST_SCHED 1
#define LOST_BLOCK 2
#define LOST_PROC 3
#define LOST_NET 4
#define NLOST 5

/* One fixed-size record for every kind, so user space parses a batch with one struct format.
 * Field meaning per kind:
 *              ts          dur            a0            a1            a2            dims[6]             op        flags        comm           comm2
 *   EV_CALL    call start  call duration  bytes         return value  -             grid xyz, block xyz symbol id why-recorded thread comm    -
 *   EV_SCHED   off-CPU at  off-CPU time   runq wait ns  runq start    prev tgid|fl  see sched.c         state     cpu in       thread comm    task that ran instead
 *   EV_BLOCK   submitted   until complete bytes         sector        device time   [0] = dev           -         -            submitter comm rwbs
 *   EV_PROC    now         -              parent tgid   -             -             -                   PROC_*    -            comm           -
 */
struct event {
    u64 ts;
    u64 dur;
    u64 a0;
    u64 a1;
    u64 a2;
    u32 tgid;
    u32 tid;
    u32 other_pid;
    u32 cpu;
    u32 dims[6];
    u16 kind;
    u16 op;
    u32 flags;
    char comm[COMM_LEN];
    char comm2[COMM_LEN];
};

/* Run-time settings, written by user space (element 0). */
struct config {
    u32 gen;           /* aggregation generation (0/1): user space flips it, then harvests the other */
    u32 record_all;    /* --record-all: every call gets a row */
    u32 sample_n;      /* 1-in-N sample of calls that get a row anyway (0: none) */
    u32 scope_all;     /* 1: whole host; 0: only tgids in in_scope */
    u32 auto_target;   /* 1: an in-scope process that calls a traced function becomes a target */
    u32 notify_exec;   /* 1: report every in-scope exec (so --comm patterns are matched at once) */
    u32 self_tgid;     /* the agent itself: its own block I/O (the database) is not traced */
    u32 record_coll;   /* 1: every collective call (WHY_COLL) and outermost synchronize (WHY_SYNC) gets a row:
                        * each rank's steps, in order */
};

/* A frame of a traced call in progress (entry seen, return not yet). */
struct frame {
    u64 ts;
    u64 bytes;
    u32 dims[6];
    u16 op;       /* base op id (aggregation) */
    u16 sym;      /* symbol id (which variant was called) */
    u32 epoch;    /* the thread's off-CPU epoch at entry: changed at return => the call overlapped an off-CPU interval */
    u32 kind;     /* FRAME_OUT_COMM: bytes holds the address of an out-parameter communicator, read at return;
                   * FRAME_COLLECTIVE: a collective (cuda.c) */
    u64 sp;       /* user stack pointer at entry: a nested call's is lower (frames whose call returned unseen are dropped) */
};
#define MAX_DEPTH 4   /* runtime -> driver nesting; power of two */
struct callstack {
    u32 depth;
    u32 epoch;
    struct frame f[MAX_DEPTH];
};

BPF_ARRAY(config, struct config, 1);
BPF_HASH(targets, u32, u8, 65536);          /* traced tgids: kept by user space and (forks, exits) by the kernel */
BPF_HASH(in_scope, u32, u8, 65536);         /* tgids in scope when scope_all == 0 (forks inherit) */
BPF_HASH(tid_tgid, u32, u32, 262144);       /* threads of traced tgids -> tgid (sched events only carry the tid) */
BPF_HASH(callstacks, u32, struct callstack, 65536);  /* per thread: calls in progress */
BPF_PERCPU_ARRAY(hits, u64, NHITS);
BPF_PERCPU_ARRAY(lost, u64, NLOST);
/* Records are submitted with BPF_RB_NO_WAKEUP: user space drains on a timer. A wakeup per record
 * would wake the agent, which would then preempt the traced thread: the tracer as the noise. */
BPF_RINGBUF_OUTPUT(call_events, CALL_RINGBUF_PAGES);  /* high rate: calls only, so a call flood cannot crowd out sched/block */
BPF_RINGBUF_OUTPUT(sys_events, SYS_RINGBUF_PAGES);    /* sched, block, process lifecycle */

static __always_inline void count_hit(u32 index)
{
    u64 *v = hits.lookup(&index);
    if (v)
        (*v)++;
}

static __always_inline void count_lost(u32 index)
{
    u64 *v = lost.lookup(&index);
    if (v)
        (*v)++;
}

static __always_inline struct config *get_config(void)
{
    u32 zero = 0;
    return config.lookup(&zero);
}

static __always_inline int tgid_in_scope(struct config *c, u32 tgid)
{
    return c->scope_all || in_scope.lookup(&tgid) != 0;
}

static __always_inline void emit_proc(u16 what, u32 tgid, u32 parent)
{
    struct event *e = sys_events.ringbuf_reserve(sizeof(struct event));
    if (!e) {
        count_lost(LOST_PROC);
        return;
    }
    __builtin_memset(e, 0, sizeof(*e));
    e->kind = EV_PROC;
    e->op = what;
    e->ts = bpf_ktime_get_ns();
    e->tgid = tgid;
    e->tid = tgid;
    e->a0 = parent;
    e->cpu = bpf_get_smp_processor_id();
    bpf_get_current_comm(&e->comm, sizeof(e->comm));
    sys_events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
}
#endif
