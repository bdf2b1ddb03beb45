"""export: Perfetto (Chrome Trace Event JSON) with valid events, properly nested tracks, names,
the aligned timeline (a node shifted by a known clock offset lands where it should), filters.
(That its memory does not grow with the trace: tests/test_export_pftrace.py, for both formats.)"""
import json
from decimal import Decimal

import pytest

from straggler import cli
from straggler_lab import synth
from straggler.analysis.export import ExportError, export_perfetto

import export_cluster  # tests/export_cluster.py
from export_cluster import SHIFT_NS



@pytest.fixture(scope="module")
def dbs(tmp_path_factory):
    base = tmp_path_factory.mktemp("export")
    built = export_cluster.build(base)
    cluster, paths = built["cluster"], built["paths"]
    return built


def _load(path):
    with open(path) as fh:
        return json.load(fh, parse_float=Decimal)


def test_every_event_has_valid_ph_ts_pid_tid(dbs, tmp_path):
    out = tmp_path / "t.json"
    summary = export_perfetto(dbs["cluster"], str(out))
    doc = _load(out)
    assert doc["displayTimeUnit"] == "ms"
    events = doc["traceEvents"]
    assert len(events) == summary["events"] > 1000
    for e in events:
        assert e["ph"] in {"X", "M", "C", "i"}, e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] != "M":
            assert isinstance(e["ts"], Decimal) and e["ts"] >= 0, e
        if e["ph"] == "X":
            assert e["dur"] >= 0 and e["name"]
    phases = {e["ph"] for e in events}
    assert phases == {"X", "M", "C", "i"}
    assert any(e["ph"] == "i" and "straggler" in e["name"] for e in events)


def test_slices_on_one_track_never_partially_overlap(dbs, tmp_path):
    out = tmp_path / "t.json"
    export_perfetto(dbs["cluster"], str(out), findings=False)
    events = _load(out)["traceEvents"]
    tracks = {}
    for e in events:
        if e["ph"] == "X":
            tracks.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"], e["name"]))
    for key, slices in tracks.items():
        stack = []
        for start, end, name in sorted(slices, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1], (key, name, start, end, stack[-1])
            stack.append(end)
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert "pt_main_thread 4242 · lane 2" in names          # the partially overlapping call went to a lane
    main = next(e["tid"] for e in events if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == 1
                and e["args"]["name"] == "pt_main_thread 4242")
    nested = [e for e in events if e["ph"] == "X" and e["pid"] == 1 and e.get("args", {}).get("seq") in (90_000_001, 90_000_002)]
    assert {e["tid"] for e in nested} == {main}              # the nested pair stays on one track


def test_process_and_thread_names_present_in_rank_order(dbs, tmp_path):
    out = tmp_path / "t.json"
    export_perfetto(dbs["cluster"], str(out), findings=False)
    events = _load(out)["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    sort = {e["pid"]: e["args"]["sort_index"] for e in events if e["ph"] == "M" and e["name"] == "process_sort_index"}
    assert [procs[p] for p in sorted(procs, key=sort.get)] == [f"gpu-node-0{i + 1} (rank {i})" for i in range(4)]
    threads = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    used = {(e["pid"], e["tid"]) for e in events if e["ph"] in ("X",)}
    assert used <= threads
    tnames = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"pt_main_thread 4242 off-CPU", "pt_gloo 4243 run queue", "block I/O ckpt-writer 5151"} <= tnames
    assert any(e["ph"] == "X" and e["name"] == "preempted by ckpt-writer" for e in events)


