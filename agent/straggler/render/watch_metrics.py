"""The live watch's verdict as Prometheus metrics (`straggler watch --metrics-listen`): the straggle
episode going on now — its node, rank and cause, when it began, whether it comes and goes — the job's
time lost over the time the watch holds, split by what lost it (each episode, imbalance), and the nodes
answering. A node's own /metrics cannot say this (it takes every node's data to name a straggler);
the watch can. Rendering only: the state comes from the watch's events and polls."""
import threading
import time

EPISODE_HELP = "1 while a straggle episode goes on (node, rank, cause): the watch's current verdict"


class WatchState:
    """What the watch holds now, updated from its events (onset, cause-change, recovered, lost, back)
    and its polls; read by the collector at each scrape."""

    def __init__(self):
        self.lock = threading.Lock()
        self.current = None          # the onset/cause-change event of the episode going on
        self.started_real = None     # its start, seconds since the epoch (the episode's own, else the onset's)
        self.onsets = 0
        self.nodes = {}              # address -> 1 answering / 0 not
        self.polls = 0
        self.lost_now = None         # the job's time lost to the episode going on, so far (its last poll)
        self.lost_ended = 0.0        # ... and to the episodes that ended
        self.window = None           # the job's time lost over the time held, by what lost it (the last measure's)

    def on_event(self, e):
        with self.lock:
            kind = e["event"]
            if kind == "onset":
                self.onsets += 1
                self.current = e
                self.started_real = _epoch(e.get("episode_start")) or time.time()
            elif kind == "cause-change" and self.current is not None:
                self.current = e
            elif kind == "recovered":
                self.current, self.started_real, self.lost_now = None, None, None
                self.lost_ended += float(e.get("lost_s") or 0.0)
            elif kind == "lost":
                self.nodes[e.get("address") or e.get("node")] = 0
            elif kind == "back":
                self.nodes[e.get("address") or e.get("node")] = 1

    def on_tick(self, verdict, feeds):
        with self.lock:
            self.polls += 1
            self.window = getattr(verdict, "whatif", None)
            if self.current is not None and verdict.straggler == self.current.get("node"):
                self.lost_now = verdict.lost_s
            for f in feeds:
                self.nodes.setdefault(f.address, 1)


def _epoch(iso):
    if not iso:
        return None
    import datetime
    try:
        return datetime.datetime.fromisoformat(iso).timestamp()
    except ValueError:
        return None


class WatchCollector:
    """A prometheus-client collector over a WatchState."""

    def __init__(self, state):
        self.state = state

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        with self.state.lock:
            current, started, onsets = self.state.current, self.state.started_real, self.state.onsets
            nodes, polls = dict(self.state.nodes), self.state.polls
            lost_now, lost_ended = self.state.lost_now, self.state.lost_ended
            window = self.state.window
        going = GaugeMetricFamily("straggler_episode", EPISODE_HELP, labels=["node", "rank", "cause", "intermittent"])
        start = GaugeMetricFamily("straggler_episode_start_timestamp_seconds",
                                  "When the straggle episode going on began (seconds since the epoch)", labels=["node"])
        share = GaugeMetricFamily("straggler_episode_cause_share_ratio",
                                  "The share of the straggler's excess step time its cause explains", labels=["node"])
        if current is not None:
            node = str(current.get("node") or "")
            rank = "" if current.get("rank") is None else str(current["rank"])
            going.add_metric([node, rank, str(current.get("cause") or "unknown"),
                              "1" if current.get("intermittent") else "0"], 1)
            if started is not None:
                start.add_metric([node], started)
            if current.get("share") is not None:
                share.add_metric([node], float(current["share"]))
        lost = GaugeMetricFamily("straggler_episode_time_lost_seconds",
                                 "The job's time lost to the straggle episode going on, so far (its slowdown over its "
                                 "time; absent when not measured)", labels=["node"])
        if current is not None and lost_now is not None:
            lost.add_metric([str(current.get("node") or "")], float(lost_now))
        yield going
        yield start
        yield share
        yield lost
        ended = CounterMetricFamily("straggler_episodes_time_lost_seconds",
                                    "The job's time lost to the straggle episodes that ended while the watch ran")
        ended.add_metric([], lost_ended)
        yield ended
        yield from _window_families(window)
        total = CounterMetricFamily("straggler_episode_onsets", "Straggle episodes the watch has seen begin")
        total.add_metric([], onsets)
        yield total
        up = GaugeMetricFamily("straggler_watch_node_up", "1 when the node's agent answered the last poll",
                               labels=["address"])
        for address, value in sorted(nodes.items()):
            up.add_metric([address], value)
        yield up
        count = CounterMetricFamily("straggler_watch_polls", "Polls of every node the watch has made")
        count.add_metric([], polls)
        yield count


def _window_families(w):
    """The job's time lost over the time the watch holds (its last --baseline + --window seconds) at its sync
    points (explain's what-if): in all, as a share of
    the window, and split by what lost it — each node's episode or pauses, and imbalance that moves between
    ranks (with jitter); absent where it was not measured."""
    from prometheus_client.core import GaugeMetricFamily
    span = GaugeMetricFamily("straggler_window_span_seconds",
                             "The span of the time the watch holds (its last --baseline + --window seconds) over which the job's "
                             "time lost is measured: its first to last sync point")
    ratio = GaugeMetricFamily("straggler_window_time_lost_ratio",
                              "Share of that span the job lost waiting for its slowest rank at its sync points")
    lost = GaugeMetricFamily("straggler_window_time_lost_seconds",
                             "The job's time lost over that span, by what lost it (what: episode, pauses or imbalance; "
                             "node: the episode's, empty for imbalance)", labels=["what", "node"])
    if w and w.get("measured"):
        span.add_metric([], float(w["span_s"]))
        ratio.add_metric([], float(w["lost_ratio"]))
        by = {}
        for p in w.get("parts") or []:
            key = (str(p.get("what") or "episode"), str(p.get("node") or ""))
            by[key] = by.get(key, 0.0) + float(p.get("lost_s") or 0.0)
        by[("imbalance", "")] = float((w.get("imbalance") or {}).get("lost_s") or 0.0)
        for (what, node), value in sorted(by.items()):
            lost.add_metric([what, node], value)
    yield span
    yield ratio
    yield lost
