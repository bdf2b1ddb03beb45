"""Read a .pftrace the way Trace Processor does, independently of the writer (agent/straggler/analysis/
export/pftrace.py): perfetto's own protobuf classes, compressed batches opened, interned names resolved per
sequence, each track's BEGIN/END pairs replayed on a stack. Used by the export tests and by the
tests that check the trace a real run (collect.yml, the demo) wrote."""
import json
import zlib

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb


class Replay:
    """A .pftrace read with perfetto's protobuf classes and replayed as Trace Processor would: interned
    names per sequence, BEGIN/END stacks per track."""

    def __init__(self, path):
        self.tracks, self.slices, self.instants, self.counters, self.meta = {}, [], [], [], None
        self.root = None
        self.clock_snapshot = None
        self.misnested = []
        names, cats, ann_names, ann_strings = {}, {}, {}, {}
        stacks, last_ts, self.backwards = {}, {}, []
        with open(path, "rb") as fh:
            outer = pb.Trace()
            outer.ParseFromString(fh.read())
        packets = []
        for p in outer.packet:
            if p.HasField("compressed_packets"):
                inner = pb.Trace()
                inner.ParseFromString(zlib.decompress(p.compressed_packets))
                packets.extend(inner.packet)
            else:
                packets.append(p)
        self.packet_count = len(packets)
        for p in packets:
            if p.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
                names, cats, ann_names, ann_strings = {}, {}, {}, {}
            if p.HasField("interned_data"):
                names.update({e.iid: e.name for e in p.interned_data.event_names})
                cats.update({e.iid: e.name for e in p.interned_data.event_categories})
                ann_names.update({e.iid: e.name for e in p.interned_data.debug_annotation_names})
                ann_strings.update({e.iid: e.str.decode() for e in p.interned_data.debug_annotation_string_values})
            if p.HasField("track_descriptor"):
                d = p.track_descriptor
                if d.uuid == 0:
                    self.root = d
                else:
                    self.tracks[d.uuid] = d
            if p.HasField("clock_snapshot"):
                self.clock_snapshot = p.clock_snapshot
            if p.HasField("chrome_events"):
                for m in p.chrome_events.metadata:
                    if m.name == "straggler":
                        self.meta = json.loads(m.string_value)
            if not p.HasField("track_event"):
                continue
            e = p.track_event
            if p.timestamp < last_ts.get(e.track_uuid, 0):
                self.backwards.append((e.track_uuid, p.timestamp))
            last_ts[e.track_uuid] = p.timestamp
            if p.sequence_flags and not p.sequence_flags & pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE:
                raise AssertionError("a track event that uses interned data must say so")
            name = names[e.name_iid] if e.HasField("name_iid") else e.name
            cat = [cats[i] for i in e.category_iids] + list(e.categories)
            args = {}
            for a in e.debug_annotations:
                key = ann_names[a.name_iid] if a.HasField("name_iid") else a.name
                which = a.WhichOneof("value")
                args[key] = ann_strings[a.string_value_iid] if which == "string_value_iid" else getattr(a, which)
            if e.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
                stacks.setdefault(e.track_uuid, []).append(dict(track=e.track_uuid, name=name, cat=cat, ts=p.timestamp,
                                                                args=args))
            elif e.type == pb.TrackEvent.TYPE_SLICE_END:
                top = stacks[e.track_uuid].pop()
                top["dur"] = p.timestamp - top["ts"]
                if top["dur"] < 0:
                    self.misnested.append(top)
                stack = stacks[e.track_uuid]
                if stack:
                    top["parent"] = stack[-1]
                self.slices.append(top)
            elif e.type == pb.TrackEvent.TYPE_INSTANT:
                self.instants.append(dict(track=e.track_uuid, name=name, ts=p.timestamp, args=args))
            elif e.type == pb.TrackEvent.TYPE_COUNTER:
                value = e.double_counter_value if e.HasField("double_counter_value") else e.counter_value
                self.counters.append(dict(track=e.track_uuid, ts=p.timestamp, value=value))
        self.unclosed = sum(len(s) for s in stacks.values())

    def processes(self):
        procs = [d for d in self.tracks.values() if d.HasField("process")]
        return sorted(procs, key=lambda d: d.sibling_order_rank)

    def node_of(self, uuid):
        d = self.tracks[uuid]
        while d.HasField("parent_uuid"):
            d = self.tracks[d.parent_uuid]
        return d.process.process_name.split()[0] if d.HasField("process") else None
