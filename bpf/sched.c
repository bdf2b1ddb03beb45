/*
 * Scheduling of traced threads (threads of tgids in `targets`), from sched tracepoints only.
 *
 * For every off-CPU interval of a traced thread one record is sent when the thread is switched
 * back in: when it left (ts), for how long (dur), whether it was preempted while runnable or
 * went to sleep (op: 1 preempted, 0 blocked), which task took the CPU at that moment
 * (other_pid, comm2 -- named whatever it is, in scope or not), and the run-queue wait: from
 * the wakeup (or the preemption) to the switch-in (a0, start in a1).
 *
 * For the step-time model (explain) the record also says which class of traced call the thread
 * was in when it left the CPU (dims[4]: 0 none, 1 work, 2 sync, 3 collective; op_class from
 * cuda.c) and who held the CPU until the thread got it back: the task switched out at the
 * switch-in (current at that moment, so its process comes from the helper): a2 = its tgid |
 * PREV_* flags << 32, dims[5] = its tid, dims[0..3] = its comm. That task is the one the
 * run-queue wait is charged to (a preemption's taker may have left long before).
 *
 * Also keeps the process bookkeeping the other probes rely on: threads of targets in tid_tgid,
 * forks of targets become targets, forks of in-scope processes are in scope, exits clean up.
 */
#include "common.h"

#define STATE_BLOCKED 0
#define STATE_PREEMPTED 1
#define STATE_UNKNOWN 2   /* switch-in seen without its switch-out (e.g. the thread's first run) */

/* prev_state: the task's state bits (0x1 S, 0x2 D, ... 0x80 I); 0 = running (it was runnable);
 * preemption reports TASK_REPORT_MAX (0x100 on 6.x, "R+"). So runnable <=> (state & 0xff) == 0. */
#define STATE_BITS 0xff

/* a2 >> 32 of a switch-in record: what the previous task (the one that held the CPU) was */
#define PREV_VALID 1     /* a task, not the idle loop */
#define PREV_IN_SCOPE 2  /* its process is in the agent's scope (always with --scope host) */
#define PREV_TARGET 4    /* its process is traced (a trainer: itself, or another rank in scope) */

struct offcpu_start {
    u64 ts;
    u32 other_pid;
    u32 cpu;
    u32 state;
    u32 in_call;  /* call class of the outermost traced call in progress (0: none) */
    char other_comm[COMM_LEN];
};
BPF_HASH(offcpu_start, u32, struct offcpu_start, 262144);
BPF_HASH(runq_start, u32, u64, 262144);

TRACEPOINT_PROBE(sched, sched_switch)
{
    u64 now = bpf_ktime_get_ns();
    count_hit(HIT_SCHED);
    u32 prev = args->prev_pid, next = args->next_pid;

    /* switch-out: prev is still current here, so its tgid comes from the helper */
    if (prev != 0) {
        u32 tgid = bpf_get_current_pid_tgid() >> 32;
        if (targets.lookup(&tgid)) {
            if (!tid_tgid.lookup(&prev))
                tid_tgid.update(&prev, &tgid);
            struct offcpu_start s = {};
            s.ts = now;
            s.other_pid = next;
            s.cpu = bpf_get_smp_processor_id();
            s.state = (args->prev_state & STATE_BITS) == 0 ? STATE_PREEMPTED : STATE_BLOCKED;
            bpf_probe_read_kernel(&s.other_comm, sizeof(s.other_comm), args->next_comm);
            struct callstack *cs = callstacks.lookup(&prev);
            if (cs && cs->depth) {
                cs->epoch++;  /* a call in progress overlaps this off-CPU interval */
                u32 op_index = cs->f[0].op;
                u32 *cls = op_class.lookup(&op_index);
                s.in_call = cls ? *cls : 0;
            }
            offcpu_start.update(&prev, &s);
            if (s.state == STATE_PREEMPTED)
                runq_start.update(&prev, &now);
            else
                runq_start.delete(&prev);  /* the wait starts at the wakeup */
        }
    }

    /* switch-in */
    if (next == 0)
        return 0;
    u32 *next_tgid = tid_tgid.lookup(&next);
    if (!next_tgid)
        return 0;
    u64 runq_ts = 0;
    u64 *r = runq_start.lookup(&next);
    if (r) {
        runq_ts = *r;
        runq_start.delete(&next);
    }
    struct offcpu_start *s = offcpu_start.lookup(&next);
    if (!s && runq_ts == 0)
        return 0;
    struct event *e = sys_events.ringbuf_reserve(sizeof(struct event));
    if (!e) {
        count_lost(LOST_SCHED);
        if (s)
            offcpu_start.delete(&next);
        return 0;
    }
    __builtin_memset(e, 0, sizeof(*e));
    e->kind = EV_SCHED;
    e->tgid = *next_tgid;
    e->tid = next;
    e->flags = bpf_get_smp_processor_id();
    if (s) {
        e->ts = s->ts;
        e->dur = now - s->ts;
        e->op = s->state;
        e->other_pid = s->other_pid;
        e->cpu = s->cpu;
        __builtin_memcpy(e->comm2, s->other_comm, sizeof(e->comm2));
    } else {
        e->op = STATE_UNKNOWN;
        e->cpu = e->flags;
        e->ts = runq_ts;
    }
    if (runq_ts) {
        e->a1 = runq_ts;
        e->a0 = now - runq_ts;
    }
    if (s)
        e->dims[4] = s->in_call;
    /* who held the CPU until now: the task being switched out, still current here */
    if (prev != 0) {
        struct config *c = get_config();
        u32 prev_tgid = bpf_get_current_pid_tgid() >> 32;
        u64 flags = PREV_VALID;
        if (c && tgid_in_scope(c, prev_tgid))
            flags |= PREV_IN_SCOPE;
        if (targets.lookup(&prev_tgid))
            flags |= PREV_TARGET;
        e->a2 = prev_tgid | (flags << 32);
        e->dims[5] = prev;
        bpf_probe_read_kernel(&e->dims[0], COMM_LEN, args->prev_comm);
    }
    bpf_probe_read_kernel(&e->comm, sizeof(e->comm), args->next_comm);
    sys_events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
    if (s)
        offcpu_start.delete(&next);
    return 0;
}

