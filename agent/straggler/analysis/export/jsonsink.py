"""Chrome Trace Event JSON for `straggler export --format json` (or an output named *.json): the sink
interface timeline.py writes to (process, track, counter_track, slice, track_done, counters,
instant, close), as {"traceEvents": [...], "displayTimeUnit": "ms"} with `ts` in exact decimal µs
since the trace start. Streams to the file it is given; must not read the database or choose
what is exported."""
import json

SEPARATOR = ",\n"


def _us(ns):
    """ns (int) -> exact decimal µs text."""
    if ns < 0:
        return "-" + _us(-ns)
    whole, frac = divmod(int(ns), 1000)
    return f"{whole}.{frac:03d}"


class JsonSink:
    """Chrome Trace Event JSON ({"traceEvents": [...], "displayTimeUnit": "ms"}): `ts` in exact decimal
    µs since the trace start (the start in ns since the epoch is in otherData.trace_start_ns)."""

    def __init__(self, fh, start_ns):
        self.fh = fh
        self.start = start_ns
        self.count = 0
        self._enc = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
        self._names = {}          # slice names repeat (op names, "preempted by X"): encode each once
        self.next_tid = 1
        self.sort = 0
        fh.write('{"traceEvents":[\n')

    def _event(self, obj, ts=None):
        text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
        if ts is not None:   # exact decimal µs: splice in the number json would round
            text = text[:-1] + f',"ts":{_us(ts - self.start)}' + "}"
        self.fh.write((SEPARATOR if self.count else "") + text)
        self.count += 1

    def process(self, pid, name, sort_index, rank, description):
        self._event({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
        self._event({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": sort_index}})
        labels = [f"rank {rank}"] if rank is not None else []
        if description:
            labels.append(description)
        if labels:
            self._event({"ph": "M", "name": "process_labels", "pid": pid, "tid": 0, "args": {"labels": ", ".join(labels)}})

    def track(self, pid, name, lane=None, first=False):
        """A thread-like track; lane N > 0 of a laned track is named "name · lane N+1"; first: before the others."""
        tid = self.next_tid
        self.next_tid += 1
        self.sort += 1
        if lane:
            name = f"{name} · lane {lane + 1}"
        self._event({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
        self._event({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                     "args": {"sort_index": -1 if first else self.sort}})
        return (pid, tid)

    def counter_track(self, pid, name, unit):
        return (pid, name)

    def slice(self, track, t, dur, name, cat, args):
        """A complete ("X") event, formatted directly: the hot path of the export."""
        encoded = self._names.get(name)
        if encoded is None:
            encoded = self._enc(name)
            if len(self._names) < 10_000:      # bounded: memory must not grow with the trace
                self._names[name] = encoded
        self.fh.write(f'{SEPARATOR if self.count else ""}{{"ph":"X","name":{encoded},"cat":"{cat}","pid":{track[0]},'
                      f'"tid":{track[1]},"ts":{_us(t - self.start)},"dur":{_us(dur)},"args":{self._enc(dict(args))}}}')
        self.count += 1

    def track_done(self, track):
        pass

    def counters(self, tracks_values, t):
        """Counter samples at t: [(track, value)]; one "C" event per counter name."""
        for (pid, name), value in tracks_values:
            self._event({"ph": "C", "name": name, "pid": pid, "tid": 0, "args": {"value": value}}, ts=t)

    def instant(self, track, t, name, cat, args):
        if track is None:
            self._event({"ph": "i", "s": "g", "name": name, "cat": cat, "pid": 0, "tid": 0, "args": dict(args)}, ts=t)
        else:
            self._event({"ph": "i", "s": "t", "name": name, "cat": cat, "pid": track[0], "tid": track[1],
                         "args": dict(args)}, ts=t)

    def close(self, meta):
        self.fh.write('\n],"displayTimeUnit":"ms","otherData":' + json.dumps(meta, default=str) + "}\n")

    @property
    def records(self):
        return self.count
