/*
 * The TCP traffic of traced processes (tgids in `targets`), per connection and interval, from
 * tracepoints only (table net_flows). Compiled only where the kernel has all of these tracepoints
 * (sock_send_length and sock_recv_length came with Linux 6.3): the agent leaves this file out
 * otherwise, and says so in meta net_probe_state.
 *
 * A connection is known by its struct sock's address (the tracepoints' sk/skaddr; never read).
 *   sock:sock_send_length, sock:sock_recv_length   in the calling task: bytes, calls, errors. The
 *       first call of a traced process on a socket makes its entry in net_socks.
 *   sock:inet_sock_set_state   SYN_SENT runs in connect(), in the connecting task: a traced task's
 *       connection gets its entry then. ESTABLISHED and CLOSE run wherever the packet is handled
 *       (often softirq, on loopback even the PEER's task), so they only count (opened, closed) for
 *       known sockets; an unknown socket that becomes ESTABLISHED (accepted, or connected by an
 *       untraced task) waits in net_opening until a traced process uses it.
 *   tcp:tcp_probe   each incoming segment of an established socket, in softirq: srtt and snd_cwnd
 *       (segments). tcp_sock.srtt_us holds the smoothed RTT in us << 3, and the tracepoint stores
 *       srtt_us >> 3 (include/trace/events/tcp.h): its srtt is in microseconds.
 *   tcp:tcp_retransmit_skb   a packet sent again (with segmentation offload it may hold several
 *       segments); where the tracepoint has `err`, failed attempts are skipped.
 *   syscalls:sys_enter_X / sys_exit_X for X in sendto, recvfrom, sendmsg, recvmsg (send(), recv() and
 *       their kin: calls made on sockets only): a traced task's entry time, kept while it is inside one,
 *       so that the send/recv tracepoint (fired inside the call, at its end) knows how long the call
 *       took: tx_ns/rx_ns. read(), write() and the other calls that reach a socket (readv, writev,
 *       sendmmsg, splice, io_uring) move bytes but are not timed: timing them would put two programs
 *       on every read and write of every process.
 *   tcp:tcp_cong_state_set   the connection's congestion state is set: an entry into CWR, Recovery
 *       or Loss from Open or Disorder is the kernel reacting to a loss or to congestion (recoveries).
 *       A retransmission without one was not a loss: a tail-loss probe sent because the peer was slow
 *       to acknowledge, which the peer's duplicate-SACK then showed spurious (no state change).
 * All of them also teach the entry its addresses (the send/recv tracepoints carry none).
 *
 * The kernel reuses a freed socket's memory for the next one at once, so a connection is its sk
 * AND the time its entry was made (born): a new connection on a reused sk is a new entry (its
 * SYN_SENT, its ESTABLISHED after the old one's CLOSE, or a first call after the old entry went).
 * Counters are per (sk, born, tgid, gen) in net_counts, with a copy of the addresses (the entry in
 * net_socks may belong to the next connection by the time user space reads them): user space flips
 * config.gen each interval and harvests the other generation (as with cuda.c's call_aggs). The
 * counters that no task context owns (RTT, retransmits, opened, closed) go to the socket's last
 * traced user.
 */
#include "common.h"

#define NET_AF_INET 2
#define NET_AF_INET6 10
#define NET_IPPROTO_TCP 6
#define NET_MSG_PEEK 2             /* recv: the data stays in the socket (read again later) */
#define NET_MSG_ERRQUEUE 8192      /* recv: the error queue (timestamps, zero-copy notices), not data */
#define NET_EINTR 4
#define NET_EAGAIN 11              /* a non-blocking call with nothing to do: not a failure */
#define NET_TCP_ESTABLISHED 1
#define NET_TCP_SYN_SENT 2
#define NET_TCP_CLOSE 7
#define NET_TCP_CA_CWR 2            /* include/net/tcp.h: Open 0, Disorder 1, CWR 2, Recovery 3, Loss 4 */
#define NET_TCP_CA_LOSS 4
#define NET_MAX_SOCKS 16384

