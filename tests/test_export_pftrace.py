"""export --format perfetto: Perfetto's native protobuf trace, read back here with the perfetto
package's own protobuf classes and an independent replay of its TrackEvents (interning, BEGIN/END
pairs per track): one process per node in rank order, every call exactly one slice on its thread's
track with its duration, proper nesting, findings as instants, counters, the clock alignment, the
cuts, parallel parts, and memory that does not grow with the trace (both formats)."""
import json
import os
import sqlite3
import subprocess
import sys

import pytest

from straggler import cli
from straggler_lab import synth
from straggler.analysis.explain.engine import N_SLICES
from straggler.analysis.export import ExportError, export_perfetto

pb = pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2",
                         reason="the perfetto package is not installed (make setup installs it)")
from pftrace_replay import Replay  # noqa: E402  (tests/pftrace_replay.py)
import export_cluster  # noqa: E402  (tests/export_cluster.py)
from export_cluster import SHIFT_NS  # noqa: E402



@pytest.fixture(scope="module")
def dbs(tmp_path_factory):
    base = tmp_path_factory.mktemp("pftrace")
    built = export_cluster.build(base)
    cluster, paths = built["cluster"], built["paths"]
    out = str(base / "trace.pftrace")
    summary = export_perfetto(cluster, out, jobs=1)
    return dict(built, out=out, summary=summary, trace=Replay(out))


def test_one_process_per_node_named_and_in_rank_order_with_its_clock(dbs):
    tr = dbs["trace"]
    assert tr.root is not None and tr.root.process_ordering == pb.TrackDescriptor.PROCESS_ORDERING_EXPLICIT
    procs = tr.processes()
    assert [d.process.process_name for d in procs] == [f"gpu-node-0{i + 1} (rank {i})" for i in range(4)]
    assert [list(d.process.process_labels) for d in procs] == [[f"rank {i}"] for i in range(4)]
    shifted = procs[2]
    assert "offset +250.000 ms" in shifted.description, shifted.description
    assert tr.meta["clocks"]["gpu-node-03"]["offset_ns"] == SHIFT_NS
    assert tr.meta["timeline"] == "ts_aligned"
    # every track is a child of one node's process, in explicit order: the findings, the counters, the rest
    children = [d for d in tr.tracks.values() if d.HasField("parent_uuid")]
    assert children and all(tr.tracks[d.parent_uuid].HasField("process") for d in children)
    assert all(d.process.HasField("pid") for d in procs) and procs[0].child_ordering == pb.TrackDescriptor.EXPLICIT
    mine = sorted((d for d in children if d.parent_uuid == shifted.uuid), key=lambda d: d.sibling_order_rank)
    kinds = ["findings" if d.name.startswith("findings") else "counter" if d.HasField("counter") else "slices"
             for d in mine]
    assert kinds[0] == "findings" and kinds.index("slices") > kinds.index("counter") and \
        "counter" not in kinds[kinds.index("slices"):], kinds
    assert len({d.sibling_order_rank for d in mine}) == len(mine)
    assert tr.unclosed == 0 and not tr.misnested
    # a clock snapshot says the trace's clock is realtime, one to one
    clocks = {c.clock_id: c.timestamp for c in tr.clock_snapshot.clocks}
    assert clocks[pb.BuiltinClock.Value("BUILTIN_CLOCK_REALTIME")] == clocks[pb.BuiltinClock.Value("BUILTIN_CLOCK_BOOTTIME")]


def test_every_call_is_exactly_one_slice_on_its_threads_track_with_its_duration(dbs):
    tr = dbs["trace"]
    conn = sqlite3.connect(dbs["cluster"])
    rows = conn.execute("""SELECT node, seq, op, tid, comm, ts_aligned, duration, source, ret FROM events
                           WHERE source IN ('cuda', 'driver', 'nccl')""").fetchall()
    conn.close()
    calls = {}
    for s in tr.slices:
        if s["cat"] and s["cat"][0] in ("cuda", "driver", "nccl"):
            key = (tr.node_of(s["track"]), s["args"]["seq"])
            assert key not in calls, f"two slices for the call {key}"
            calls[key] = s
    assert len(calls) == len(rows) > 1000
    for node, seq, op, tid, comm, ts, dur, source, ret in rows:
        s = calls[(node, seq)]
        assert (s["name"], s["ts"], s["dur"], s["cat"]) == (op, ts, dur, [source]), (node, seq)
        assert tr.tracks[s["track"]].name.startswith(f"{comm} {tid}")
        if ret is not None:
            assert s["args"]["ret"] == ret
    # the nested pair stays on one track (the inner one's parent is the outer), the overlapping call
    # goes to a lane of its own
    outer, inner, cross = (calls[("gpu-node-01", s)] for s in (90_000_001, 90_000_002, 90_000_003))
    assert inner["track"] == outer["track"] and inner["parent"] is outer
    lane, main = tr.tracks[cross["track"]], tr.tracks[outer["track"]]
    assert cross["track"] != outer["track"] and lane.name == main.name == "pt_main_thread 4242"
    assert lane.sibling_merge_key == main.sibling_merge_key == "pt_main_thread 4242"     # one track with rows in the UI
    assert lane.sibling_merge_behavior == pb.TrackDescriptor.SIBLING_MERGE_BEHAVIOR_BY_SIBLING_MERGE_KEY


