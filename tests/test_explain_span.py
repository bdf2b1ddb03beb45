"""`straggler explain --since/--until`: the span judged, on the fleet's timeline (the report's, UTC),
each node cut at that time through its own clock. On synthetic stores of a whole job
(straggler_lab.series) with two faults at different times.

What a user would notice: a cut after the first fault names only the second, a cut before the second
only the first; an ISO time and seconds from the trace's start are the same cut; in a merged store of
machines whose monotonic clocks are weeks apart, one bound falls at the same wall time on every node; a
node without clock pairs is said once; a bound that does not read, a reversed span or one that holds
nothing fails in one line with exit status 2, from the real command line.
"""
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from straggler.analysis import explain
from straggler.durations import parse_time_bound
from straggler.errors import UsageError
from straggler_lab import series

S = 1_000_000_000
DAY_S = 86400
START = "2026-01-01T00:00:00"          # straggler_lab.synth.REFERENCE_T0_NS: where every series starts
# two faults: a CPU hog on gpu-node-02 early, host compute on gpu-node-03 late
TWO_FAULTS = [series.Fault(node=1, start_s=150, end_s=200, kind="cpu", slow=2.0),
              series.Fault(node=2, start_s=400, end_s=450, kind="host", slow=2.0)]


def straggler_cli():
    venv = Path(sys.executable).parent / "straggler"
    return [str(venv)] if venv.exists() else [sys.executable, "-m", "straggler.cli"]


@pytest.fixture(scope="module")
def two_faults(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("span") / "cluster.db")
    facts = series.write_cluster(path, series.SeriesSpec(nodes=4, seconds=600, faults=TWO_FAULTS))
    return path, facts


@pytest.fixture(scope="module")
def far_clocks(tmp_path_factory):
    """Two machines booted 40 days apart (monotonic clocks ~3.4e15 ns apart), the second's realtime 7.5 s
    ahead (its merge offset takes it out): a CPU hog on gpu-node-02 early, host compute on gpu-node-01 late."""
    path = str(tmp_path_factory.mktemp("far") / "cluster.db")
    series.write_cluster(path, series.SeriesSpec(
        nodes=2, seconds=600, boot_s=(3 * 3600, 40 * DAY_S), realtime_error_s=(0.0, 7.5),
        faults=[series.Fault(node=1, start_s=100, end_s=160, kind="cpu", slow=2.0),
                series.Fault(node=0, start_s=400, end_s=460, kind="host", slow=2.0)]))
    return path


def episodes_of(report):
    return [(e["node"], e["start_ns"], e["end_ns"]) for e in report.episodes]


def near(ns, fault_ns):
    return abs(ns - fault_ns) <= 2 * S


def test_the_whole_trace_names_both_faults(two_faults):
    path, facts = two_faults
    report = explain.explain_db(path)
    assert sorted(report.stragglers) == ["gpu-node-02", "gpu-node-03"], episodes_of(report)
    assert report.span is None


def test_since_after_the_first_fault_names_only_the_second(two_faults):
    path, facts = two_faults
    report = explain.explain_db(path, since="300")
    assert report.stragglers == ["gpu-node-03"], episodes_of(report)
    (e,) = report.episodes
    assert near(e["start_ns"], facts["faults"][1]["start_ns"]) and near(e["end_ns"], facts["faults"][1]["end_ns"])
    # the header's span is the cut: from 00:05:00 to the trace's end
    assert report.timeline["start"].startswith("2026-01-01T00:05:00") and report.timeline["end"].startswith(
        "2026-01-01T00:10:00")
    assert report.span["since"].startswith("2026-01-01T00:05:00") and report.span["until"] is None


def test_until_before_the_second_fault_names_only_the_first(two_faults):
    path, facts = two_faults
    report = explain.explain_db(path, until=300)
    assert report.stragglers == ["gpu-node-02"], episodes_of(report)
    (e,) = report.episodes
    assert near(e["start_ns"], facts["faults"][0]["start_ns"]) and near(e["end_ns"], facts["faults"][0]["end_ns"])
    assert report.timeline["end"].startswith("2026-01-01T00:05:00")