/* A connection's addresses (user space mirrors them: probes/loader.py read_net_flows). */
struct net_addrs {
    u8 saddr[16];      /* local address; IPv4: the first 4 bytes */
    u8 daddr[16];      /* the peer's */
    u16 family;        /* NET_AF_INET / NET_AF_INET6 once known, 0 before */
    u16 sport;         /* local port, host order; 0: not known yet (connect picks it after SYN_SENT) */
    u16 dport;
    u16 pad;
};
/* What is known of a connection. */
struct net_sock {
    struct net_addrs a;
    u64 born;          /* when this entry was made (ns): tells connections on a reused sk apart */
    u32 tgid;          /* the traced process that last used it */
    u32 closed;        /* reached TCP_CLOSE: user space drops the entry once it has reported it */
    u32 ca_state;      /* its last congestion state (tcp_cong_state_set): Open 0 until told otherwise */
};
struct net_key {
    u64 sk;
    u64 born;
    u32 tgid;
    u32 gen;
};
struct net_counts {
    struct net_addrs a;  /* the connection's, copied: the entry in net_socks may be the next one's */
    u64 tx_bytes;
    u64 rx_bytes;
    u64 srtt_sum_us;
    u64 tx_ns;         /* time in the calls that sent (received) data: entry to the tracepoint */
    u64 rx_ns;
    u32 tx_calls;      /* calls that moved at least one byte */
    u32 rx_calls;
    u32 errors;        /* calls that failed, EAGAIN and EINTR aside */
    u32 retransmits;
    u32 rtt_samples;
    u32 srtt_max_us;
    u32 cwnd_min;      /* 0: no reading */
    u32 recoveries;    /* entries into TCP_CA_CWR, TCP_CA_Recovery or TCP_CA_Loss from below them */
    u16 opened;
    u16 closed;
};
BPF_HASH(net_socks, u64, struct net_sock, NET_MAX_SOCKS);
BPF_HASH(net_counts, struct net_key, struct net_counts, 2 * NET_MAX_SOCKS);  /* two generations */
BPF_TABLE("lru_hash", u64, struct net_addrs, net_opening, 4096);  /* established, no traced user yet */
BPF_TABLE("lru_hash", u32, u64, net_in_call, 16384);  /* a traced task (tid) inside a timed call: since when */

/* saddr/daddr: 4 bytes (IPv4) or 16 (IPv6) each, in kernel (tracepoint) memory */
static __always_inline void net_learn(struct net_addrs *s, u16 family, u16 sport, u16 dport,
                                      const void *saddr, const void *daddr)
{
    if (family == NET_AF_INET) {
        bpf_probe_read_kernel(s->saddr, 4, saddr);
        bpf_probe_read_kernel(s->daddr, 4, daddr);
    } else if (family == NET_AF_INET6) {
        bpf_probe_read_kernel(s->saddr, 16, saddr);
        bpf_probe_read_kernel(s->daddr, 16, daddr);
    } else {
        return;
    }
    s->family = family;
    s->sport = sport;
    s->dport = dport;
}

/* This interval's counters of the connection, for its current traced user. */
static __always_inline struct net_counts *net_counts_of(u64 sk, struct net_sock *s)
{
    struct config *c = get_config();
    struct net_key key = {.sk = sk, .born = s->born, .tgid = s->tgid, .gen = c ? c->gen : 0};
    struct net_counts zero = {};
    struct net_counts *n = net_counts.lookup_or_try_init(&key, &zero);
    if (!n) {
        count_lost(LOST_NET);  /* net_counts full */
        return 0;
    }
    if (n->a.sport != s->a.sport || n->a.family != s->a.family)
        n->a = s->a;  /* learnt since (or first use) */
    return n;
}

static __always_inline int net_known(struct net_sock *s)
{
    return s->a.family && s->a.sport;
}

/* An entry that does not know its addresses yet learns them from a tcp: tracepoint's arguments (those
 * with family, ports and saddr/daddr, saddr_v6/daddr_v6 fields). A macro: each tracepoint's args has a
 * type of its own. */
#define NET_LEARN_TCP(s, args)                                                                          \
    do {                                                                                                \
        if (!net_known(s)) {                                                                            \
            u16 family_ = (args)->family;                                                               \
            if (family_ == NET_AF_INET6)                                                                \
                net_learn(&(s)->a, family_, (args)->sport, (args)->dport, (args)->saddr_v6, (args)->daddr_v6); \
            else                                                                                        \
                net_learn(&(s)->a, family_, (args)->sport, (args)->dport, (args)->saddr, (args)->daddr);   \
        }                                                                                               \
    } while (0)

