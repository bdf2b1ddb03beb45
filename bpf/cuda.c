/*
 * CUDA runtime / driver / NCCL calls: uprobe at entry, one shared uretprobe at return.
 *
 * In the kernel (because it saves work): the duration, the kept arguments, the per-interval
 * aggregate of EVERY call (count, sum, max, log2 histogram per tgid and op), and the decision
 * whether a call gets its own row (see agent/straggler/probes/__init__.py for the rule).
 * Only calls that get a row go through the ring buffer.
 *
 * The agent appends one line per traced symbol:  CALL_ENTRY(fn_name, symbol_id, op_id, ARG_KIND)
 * (the symbol table lives in agent/straggler/probes/symbols.py).
 */
#include "common.h"

/* Which arguments a function keeps (x86-64 SysV: rdi, rsi, rdx, rcx, r8, r9, then the stack). */
#define ARG_NONE 0
#define ARG_BYTES2 1       /* size in arg 2: cuMemAlloc(dptr, bytesize), cudaMalloc(devPtr, size) */
#define ARG_BYTES3 2       /* size in arg 3: cuMemcpy*(dst, src, bytes, ...), cudaMemcpy*(dst, src, count, ...) */
#define ARG_BYTES5 3       /* size in arg 5: cuMemcpyPeer(dst, dctx, src, sctx, bytes) */
#define ARG_CU_LAUNCH 4    /* cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, ...): rsi rdx rcx r8 r9, bz at [sp+8] */
#define ARG_CUDA_LAUNCH 5  /* cudaLaunchKernel(func, dim3 grid, dim3 block, ...): dim3 (12 bytes) by value =
                              two registers each: grid x|y<<32 in rsi, z in rdx; block x|y<<32 in rcx, z in r8 */
/* NCCL: bytes = count * sizeof(datatype); dims = count (lo, hi), datatype, op | root/peer << 16 (0xffff:
 * none), communicator (lo, hi) */
#define ARG_NCCL 6         /* AllReduce, ReduceScatter (send, recv, count, datatype, op, comm, stream) */
#define ARG_NCCL_ROOT 7    /* Broadcast (send, recv, count, datatype, root, comm, stream) */
#define ARG_NCCL_GATHER 8  /* AllGather (send, recv, sendcount, datatype, comm, stream) */
#define ARG_NCCL_REDUCE 9  /* Reduce (send, recv, count, datatype, op, root, comm at [sp+8], stream) */
#define ARG_NCCL_P2P 10    /* Send, Recv (buf, count, datatype, peer, comm, stream) */
/* Communicator set-up: always a row (WHY_SETUP). The new communicator is an out-parameter, read at return
 * (frame.kind FRAME_OUT_COMM: frame.bytes holds its address until then); dims[4..5] = the new communicator (lo, hi). */
#define ARG_NCCL_INIT 11   /* CommInitRank(ncclComm_t *comm, nranks, ncclUniqueId id, rank[, config]): the 128-byte id
                              is passed in memory (on the stack at [sp+8]), so rank is the third REGISTER (rdx).
                              dims = nranks, rank, the id's first 8 bytes (NCCL's random magic: the same on every
                              rank of one communicator), new comm */
#define ARG_NCCL_SPLIT 12  /* CommSplit(comm, color, key, ncclComm_t *newcomm, config): dims = color, key,
                              parent comm (lo, hi), new comm */

#define NBUCKETS 40        /* log2(ns) histogram: bucket i holds [2^i, 2^(i+1)) ns; the last one everything above */

/* why a call got a row (event.flags) */
#define WHY_ALL 1
#define WHY_SLOW 2
#define WHY_OFFCPU 4
#define WHY_SAMPLE 8
#define WHY_ERROR 16   /* the call returned an error: cudaError_t, CUresult and ncclResult_t are 0 on success */
#define WHY_SETUP 32   /* communicator set-up (ARG_NCCL_INIT, ARG_NCCL_SPLIT): rare, and what explain groups by */
#define WHY_COLL 64    /* a collective, with config.record_coll: every one, so each rank's steps line up */
#define WHY_SYNC 128   /* an outermost synchronize, with config.record_coll: every one (where the ranks wait
                        * for their peers when collectives only enqueue) */