def test_a_fixed_window_is_cut_too(two_faults):
    """One fixed window within the span: its second half (--baseline-fraction 0.5) or its last 50 s (--last)
    is judged; over 100-200 s that is the first fault, over 350-450 s the second."""
    path, _ = two_faults
    assert explain.explain_db(path, baseline_fraction=0.5, since="100", until="200").stragglers == ["gpu-node-02"]
    assert explain.explain_db(path, baseline_fraction=0.5, since="350", until="450").stragglers == ["gpu-node-03"]
    assert explain.explain_db(path, recent_s=50, until="200").stragglers == ["gpu-node-02"]
    assert explain.explain_db(path, recent_s=50).straggler is None       # the trace's last 50 s are clean


@pytest.mark.parametrize("since", ["300s", 300, 300.0, f"{START[:-5]}05:00", f"{START[:-5]}05:00Z",
                                   "2026-01-01T01:05:00+01:00", "2026-01-01 00:05:00.000"])
def test_an_iso_time_and_seconds_from_the_start_are_the_same_cut(two_faults, since):
    path, _ = two_faults
    by_seconds = explain.explain_db(path, since="300", until="540")
    other = explain.explain_db(path, since=since, until=f"{START[:-5]}09:00")
    assert other.span["since_ns"] == by_seconds.span["since_ns"] == parse_time_bound(START + "Z", 0) + 300 * S
    assert other.span["until_ns"] == by_seconds.span["until_ns"]
    assert episodes_of(other) == episodes_of(by_seconds) and other.stragglers == ["gpu-node-03"]


def test_one_bound_falls_at_the_same_wall_time_on_nodes_whose_clocks_are_weeks_apart(far_clocks):
    report = explain.explain_db(far_clocks, since="300")
    assert report.stragglers == ["gpu-node-01"], episodes_of(report)
    late = explain.explain_db(far_clocks, until="2026-01-01T00:05:00")
    assert late.stragglers == ["gpu-node-02"], episodes_of(late)
    # the series explain read (its SQL, as the report gives it): both nodes from bin 0, i.e. 00:05:00
    conn = sqlite3.connect(far_clocks)
    try:
        cursor = conn.execute(report.timeline["sql"])
        columns = [d[0] for d in cursor.description]
        rows = [dict(zip(columns, r)) for r in cursor.fetchall()]
    finally:
        conn.close()
    first_bin = {}
    for r in rows:
        first_bin[r["node"]] = min(first_bin.get(r["node"], 1 << 60), r["bin"])
    assert first_bin == {"gpu-node-01": 0, "gpu-node-02": 0}
    assert report.timeline["start"].startswith("2026-01-01T00:05:00")
    # each node's own bounds differ by the clocks' distance (40 days less 3 h, less the 7.5 s its realtime is ahead)
    nodes = report.span["nodes"]
    assert nodes["gpu-node-02"]["lo_ns"] - nodes["gpu-node-01"]["lo_ns"] == (40 * DAY_S - 3 * 3600) * S


def test_live_on_the_fleet_each_agent_cuts_its_own_store_at_the_same_wall_time(tmp_path):
    """Two real `straggler serve` (plain HTTP on loopback, in this process) over each node's own store,
    their machines booted 40 days apart: --since asked live cuts both at 00:05:00."""
    from straggler.api.server import start_background
    from straggler.tls import TLSOptions
    facts = series.write_nodes(str(tmp_path), series.SeriesSpec(
        nodes=2, seconds=600, boot_s=(3 * 3600, 40 * DAY_S),
        faults=[series.Fault(node=1, start_s=100, end_s=160, kind="cpu", slow=2.0),
                series.Fault(node=0, start_s=400, end_s=460, kind="host", slow=2.0)]))
    tls = TLSOptions(no_tls=True)
    handles = [start_background(f["path"], node=f["node"], listen="127.0.0.1:0", tls=tls) for f in facts["files"]]
    try:
        nodes = [f"127.0.0.1:{h.port}" for h in handles]
        everything = explain.explain_fleet(nodes, tls)
        report = explain.explain_fleet(nodes, tls, since="2026-01-01T00:05:00")
    finally:
        for h in handles:
            h.stop()
    assert sorted(everything.stragglers) == ["gpu-node-01", "gpu-node-02"], episodes_of(everything)
    assert report.stragglers == ["gpu-node-01"] and not report.missing, episodes_of(report)
    assert report.timeline["start"].startswith("2026-01-01T00:05:00")