def _step0_starts(doc):
    """Absolute ns of each process's first cuMemAlloc (step 0, slot 0)."""
    start = doc["otherData"]["trace_start_ns"]
    procs = {e["pid"]: e["args"]["name"].split()[0] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    first = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "X" and e["name"] == "cuMemAlloc" and e["args"].get("seq") == 0:
            first[procs[e["pid"]]] = start + int(e["ts"] * 1000)
    return first


def test_a_node_shifted_by_a_known_offset_lands_where_it_should(dbs, tmp_path):
    # merged with the measured offsets: every node's step 0 at the reference start, to the ns
    out = tmp_path / "t.json"
    export_perfetto(dbs["cluster"], str(out), findings=False)
    assert set(_step0_starts(_load(out)).values()) == {synth.REFERENCE_T0_NS}
    # the shifted node's own store (no merge, no offset known): its own realtime, 250 ms ahead
    own = tmp_path / "own.json"
    export_perfetto(dbs["paths"][2], str(own), findings=False)
    doc = _load(own)
    assert doc["otherData"]["timeline"] == "clock_pairs"
    assert _step0_starts(doc) == {"gpu-node-03": synth.REFERENCE_T0_NS + SHIFT_NS}


def test_since_until_and_node_cut_the_trace(dbs, tmp_path, capsys):
    out = tmp_path / "t.json"
    assert cli.main(["export", "--format", "json", "-d", dbs["cluster"], "-o", str(out), "--node", "gpu-node-02",
                     "--since", "0.5", "--until", "1.0", "--no-findings"]) == 0
    assert "wrote" in capsys.readouterr().out
    events = _load(out)["traceEvents"]
    procs = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert procs == {"gpu-node-02 (rank 1)"}
    xs = [e for e in events if e["ph"] == "X"]
    assert xs and all(e["ts"] + e["dur"] >= Decimal(500_000) and e["ts"] <= Decimal(1_000_000) for e in xs)
    with pytest.raises(ExportError, match="not in"):
        export_perfetto(dbs["cluster"], str(tmp_path / "x.json"), nodes=["gpu-node-99"])


def test_episodes_are_slices_on_the_stragglers_process_and_gpus_are_counters(tmp_path):
    """explain's straggle episodes: one slice per episode on a track of its own on the straggler's
    process, where the episode is; the agent's GPU samples: a clock, temperature and power counter per GPU."""
    import sqlite3
    from straggler.analysis import explain
    db = str(tmp_path / "late.db")
    synth.write_cluster(db, synth.SynthSpec(scenario="io_cpu", events=60_000, straggler=1, interference_start=0.6))
    conn = sqlite3.connect(db)
    (t0,) = conn.execute("SELECT MIN(ts) FROM thread_time WHERE node = 'gpu-node-02'").fetchone()
    conn.executemany("INSERT INTO gpu_samples(node, ts, gpu, sm_clock_mhz, sm_clock_max_mhz, temperature_c, power_mw) "
                     "VALUES ('gpu-node-02', ?, 0, ?, 1980, 60, 300000)", [(t0 + (i + 1) * 10**9, 1980 - 10 * i) for i in range(5)])
    conn.commit()
    conn.close()
    (episode,) = explain.explain_db(db).episodes
    out = tmp_path / "t.json"
    summary = export_perfetto(db, str(out))
    events = _load(out)["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    procs = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    (slice_,) = [e for e in events if e.get("cat") == "episode"]
    assert names[(slice_["pid"], slice_["tid"])] == "findings (explain): straggle episodes"
    assert procs[slice_["pid"]].startswith("gpu-node-02")
    assert slice_["name"] == "straggler: " + max(episode["causes"], key=lambda c: c["share"])["cause"]
    assert float(slice_["args"]["slowdown"]) == episode["slowdown"]
    assert Decimal(slice_["ts"]) == Decimal(episode["start_ns"] - summary["trace_start_ns"]) / 1000
    assert Decimal(slice_["dur"]) == Decimal(episode["end_ns"] - episode["start_ns"]) / 1000
    counters = [e for e in events if e["ph"] == "C" and e["name"] == "GPU 0 SM clock"]
    assert len(counters) == 5 and procs[counters[0]["pid"]].startswith("gpu-node-02")