#define FRAME_OUT_COMM 1    /* frame.kind: a set-up call's out-parameter communicator, read at return */
#define FRAME_COLLECTIVE 2  /* frame.kind: a collective (ARG_NCCL .. ARG_NCCL_P2P) */
#define NCCL_IN_PROGRESS 7   /* ncclInProgress */
#define CLASS_SYNC 2         /* op_class: *Synchronize (probes/symbols.py CALL_CLASSES) */
#define CLASS_COLLECTIVE 3   /* op_class: NCCL's functions */

struct agg_key {
    u32 tgid;
    u16 op;
    u16 gen;
};
struct agg_val {
    u64 count;
    u64 sum;
    u64 max;
    u64 hist[NBUCKETS];
};
BPF_HASH(call_aggs, struct agg_key, struct agg_val, 16384);
BPF_PERCPU_ARRAY(agg_zero, struct agg_val, 1);          /* never written: a zero value to insert */
BPF_PERCPU_ARRAY(callstack_zero, struct callstack, 1);  /* never written: a zero value to insert */
BPF_ARRAY(slow_ns, u64, NUM_OPS);                       /* per op: a call at least this long is "slow" (0: none) */

/* The step-time model's call part, per thread: time in outermost calls by CALL CLASS (op_class,
 * written by user space from probes/symbols.py: 1 work, 2 sync, 3 collective). Running totals,
 * never reset: user space reads them every interval and takes the difference, so nothing is
 * lost between two reads and no generation flip is needed. sched.c reads op_class too (which
 * class of call a thread was in when it left the CPU). */
struct thread_calls {
    u32 tgid;
    u32 pad;
    u64 ns[NCLASSES];
    u64 count[NCLASSES];
};
BPF_ARRAY(op_class, u32, NUM_OPS);
BPF_HASH(thread_calls, u32, struct thread_calls, 65536);

static __always_inline u32 nccl_type_size(u32 datatype)
{
    switch (datatype) {
    case 0: case 1: case 10: case 11: return 1;   /* int8, uint8, fp8 e4m3/e5m2 */
    case 6: case 9: return 2;                     /* float16, bfloat16 */
    case 2: case 3: case 7: return 4;             /* int32, uint32, float32 */
    case 4: case 5: case 8: return 8;             /* int64, uint64, float64 */
    default: return 0;
    }
}

/* In default mode (auto_target) a process in scope that calls a traced function becomes a target
 * right here, so its first calls are not missed while user space catches up. */
static __always_inline int call_wanted(struct config *c, u32 tgid)
{
    if (targets.lookup(&tgid))
        return 1;
    if (!c->auto_target || !tgid_in_scope(c, tgid))
        return 0;
    u8 one = 1;
    if (targets.update(&tgid, &one) == 0) {
        tid_tgid.update(&tgid, &tgid);
        emit_proc(PROC_NEW, tgid, 0);
    }
    return 1;
}

