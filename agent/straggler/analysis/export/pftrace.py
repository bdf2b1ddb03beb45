"""Perfetto's native trace format for `straggler export` (plan.py and timeline.py choose what goes in;
this module says it in protobuf TrackEvent, with the `perfetto` package's message classes and its
StreamingTraceProtoBuilder — no hand-written protobuf).

Encoding, chosen for traces of many nodes and millions of events:
  - one trusted packet sequence: its first packet clears the incremental state, and event names,
    categories, argument names and short string argument values are interned (InternedData) the
    first time they are used, so each repeats as a small integer (tables bounded: past
    MAX_INTERNED entries a name is written in full);
  - packets are gathered in batches of BATCH and each batch is written deflate-compressed as one
    TracePacket.compressed_packets, as Perfetto's own tracing service writes compressed traces;
    Trace Processor and ui.perfetto.dev read them as they are (iter_packets below does too);
  - tracks: the root descriptor (uuid 0) asks for explicit process ordering; each node is a process
    track (pid = its position, name "NODE (rank R)", sibling_order_rank = its position, description
    = its clock alignment) and its tracks are children of it, in the order they were made;
    counters are counter tracks (% or calls or bytes);
  - a slice is a TYPE_SLICE_BEGIN/TYPE_SLICE_END pair: the sink keeps each track's stack of open
    slices and writes every END in time order, so a track nests exactly as export's lanes do;
  - timestamps are absolute ns on the fleet timeline (ns since the epoch once aligned) on the trace's
    default clock; a ClockSnapshot says that this clock is REALTIME, one to one, so that the UI can
    show wall-clock times;
  - the export's metadata (timeline, each node's clock offset and uncertainty, the cut, what was
    skipped) goes as JSON in a ChromeEventBundle metadata entry named "straggler".
Must not read the database or choose what is exported.
"""
import json
import zlib

from .errors import ExportError

BATCH = 4096
SEQUENCE = 1
MAX_INTERNED = 50_000
MAX_TEMPLATES = 100_000
INTERN_MAX_CHARS = 200          # longer string values (a finding's summary) are written in full
ZLIB_LEVEL = 1
FIRST_RANK = -2000              # sibling_order_rank of a node's findings track; its counters follow it
COUNTER_RANK = -1000
_TABLES = ("event_names", "event_categories", "debug_annotation_names", "debug_annotation_string_values")


def require():
    """The perfetto package's trace protos and builder, or a one-line error that says how to get them."""
    try:
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2
        from perfetto.trace_builder import proto_builder
    except ImportError as exc:
        raise ExportError(f"--format perfetto needs the perfetto Python package ({exc}): pip install perfetto; "
                          f"or write Chrome JSON with --format json") from None
    return perfetto_trace_pb2, proto_builder