def test_slices_nest_properly_on_every_track(dbs):
    assert not dbs["trace"].backwards        # each track's events come in time order, as its stack needs
    by_track = {}
    for s in dbs["trace"].slices:
        by_track.setdefault(s["track"], []).append((s["ts"], s["ts"] + s["dur"]))
    for track, spans in by_track.items():
        stack = []
        for start, end in sorted(spans, key=lambda x: (x[0], -x[1])):
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1], (track, start, end)
            stack.append(end)


def test_sched_io_counters_and_findings_are_there(dbs):
    tr = dbs["trace"]
    names = {d.name for d in tr.tracks.values()}
    assert {"pt_main_thread 4242 off-CPU", "pt_gloo 4243 run queue", "block I/O ckpt-writer 5151"} <= names
    assert any(s["name"] == "preempted by ckpt-writer" and "other_pid" in s["args"] for s in tr.slices)
    # counters: activity per node and the model's components per rank, as % of wall time
    counter_tracks = {u: d for u, d in tr.tracks.items() if d.HasField("counter")}
    by_name = {}
    for c in tr.counters:
        by_name.setdefault((tr.node_of(c["track"]), counter_tracks[c["track"]].name), []).append(c["value"])
    assert ("gpu-node-03", "calls/s") in by_name
    runq = by_name[("gpu-node-03", "rank 2 run queue %")]
    waits = by_name[("gpu-node-03", "rank 2 waiting for peers %")]
    assert runq and all(0 <= v <= 100 for v in runq + waits)
    other = by_name[("gpu-node-01", "rank 0 waiting for peers %")]
    # the straggler (node 3, its writer steals its CPU) waits less for its peers than a healthy node
    assert sum(waits) / len(waits) < sum(other) / len(other)
    # findings: instants on the straggler's findings track, at the time explain's evidence begins
    straggler = [i for i in tr.instants if i["args"].get("cause") == "straggler"]
    assert len(straggler) == 1 and straggler[0]["args"]["node"] == "gpu-node-03"
    assert tr.tracks[straggler[0]["track"]].name == "findings (explain)"
    assert tr.node_of(straggler[0]["track"]) == "gpu-node-03"
    assert "gpu-node-03" in straggler[0]["args"]["summary"]
    # ... where the writer began to take its CPU (the episode's start, to a summary interval: 1 s)
    began = min(s["ts"] for s in tr.slices if s["name"] == "preempted by ckpt-writer"
                and tr.node_of(s["track"]) == "gpu-node-03")
    tolerance_ns = max(straggler[0]["args"]["window_s"] * 1e9 / N_SLICES, 1e9)
    assert began - tolerance_ns <= straggler[0]["ts"] <= began + 2 * tolerance_ns, (straggler[0]["ts"] - began) / 1e9
    assert dbs["summary"]["straggler"] == tr.meta["straggler"] == "gpu-node-03"


def _content(trace):
    """What a user sees, independent of uuids and of which process wrote which part."""
    def where(uuid):
        return (trace.node_of(uuid) or "", trace.tracks[uuid].name, trace.tracks[uuid].sibling_order_rank)
    return dict(
        processes=[(d.process.process_name, d.process.pid, d.sibling_order_rank, d.description)
                   for d in trace.processes()],
        slices=sorted((where(s["track"]), s["name"], s["ts"], s["dur"], tuple(s["cat"]), sorted(s["args"].items()))
                      for s in trace.slices),
        instants=sorted((where(i["track"]), i["name"], i["ts"],
                         sorted(i["args"].items())) for i in trace.instants),
        counters=sorted((where(c["track"]), c["ts"], c["value"]) for c in trace.counters),
        meta={k: v for k, v in trace.meta.items()})


def test_a_parallel_export_holds_exactly_the_serial_one(dbs, tmp_path):
    out = tmp_path / "parallel.pftrace"
    summary = export_perfetto(dbs["cluster"], str(out), jobs=3)
    assert summary["jobs"] == 3 and dbs["summary"]["jobs"] == 1
    parallel = Replay(str(out))
    assert parallel.unclosed == 0 and not parallel.backwards and not parallel.misnested
    assert _content(parallel) == _content(dbs["trace"])
    assert {k: summary[k] for k in ("slices", "counters", "instants", "straggler")} == \
        {k: dbs["summary"][k] for k in ("slices", "counters", "instants", "straggler")}
    assert sorted(os.listdir(tmp_path)) == ["parallel.pftrace"]        # no part left behind