static __always_inline int call_entry(struct pt_regs *ctx, u16 sym, u16 op, int arg_kind)
{
    count_hit(HIT_UPROBE);
    struct config *c = get_config();
    if (!c)
        return 0;
    u64 pid_tgid = bpf_get_current_pid_tgid();
    u32 tgid = pid_tgid >> 32, tid = (u32)pid_tgid;
    if (!call_wanted(c, tgid))
        return 0;
    struct callstack *cs = callstacks.lookup(&tid);
    if (!cs) {
        u32 zero = 0;
        struct callstack *init = callstack_zero.lookup(&zero);
        if (!init)
            return 0;
        callstacks.update(&tid, init);
        cs = callstacks.lookup(&tid);
        if (!cs) {
            count_lost(LOST_CALLS);  /* callstacks map full */
            return 0;
        }
    }
    u32 d = cs->depth;
    if (d >= MAX_DEPTH)
        d = 0;  /* stale frames (calls that never returned, e.g. a longjmp): start over */
    /* A call nested in a traced one (runtime -> driver) runs deeper in the stack. A frame at or below
     * this call's stack pointer belongs to a call that returned without its uretprobe firing (the
     * agent attached while it was in progress, or a longjmp): drop it, or this thread would look
     * forever "inside" that call and none of its calls would be outermost again. */
    u64 sp = PT_REGS_SP(ctx);
#pragma unroll
    for (int i = 0; i < MAX_DEPTH; i++) {
        if (d == 0 || cs->f[(d - 1) & (MAX_DEPTH - 1)].sp > sp)
            break;
        d--;
    }
    /* the compiler knows d < MAX_DEPTH and drops a mask; the verifier does not: launder it */
    volatile u32 depth_v = d;
    d = depth_v & (MAX_DEPTH - 1);
    struct frame *f = &cs->f[d];
    f->sp = sp;
    f->op = op;
    f->sym = sym;
    f->epoch = cs->epoch;
    f->kind = 0;
    switch (arg_kind) {
    case ARG_BYTES2:
        f->bytes = PT_REGS_PARM2(ctx);
        break;
    case ARG_BYTES3:
        f->bytes = PT_REGS_PARM3(ctx);
        break;
    case ARG_BYTES5:
        f->bytes = PT_REGS_PARM5(ctx);
        break;
    case ARG_CU_LAUNCH: {
        u32 bz = 0;
        bpf_probe_read_user(&bz, sizeof(bz), (void *)(PT_REGS_SP(ctx) + 8));
        f->dims[0] = (u32)PT_REGS_PARM2(ctx);
        f->dims[1] = (u32)PT_REGS_PARM3(ctx);
        f->dims[2] = (u32)PT_REGS_PARM4(ctx);
        f->dims[3] = (u32)PT_REGS_PARM5(ctx);
        f->dims[4] = (u32)PT_REGS_PARM6(ctx);
        f->dims[5] = bz;
        break;
    }
    case ARG_CUDA_LAUNCH: {
        u64 grid_xy = PT_REGS_PARM2(ctx), block_xy = PT_REGS_PARM4(ctx);
        f->dims[0] = (u32)grid_xy;
        f->dims[1] = (u32)(grid_xy >> 32);
        f->dims[2] = (u32)PT_REGS_PARM3(ctx);
        f->dims[3] = (u32)block_xy;
        f->dims[4] = (u32)(block_xy >> 32);
        f->dims[5] = (u32)PT_REGS_PARM5(ctx);
        break;
    }
    case ARG_NCCL:
    case ARG_NCCL_ROOT:
    case ARG_NCCL_GATHER:
    case ARG_NCCL_REDUCE:
    case ARG_NCCL_P2P: {
        f->kind = FRAME_COLLECTIVE;
        u64 count = PT_REGS_PARM3(ctx), comm = PT_REGS_PARM6(ctx);
        u32 dtype = (u32)PT_REGS_PARM4(ctx), op = 0xffff, who = 0xffff;
        if (arg_kind == ARG_NCCL) {
            op = (u32)PT_REGS_PARM5(ctx) & 0xffff;
        } else if (arg_kind == ARG_NCCL_ROOT) {
            who = (u32)PT_REGS_PARM5(ctx) & 0xffff;
        } else if (arg_kind == ARG_NCCL_GATHER) {
            comm = PT_REGS_PARM5(ctx);
        } else if (arg_kind == ARG_NCCL_REDUCE) {
            op = (u32)PT_REGS_PARM5(ctx) & 0xffff;
            who = (u32)PT_REGS_PARM6(ctx) & 0xffff;
            comm = 0;
            bpf_probe_read_user(&comm, sizeof(comm), (void *)(PT_REGS_SP(ctx) + 8));
        } else {
            count = PT_REGS_PARM2(ctx);
            dtype = (u32)PT_REGS_PARM3(ctx);
            who = (u32)PT_REGS_PARM4(ctx) & 0xffff;
            comm = PT_REGS_PARM5(ctx);
        }
        f->bytes = count * nccl_type_size(dtype);
        f->dims[0] = (u32)count;
        f->dims[1] = (u32)(count >> 32);
        f->dims[2] = dtype;
        f->dims[3] = op | (who << 16);
        f->dims[4] = (u32)comm;
        f->dims[5] = (u32)(comm >> 32);
        break;
    }
    case ARG_NCCL_INIT: {
        u64 magic = 0;
        bpf_probe_read_user(&magic, sizeof(magic), (void *)(PT_REGS_SP(ctx) + 8));
        f->bytes = PT_REGS_PARM1(ctx);
        f->kind = FRAME_OUT_COMM;
        f->dims[0] = (u32)PT_REGS_PARM2(ctx);
        f->dims[1] = (u32)PT_REGS_PARM3(ctx);
        f->dims[2] = (u32)magic;
        f->dims[3] = (u32)(magic >> 32);
        f->dims[4] = 0;
        f->dims[5] = 0;
        break;
    }
    case ARG_NCCL_SPLIT: {
        u64 parent = PT_REGS_PARM1(ctx);
        f->bytes = PT_REGS_PARM4(ctx);
        f->kind = FRAME_OUT_COMM;
        f->dims[0] = (u32)PT_REGS_PARM2(ctx);
        f->dims[1] = (u32)PT_REGS_PARM3(ctx);
        f->dims[2] = (u32)parent;
        f->dims[3] = (u32)(parent >> 32);
        f->dims[4] = 0;
        f->dims[5] = 0;
        break;
    }
    }
    cs->depth = d + 1;
    f->ts = bpf_ktime_get_ns();  /* last, so the probe's own work is not counted in the call */
    return 0;
}