class PerfettoSink:
    """The sink interface timeline.py writes to (process, track, counter_track, slice, track_done, counters, instant,
    close), written as TracePackets."""

    def __init__(self, fh, start_ns, compress=True, realtime=True, sequence=SEQUENCE, uuid_base=0, head=True):
        """sequence / uuid_base: a part written by one of several workers (export's per-node parallel
        export) has a packet sequence and a uuid range of its own; only the head (head=True) writes the
        root descriptor and the clock snapshot. Parts concatenate: a protobuf Trace is its packets."""
        self.pb, builder = require()
        self.builder = builder.StreamingTraceProtoBuilder(fh)
        self.fh = fh
        self.compress = compress
        self.sequence = sequence
        self.fresh = True
        self.batch = self.pb.Trace()
        self.add = self.batch.packet.add
        self.pending = 0
        self.events = 0
        self.next_uuid = uuid_base + 1
        self.proc_uuid = {}
        self.children = {}
        self.counters_made = {}
        self.open = {}
        self.global_track = None
        self.iids = {t: {} for t in _TABLES}
        self.templates = {}
        self.ann_names = self.iids["debug_annotation_names"]
        TE, TD, TP = self.pb.TrackEvent, self.pb.TrackDescriptor, self.pb.TracePacket
        self.BEGIN, self.END, self.INSTANT, self.COUNTER = (TE.TYPE_SLICE_BEGIN, TE.TYPE_SLICE_END, TE.TYPE_INSTANT,
                                                            TE.TYPE_COUNTER)
        self.NEEDS_STATE, self.CLEARED = TP.SEQ_NEEDS_INCREMENTAL_STATE, TP.SEQ_INCREMENTAL_STATE_CLEARED
        if head:
            root = self._packet().track_descriptor
            root.uuid = 0
            root.process_ordering = TD.PROCESS_ORDERING_EXPLICIT
            if realtime:
                p = self._packet()
                for clock in ("BUILTIN_CLOCK_BOOTTIME", "BUILTIN_CLOCK_REALTIME"):
                    c = p.clock_snapshot.clocks.add()
                    c.clock_id = self.pb.BuiltinClock.Value(clock)
                    c.timestamp = int(start_ns)

    # ---- packets, interning, batches

    def _packet(self):
        if self.pending >= BATCH:
            self._flush()
        self.pending += 1
        p = self.add()
        p.trusted_packet_sequence_id = self.sequence
        if self.fresh:                   # the sequence's first packet: its interning starts here
            p.sequence_flags = self.CLEARED
            self.fresh = False
        return p

    def _flush(self):
        if not self.pending:
            return
        data = self.batch.SerializeToString()
        if self.compress:
            outer = self.builder.create_packet()
            outer.compressed_packets = zlib.compress(data, ZLIB_LEVEL)
            self.builder.write_packet(outer)
        else:
            self.fh.write(data)          # a serialized Trace: the file is a concatenation of them
        self.batch = self.pb.Trace()
        self.add = self.batch.packet.add
        self.pending = 0

    def _iid(self, packet, table, value):
        ids = self.iids[table]
        iid = ids.get(value)
        if iid is None:
            if len(ids) >= MAX_INTERNED:
                return None
            iid = ids[value] = len(ids) + 1
            entry = getattr(packet.interned_data, table).add()
            entry.iid = iid
            if table == "debug_annotation_string_values":
                entry.str = value.encode("utf-8")
            else:
                entry.name = value
        return iid

    def _template(self, packet, kind, track, name=None, cat=None):
        """The serialized fixed part of an event (sequence, flags, type, track, name, category), its
        names interned into `packet` when new: merged into each event of the kind (the hot path, in C)."""
        t = self.pb.TracePacket()
        t.trusted_packet_sequence_id = self.sequence
        t.sequence_flags = self.NEEDS_STATE
        e = t.track_event
        e.type = kind
        e.track_uuid = track
        if name is not None:
            iid = self._iid(packet, "event_names", name)
            if iid is None:
                e.name = name
            else:
                e.name_iid = iid
        if cat is not None:
            iid = self._iid(packet, "event_categories", cat)
            if iid is None:
                e.categories.append(cat)
            else:
                e.category_iids.append(iid)
        return t.SerializeToString()

    def _from_template(self, tpl, t):
        """A new packet: a template's fields, merged in C, and its timestamp."""
        if self.pending >= BATCH:
            self._flush()
        self.pending += 1
        self.events += 1
        p = self.add()
        p.MergeFromString(tpl)
        p.timestamp = t
        return p

    def _event(self, t, kind, track, name=None, cat=None, args=()):
        key = (kind, track, name, cat)
        tpl = self.templates.get(key)
        interned = None
        if tpl is None:                  # new names are interned in this event's own packet
            interned = self.pb.TracePacket()
            tpl = self._template(interned, kind, track, name, cat)
            if len(self.templates) < MAX_TEMPLATES:
                self.templates[key] = tpl
        p = self._from_template(tpl, t)
        if interned is not None and interned.HasField("interned_data"):
            p.interned_data.CopyFrom(interned.interned_data)
        if self.fresh:
            p.sequence_flags = self.CLEARED | self.NEEDS_STATE
            self.fresh = False
        if not args:
            return p
        add = p.track_event.debug_annotations.add
        for key, value in args:
            self._annotate(p, add(), key, value)
        return p

    def _annotate(self, p, a, key, value):
        iid = self.iids["debug_annotation_names"].get(key) or self._iid(p, "debug_annotation_names", key)
        if iid is None:
            a.name = key
        else:
            a.name_iid = iid
        kind = type(value)
        if kind is int:
            a.int_value = value
        elif kind is float:
            a.double_value = value
        elif kind is bool:
            a.bool_value = value
        else:
            text = str(value)
            iid = self._iid(p, "debug_annotation_string_values", text) if len(text) <= INTERN_MAX_CHARS else None
            if iid is None:
                a.string_value = text
            else:
                a.string_value_iid = iid

    # ---- tracks

    def _uuid(self):
        self.next_uuid += 1
        return self.next_uuid

    def process(self, pid, name, sort_index, rank, description):
        uuid = self.proc_uuid[pid] = self._uuid()
        d = self._packet().track_descriptor
        d.uuid = uuid
        d.process.pid = pid
        d.process.process_name = name
        if rank is not None:
            d.process.process_labels.append(f"rank {rank}")
        d.sibling_order_rank = sort_index
        d.child_ordering = self.pb.TrackDescriptor.EXPLICIT
        if description:
            d.description = description
        self.children[pid] = 0

    def _child(self, pid, name, rank=None):
        uuid = self._uuid()
        d = self._packet().track_descriptor
        d.uuid = uuid
        d.parent_uuid = self.proc_uuid[pid]
        d.name = name
        if rank is None:
            rank = self.children[pid]
            self.children[pid] += 1
        d.sibling_order_rank = rank
        return uuid, d

    def track(self, pid, name, lane=None, first=False):
        """A slice track under the node's process. The lanes of one laned track (lane not None) share
        its name and a merge key, so the UI draws them as one track with rows; first: above the rest (a
        number above 1: that many places down among the first ones)."""
        uuid, d = self._child(pid, name, rank=FIRST_RANK + max(0, int(first) - 1) if first else None)
        if lane is not None:
            d.sibling_merge_behavior = self.pb.TrackDescriptor.SIBLING_MERGE_BEHAVIOR_BY_SIBLING_MERGE_KEY
            d.sibling_merge_key = name
        return uuid

    def counter_track(self, pid, name, unit):
        """Counters come right after the findings, before the slice tracks, in the order they are made."""
        self.counters_made[pid] = self.counters_made.get(pid, 0) + 1
        uuid, d = self._child(pid, name, rank=COUNTER_RANK + self.counters_made[pid])
        CD = self.pb.CounterDescriptor
        if unit == "count":
            d.counter.unit = CD.UNIT_COUNT
        elif unit == "bytes":
            d.counter.unit = CD.UNIT_SIZE_BYTES
        else:
            d.counter.unit_name = unit
        return uuid

    # ---- events

    def slice(self, track, t, dur, name, cat, args):
        """BEGIN now; the ENDs of this track's open slices that end by t first (the hot path: inlined)."""
        stack = self.open.get(track)
        if stack is None:
            stack = self.open[track] = []
        elif stack and stack[-1] <= t:
            end = self.templates.get((self.END, track, None, None)) or self._end_template(track)
            while stack and stack[-1] <= t:
                self._from_template(end, stack.pop())
        stack.append(t + dur)
        tpl = self.templates.get((self.BEGIN, track, name, cat))
        if tpl is None:
            self._event(t, self.BEGIN, track, name, cat, args)
            return
        p = self._from_template(tpl, t)
        if args:
            add, names = p.track_event.debug_annotations.add, self.ann_names
            for key, value in args:
                iid = names.get(key)
                a = add()
                if iid is not None and type(value) is int:
                    a.name_iid = iid
                    a.int_value = value
                else:
                    self._annotate(p, a, key, value)

    def _end_template(self, track):
        tpl = self.templates[(self.END, track, None, None)] = self._template(None, self.END, track)
        return tpl

    def track_done(self, track):
        stack = self.open.pop(track, None) or []
        while stack:
            self._event(stack.pop(), self.END, track)

    def counters(self, tracks_values, t):
        for track, value in tracks_values:
            e = self._event(t, self.COUNTER, track).track_event
            if isinstance(value, float):
                e.double_counter_value = value
            else:
                e.counter_value = int(value)

    def instant(self, track, t, name, cat, args):
        if track is None:
            if self.global_track is None:
                self.global_track = self._uuid()
                d = self._packet().track_descriptor
                d.uuid = self.global_track
                d.name = "findings (explain, cluster)"
            track = self.global_track
        self._event(t, self.INSTANT, track, name, cat, args)

    def close(self, meta):
        """Close every open slice, write the metadata (when given) and flush."""
        for track in list(self.open):
            self.track_done(track)
        if meta is not None:
            p = self._packet()
            m = p.chrome_events.metadata.add()
            m.name = "straggler"
            m.string_value = json.dumps(meta, default=str, sort_keys=True)
        self._flush()

    def flush(self):
        self._flush()

    @property
    def records(self):
        return self.events


def iter_packets(path):
    """Every TracePacket of a .pftrace file, compressed batches opened in place (for tests and tools)."""
    pb, _ = require()
    with open(path, "rb") as fh:
        data = fh.read()
    trace = pb.Trace()
    trace.ParseFromString(data)
    for packet in trace.packet:
        if packet.HasField("compressed_packets"):
            inner = pb.Trace()
            inner.ParseFromString(zlib.decompress(packet.compressed_packets))
            yield from inner.packet
        else:
            yield packet