/* A send or receive call of the current task on a TCP socket: ret = bytes, or -errno. */
static __always_inline void net_io(u64 sk, int ret, int rx)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!targets.lookup(&tgid))
        return;
    u16 opened = 0;
    struct net_sock *s = net_socks.lookup(&sk);
    if (!s) {
        struct net_sock fresh = {};
        struct net_addrs *waiting = net_opening.lookup(&sk);
        if (waiting) {
            fresh.a = *waiting;
            opened = 1;  /* it became ESTABLISHED before its process first used it (accept) */
            net_opening.delete(&sk);
        }
        fresh.tgid = tgid;
        fresh.born = bpf_ktime_get_ns();
        if (net_socks.update(&sk, &fresh)) {
            count_lost(LOST_NET);  /* net_socks full */
            return;
        }
        s = net_socks.lookup(&sk);
        if (!s)
            return;
    } else if (s->tgid != tgid) {
        s->tgid = tgid;  /* shared (fork, passed fd): the softirq counters go to its last user */
    }
    struct net_counts *n = net_counts_of(sk, s);
    if (!n)
        return;
    if (opened)
        n->opened += 1;
    if (ret > 0) {
        u64 took = 0;
        u32 tid = (u32)bpf_get_current_pid_tgid();
        u64 *since = net_in_call.lookup(&tid);
        if (since) {  /* the rest of the same call (a loop inside it) counts from here on */
            u64 now = bpf_ktime_get_ns();
            took = now - *since;
            *since = now;
        }
        if (rx) {
            __sync_fetch_and_add(&n->rx_bytes, ret);
            __sync_fetch_and_add(&n->rx_calls, 1);
            __sync_fetch_and_add(&n->rx_ns, took);
        } else {
            __sync_fetch_and_add(&n->tx_bytes, ret);
            __sync_fetch_and_add(&n->tx_calls, 1);
            __sync_fetch_and_add(&n->tx_ns, took);
        }
    } else if (ret < 0 && ret != -NET_EAGAIN && ret != -NET_EINTR) {
        __sync_fetch_and_add(&n->errors, 1);
    }
}

/* A traced task enters (leaves) a call a socket's data moves by: its tid's entry time is kept while it is
 * inside, so an entry is never a call that has ended. */
static __always_inline void net_call_enter(void)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (!targets.lookup(&tgid))
        return;
    u32 tid = (u32)id;
    u64 now = bpf_ktime_get_ns();
    net_in_call.update(&tid, &now);
}

static __always_inline void net_call_exit(void)
{
    /* whoever it is: a task whose process stopped being traced inside the call leaves no entry behind */
    u32 tid = (u32)bpf_get_current_pid_tgid();
    net_in_call.delete(&tid);
}