#define CALL_ENTRY(fn_name, sym_id, op_id, arg_kind) \
    int fn_name(struct pt_regs *ctx) { return call_entry(ctx, sym_id, op_id, arg_kind); }

static __always_inline void aggregate(struct config *c, u32 tgid, u16 op, u64 dur)
{
    struct agg_key key = {.tgid = tgid, .op = op, .gen = (u16)c->gen};
    struct agg_val *a = call_aggs.lookup(&key);
    if (!a) {
        u32 zero = 0;
        struct agg_val *init = agg_zero.lookup(&zero);
        if (!init)
            return;
        call_aggs.insert(&key, init);
        a = call_aggs.lookup(&key);
        if (!a) {
            count_lost(LOST_CALLS);  /* call_aggs full */
            return;
        }
    }
    u32 bucket = bpf_log2l(dur);  /* floor(log2(dur)) + 1, 1 for dur <= 1 */
    bucket = bucket > 0 ? bucket - 1 : 0;
    if (bucket >= NBUCKETS)
        bucket = NBUCKETS - 1;
    __sync_fetch_and_add(&a->count, 1);
    __sync_fetch_and_add(&a->sum, dur);
    if (dur > a->max)
        a->max = dur;  /* racy across CPUs, at worst a smaller max from the same interval */
    __sync_fetch_and_add(&a->hist[bucket], 1);
}

/* k: the op's call class (op_class) */
static __always_inline void add_thread_call(u32 tid, u32 tgid, u32 k, u64 dur)
{
    if (k >= NCLASSES)
        k = 0;
    struct thread_calls *t = thread_calls.lookup(&tid);
    if (!t) {
        struct thread_calls init = {};
        init.tgid = tgid;
        thread_calls.update(&tid, &init);
        t = thread_calls.lookup(&tid);
        if (!t)
            return;
    }
    t->tgid = tgid;
    __sync_fetch_and_add(&t->ns[k], dur);
    __sync_fetch_and_add(&t->count[k], 1);
}