def test_what_a_gpu_said_after_until_is_no_evidence_of_the_span(tmp_path):
    """A GPU throttled after --until (the ranks' series agree: 400-450 s) is not in a report of 0-300 s."""
    path = str(tmp_path / "cluster.db")
    series.write_cluster(path, series.SeriesSpec(nodes=4, seconds=600, gpus=True, faults=[
        series.Fault(node=1, start_s=400, end_s=450, kind="gpu", slow=2.0, device="throttle")]))
    assert explain.explain_db(path).stragglers == ["gpu-node-02"]
    report = explain.explain_db(path, until="300")
    assert report.straggler is None and not report.episodes
    assert not [f.summary for f in report.findings if "GPU" in f.summary], [f.summary for f in report.findings]


def test_a_node_without_clock_pairs_is_cut_on_its_own_clock_and_said_once(tmp_path):
    path = str(tmp_path / "cluster.db")
    series.write_cluster(path, series.SeriesSpec(nodes=4, seconds=600, faults=TWO_FAULTS, no_clock_pairs=(1,)))
    report = explain.explain_db(path, since="300")
    assert report.stragglers == ["gpu-node-03"], episodes_of(report)
    said = [f for f in report.findings if f.cause == "unaligned-clock"]
    assert len(said) == 1 and "gpu-node-02" in said[0].summary and said[0].severity == "warning"
    assert report.span["unaligned"] == ["gpu-node-02"]
    # without a cut nothing is said about it here
    assert not [f for f in explain.explain_db(path).findings if f.cause == "unaligned-clock"]


def test_an_iso_time_needs_clock_pairs(tmp_path):
    path = str(tmp_path / "cluster.db")
    series.write_cluster(path, series.SeriesSpec(nodes=3, seconds=300, no_clock_pairs=(0, 1, 2)))
    with pytest.raises(UsageError, match="clock pairs.*seconds from the trace's start"):
        explain.explain_db(path, since="2026-01-01T00:01:00")
    report = explain.explain_db(path, since="60")       # seconds still work: each node from its own start
    assert report.span["since"].startswith("+60.000 s")


@pytest.mark.parametrize("bounds, says", [
    (["--since", "yesterday"], "--since 'yesterday': expected seconds from the trace's start"),
    (["--until", "inf"], "--until 'inf': expected"),
    (["--since", "400", "--until", "300"], "is not before --until"),
    (["--since", "2026-01-01T00:04:00", "--until", "240"], "is not before --until"),
    (["--since", "5000"], "no rank's calls from 2026-01-01T01:23:20.000+00:00 to its end"),
    (["--since", "2025-06-01T00:00:00", "--until", "2025-06-01T01:00:00"], "the trace runs from 2026-01-01T00:00:00.000+00:00 to 2026-01-01T00:10:00.000+00:00"),
])
def test_bad_bounds_fail_in_one_line_with_exit_status_2(two_faults, bounds, says):
    path, _ = two_faults
    proc = subprocess.run([*straggler_cli(), "explain", "-d", path, *bounds], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_the_command_line_reports_the_span_it_judged(two_faults):
    path, _ = two_faults
    proc = subprocess.run([*straggler_cli(), "explain", "-d", path, "--since", "300", "--json"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["straggler"] == "gpu-node-03" and report["span"]["since"].startswith("2026-01-01T00:05:00")
    assert report["options"]["since"] == "300"
    text = subprocess.run([*straggler_cli(), "explain", "-d", path, "--since", "300", "--no-sql"],
                          capture_output=True, text=True, timeout=300)
    assert "span judged (--since/--until): 2026-01-01 00:05:00 UTC → its end" in text.stdout, text.stdout


def test_export_reads_a_bound_by_the_same_rule():
    """One rule (straggler.durations.parse_time_bound) for export's and explain's --since/--until."""
    start = 1_000 * S
    assert parse_time_bound("30", start) == parse_time_bound("30s", start) == parse_time_bound(30, start) == start + 30 * S
    assert parse_time_bound("1.5", start) == start + 1_500_000_000
    assert parse_time_bound("2026-01-01T00:00:30", start) == parse_time_bound("2026-01-01T00:00:30Z", start)
    assert parse_time_bound(None, start) is None
    for bad in ("yesterday", "nan", "inf", True, "5m"):
        with pytest.raises(UsageError):
            parse_time_bound(bad, start, "--since")
    from straggler.analysis import export
    assert export.parse_time_bound is parse_time_bound