#define NET_TIMED_CALL(name)                                                     \
    TRACEPOINT_PROBE(syscalls, sys_enter_##name) { net_call_enter(); return 0; } \
    TRACEPOINT_PROBE(syscalls, sys_exit_##name) { net_call_exit(); return 0; }
NET_TIMED_CALL(sendto)
NET_TIMED_CALL(recvfrom)
NET_TIMED_CALL(sendmsg)
NET_TIMED_CALL(recvmsg)

TRACEPOINT_PROBE(sock, sock_send_length)
{
    count_hit(HIT_NET);
    if (args->protocol != NET_IPPROTO_TCP)
        return 0;
    net_io((u64)args->sk, args->ret, 0);
    return 0;
}

TRACEPOINT_PROBE(sock, sock_recv_length)
{
    count_hit(HIT_NET);
    if (args->protocol != NET_IPPROTO_TCP || (args->flags & (NET_MSG_PEEK | NET_MSG_ERRQUEUE)))
        return 0;
    net_io((u64)args->sk, args->ret, 1);
    return 0;
}

TRACEPOINT_PROBE(sock, inet_sock_set_state)
{
    count_hit(HIT_NET);
    if (args->protocol != NET_IPPROTO_TCP)
        return 0;
    int state = args->newstate;
    if (state != NET_TCP_SYN_SENT && state != NET_TCP_ESTABLISHED && state != NET_TCP_CLOSE)
        return 0;
    u64 sk = (u64)args->skaddr;
    u16 family = args->family;
    const void *saddr = family == NET_AF_INET6 ? (const void *)args->saddr_v6 : (const void *)args->saddr;
    const void *daddr = family == NET_AF_INET6 ? (const void *)args->daddr_v6 : (const void *)args->daddr;
    struct net_sock *s = net_socks.lookup(&sk);
    if (state == NET_TCP_SYN_SENT) {
        /* connect(), in the connecting task: a traced one's connection is known from here on (a
         * socket address met before belonged to a connection that has ended: start over) */
        u32 tgid = bpf_get_current_pid_tgid() >> 32;
        if (!targets.lookup(&tgid)) {
            if (s)
                net_socks.delete(&sk);
            return 0;
        }
        struct net_sock fresh = {};
        fresh.tgid = tgid;
        fresh.born = bpf_ktime_get_ns();
        net_learn(&fresh.a, family, args->sport, args->dport, saddr, daddr);
        if (net_socks.update(&sk, &fresh))
            count_lost(LOST_NET);
        return 0;
    }
    if (s && s->closed && state == NET_TCP_ESTABLISHED) {
        net_socks.delete(&sk);  /* the address of an ended connection, reused by an accepted one */
        s = 0;
    }
    if (!s) {
        if (state == NET_TCP_ESTABLISHED) {
            struct net_addrs fresh = {};
            net_learn(&fresh, family, args->sport, args->dport, saddr, daddr);
            net_opening.update(&sk, &fresh);
        } else {
            net_opening.delete(&sk);
        }
        return 0;
    }
    net_learn(&s->a, family, args->sport, args->dport, saddr, daddr);
    struct net_counts *n = net_counts_of(sk, s);
    if (state == NET_TCP_CLOSE)
        s->closed = 1;
    if (!n)
        return 0;
    if (state == NET_TCP_ESTABLISHED)
        n->opened += 1;
    else
        n->closed += 1;
    return 0;
}

TRACEPOINT_PROBE(tcp, tcp_probe)
{
    count_hit(HIT_NET);
    u64 sk = (u64)args->skaddr;
    struct net_sock *s = net_socks.lookup(&sk);
    if (!s)
        return 0;
    if (!net_known(s)) {
        /* saddr/daddr are a struct sockaddr_in (address at byte 4) or sockaddr_in6 (at byte 8) */
        u16 family = args->family;
        if (family == NET_AF_INET)
            net_learn(&s->a, family, args->sport, args->dport, &args->saddr[4], &args->daddr[4]);
        else
            net_learn(&s->a, family, args->sport, args->dport, &args->saddr[8], &args->daddr[8]);
    }
    struct net_counts *n = net_counts_of(sk, s);
    if (!n)
        return 0;
    /* one socket's segments are handled under its lock: no other CPU writes these fields */
    u32 srtt = args->srtt, cwnd = args->snd_cwnd;
    if (srtt) {  /* 0: no RTT measured yet */
        n->rtt_samples += 1;
        n->srtt_sum_us += srtt;
        if (srtt > n->srtt_max_us)
            n->srtt_max_us = srtt;
    }
    if (cwnd && (!n->cwnd_min || cwnd < n->cwnd_min))
        n->cwnd_min = cwnd;
    return 0;
}

TRACEPOINT_PROBE(tcp, tcp_retransmit_skb)
{
    count_hit(HIT_NET);
#ifdef NET_RETRANSMIT_ERR
    if (args->err)
        return 0;  /* not sent (e.g. the first copy is still queued in this host) */
#endif
    u64 sk = (u64)args->skaddr;
    struct net_sock *s = net_socks.lookup(&sk);
    if (!s)
        return 0;
    NET_LEARN_TCP(s, args);
    struct net_counts *n = net_counts_of(sk, s);
    if (n)
        __sync_fetch_and_add(&n->retransmits, 1);
    return 0;
}

TRACEPOINT_PROBE(tcp, tcp_cong_state_set)
{
    count_hit(HIT_NET);
    u32 state = args->cong_state;
    u64 sk = (u64)args->skaddr;
    struct net_sock *s = net_socks.lookup(&sk);
    if (!s)
        return 0;
    /* an entry into CWR, Recovery or Loss from Open or Disorder: the kernel sets the state again on
     * each repeated timeout (Loss to Loss), and a move between them is the same loss */
    u32 was = s->ca_state;
    s->ca_state = state;
    if (state < NET_TCP_CA_CWR || state > NET_TCP_CA_LOSS || was >= NET_TCP_CA_CWR)
        return 0;
    NET_LEARN_TCP(s, args);
    struct net_counts *n = net_counts_of(sk, s);
    if (n)
        __sync_fetch_and_add(&n->recoveries, 1);
    return 0;
}