int call_return(struct pt_regs *ctx)
{
    u64 now = bpf_ktime_get_ns();
    count_hit(HIT_URETPROBE);
    u64 pid_tgid = bpf_get_current_pid_tgid();
    u32 tgid = pid_tgid >> 32, tid = (u32)pid_tgid;
    struct callstack *cs = callstacks.lookup(&tid);
    if (!cs || cs->depth == 0)
        return 0;
    u32 d = cs->depth - 1;
    if (d >= MAX_DEPTH) {
        cs->depth = 0;
        return 0;
    }
    cs->depth = d;
    struct frame *f = &cs->f[d & (MAX_DEPTH - 1)];
    struct config *c = get_config();
    if (!c)
        return 0;
    u64 dur = now - f->ts;
    u16 op = f->op;
    aggregate(c, tgid, op, dur);
    u32 op_index = op;
    u32 cls = 0;  /* the op's call class: looked up once, for the outermost call only */
    if (d == 0) {
        u32 *found_cls = op_class.lookup(&op_index);
        cls = found_cls ? *found_cls : 0;
        add_thread_call(tid, tgid, cls, dur);  /* outermost call only: a runtime call's driver call is inside it */
    }

    u32 why = 0;
    if (c->record_all)
        why |= WHY_ALL;
    u64 *slow = slow_ns.lookup(&op_index);
    if (slow && *slow && dur >= *slow)
        why |= WHY_SLOW;
    if (f->epoch != cs->epoch)
        why |= WHY_OFFCPU;
    if (c->sample_n && bpf_get_prandom_u32() % c->sample_n == 0)
        why |= WHY_SAMPLE;
    int rc = (int)PT_REGS_RC(ctx);
    /* ncclInProgress from a non-blocking communicator is not a failure (its operation goes on); the
     * class is looked up only for that code, not on every return */
    int in_progress = 0;
    if (rc == NCCL_IN_PROGRESS) {
        u32 *call_cls = op_class.lookup(&op_index);
        in_progress = call_cls && *call_cls == CLASS_COLLECTIVE;
    }
    if (rc != 0 && !in_progress)
        why |= WHY_ERROR;
    if (c->record_coll && f->kind == FRAME_COLLECTIVE)
        why |= WHY_COLL;
    if (c->record_coll && cls == CLASS_SYNC)   /* outermost only (cls is 0 inside another call) */
        why |= WHY_SYNC;
    u64 new_comm = 0;
    if (f->kind == FRAME_OUT_COMM) {
        why |= WHY_SETUP;
        if ((rc == 0 || in_progress) && f->bytes)   /* non-blocking: the pointer is valid at once */
            bpf_probe_read_user(&new_comm, sizeof(new_comm), (void *)f->bytes);
        f->bytes = 0;
        f->dims[4] = (u32)new_comm;
        f->dims[5] = (u32)(new_comm >> 32);
    }
    if (!why)
        return 0;

    struct event *e = call_events.ringbuf_reserve(sizeof(struct event));
    if (!e) {
        count_lost(LOST_CALLS);
        return 0;
    }
    e->kind = EV_CALL;
    e->op = f->sym;
    e->flags = why;
    e->ts = f->ts;
    e->dur = dur;
    e->a0 = f->bytes;
    e->a1 = PT_REGS_RC(ctx);
    e->a2 = 0;
    e->tgid = tgid;
    e->tid = tid;
    e->other_pid = 0;
    e->cpu = bpf_get_smp_processor_id();
    __builtin_memcpy(e->dims, f->dims, sizeof(e->dims));
    bpf_get_current_comm(&e->comm, sizeof(e->comm));
    __builtin_memset(e->comm2, 0, sizeof(e->comm2));
    call_events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
    return 0;
}