def test_a_node_shifted_by_a_known_offset_lands_where_it_should(dbs, tmp_path):
    def step0(trace):
        return {trace.node_of(s["track"]): s["ts"] for s in trace.slices
                if s["name"] == "cuMemAlloc" and s["args"].get("seq") == 0}
    assert set(step0(dbs["trace"]).values()) == {synth.REFERENCE_T0_NS}
    own = tmp_path / "own.pftrace"
    export_perfetto(dbs["paths"][2], str(own), findings=False)
    trace = Replay(str(own))
    assert trace.meta["timeline"] == "clock_pairs"
    assert step0(trace) == {"gpu-node-03": synth.REFERENCE_T0_NS + SHIFT_NS}


def test_around_findings_keeps_only_what_is_near_them_and_says_what_it_skipped(dbs, tmp_path, capsys):
    out = tmp_path / "cut.pftrace"
    assert cli.main(["export", "-d", dbs["cluster"], "-o", str(out), "--around-findings", "0.5"]) == 0
    printed = capsys.readouterr().out
    assert "skipped" in printed and "more than 0.5 s from a finding" in printed and "ui.perfetto.dev" in printed
    trace = Replay(str(out))
    times = [i["ts"] for i in trace.instants if "node" in i["args"]]
    assert times
    assert trace.slices and len(trace.slices) < len(dbs["trace"].slices)
    for s in trace.slices:
        if "episode" in s["cat"]:          # explain's episodes, like its findings, are kept whatever the cut
            continue
        assert any(s["ts"] <= t + 500_000_000 and s["ts"] + s["dur"] >= t - 500_000_000 for t in times), s
    skipped = trace.meta["skipped"]["more than 0.5 s from a finding"]
    assert skipped == len(dbs["trace"].slices) - len(trace.slices)
    # nodes and time bounds too, with the JSON format asked for by name
    two = tmp_path / "two.json"
    summary = export_perfetto(dbs["cluster"], str(two), nodes=["gpu-node-02"], since=0.5, findings=False)
    assert summary["format"] == "json" and summary["skipped"]["outside --since/--until"] > 0
    assert summary["skipped"]["other nodes (--node)"] > 0
    assert json.loads(two.read_text())["traceEvents"]


def test_bad_requests_get_one_line_and_leave_nothing(dbs, tmp_path):
    clean = export_perfetto(dbs["paths"][0], str(tmp_path / "clean.pftrace"), findings=False)
    assert clean["slices"] > 0
    for bad in (-1, float("inf"), "soon"):
        with pytest.raises(ExportError, match="--around-findings"):
            export_perfetto(dbs["cluster"], str(tmp_path / "x.pftrace"), around_findings=bad)
    with pytest.raises(ExportError, match="no finding lies within"):
        export_perfetto(dbs["cluster"], str(tmp_path / "x.pftrace"), around_findings=0.1, until=0)
    with pytest.raises(ExportError, match="--format"):
        export_perfetto(dbs["cluster"], str(tmp_path / "x.pftrace"), fmt="svg")
    assert sorted(os.listdir(tmp_path)) == ["clean.pftrace"]


def test_without_the_perfetto_package_the_error_says_how_to_get_it(dbs, tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "perfetto" or m.startswith("perfetto.")]:
        monkeypatch.setitem(sys.modules, name, None)             # as if it were not installed
    with pytest.raises(ExportError, match="pip install perfetto; or write Chrome JSON with --format json"):
        export_perfetto(dbs["cluster"], str(tmp_path / "x.pftrace"))
    assert not os.listdir(tmp_path)
    assert export_perfetto(dbs["paths"][1], str(tmp_path / "x.json"), findings=False)["format"] == "json"


def test_the_protobuf_is_much_smaller_than_the_json(dbs, tmp_path):
    js = export_perfetto(dbs["cluster"], str(tmp_path / "t.json"))
    assert js["slices"] == dbs["summary"]["slices"]
    assert dbs["summary"]["bytes"] * 5 <= js["bytes"], (dbs["summary"]["bytes"], js["bytes"])


PEAK = """
import resource, sys
from straggler.analysis.export import export_perfetto
export_perfetto(sys.argv[1], sys.argv[2], findings=False, jobs=1)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


@pytest.fixture(scope="module")
def short_and_long(tmp_path_factory):
    base = tmp_path_factory.mktemp("flat")
    dbs = {}
    for n in (25_000, 100_000):
        dbs[n] = str(base / f"n{n}.db")
        synth.write_node(dbs[n], synth.SynthSpec(scenario="clean", events=n * 4), 0)    # n events on this node
    return dbs


@pytest.mark.parametrize("ext", ["pftrace", "json"])
def test_memory_stays_flat_for_a_four_times_longer_store(short_and_long, tmp_path, ext):
    peaks = {}
    for n, db in short_and_long.items():
        out = subprocess.run([sys.executable, "-c", PEAK, db, str(tmp_path / f"n{n}.{ext}")], capture_output=True,
                             text=True, timeout=300, check=True)
        peaks[n] = int(out.stdout.split()[-1])                                        # KiB, a fresh process each
    # four times the events: peak RSS grows by less than 8 MiB (SQLite's sorter and cache, not the trace)
    assert peaks[100_000] - peaks[25_000] < 8 * 1024, peaks