static __always_inline void on_wakeup(u32 tid)
{
    count_hit(HIT_SCHED);
    if (tid_tgid.lookup(&tid)) {
        u64 now = bpf_ktime_get_ns();
        runq_start.update(&tid, &now);
    }
}

TRACEPOINT_PROBE(sched, sched_wakeup)
{
    on_wakeup(args->pid);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_wakeup_new)
{
    on_wakeup(args->pid);
    return 0;
}

/* In the parent's context: the new task is a thread (CLONE_THREAD) or a new process. */
#define CLONE_THREAD_FLAG 0x00010000
TRACEPOINT_PROBE(task, task_newtask)
{
    count_hit(HIT_PROC);
    u32 parent = bpf_get_current_pid_tgid() >> 32, child = args->pid;
    u8 one = 1;
    if (args->clone_flags & CLONE_THREAD_FLAG) {
        if (targets.lookup(&parent))
            tid_tgid.update(&child, &parent);
        return 0;
    }
    if (in_scope.lookup(&parent))
        in_scope.update(&child, &one);
    if (targets.lookup(&parent)) {
        targets.update(&child, &one);
        tid_tgid.update(&child, &child);
        emit_proc(PROC_FORK, child, parent);
    }
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exec)
{
    count_hit(HIT_PROC);
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct config *c = get_config();
    if (!c)
        return 0;
    if (targets.lookup(&tgid) || (c->notify_exec && tgid_in_scope(c, tgid)))
        emit_proc(PROC_EXEC, tgid, 0);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
    count_hit(HIT_PROC);
    u32 tid = args->pid;
    tid_tgid.delete(&tid);
    offcpu_start.delete(&tid);
    runq_start.delete(&tid);
    callstacks.delete(&tid);
    if (args->group_dead) {
        u32 tgid = bpf_get_current_pid_tgid() >> 32;
        if (targets.lookup(&tgid)) {
            targets.delete(&tgid);
            emit_proc(PROC_EXIT, tgid, 0);
        }
        in_scope.delete(&tgid);
    }
    return 0;
}

/* A process that joins a network namespace with setns (nsenter, ip netns exec) is not a child of
 * an in-scope process, so it did not inherit scope: tell user space, which reads /proc/PID/ns/net
 * at once (the kernel side cannot tell which namespace the fd named without reading structs). */
TRACEPOINT_PROBE(syscalls, sys_exit_setns)
{
    struct config *c = get_config();
    if (!c || c->scope_all || args->ret != 0)
        return 0;
    count_hit(HIT_PROC);
    emit_proc(PROC_SETNS, bpf_get_current_pid_tgid() >> 32, 0);
    return 0;
}
