"""explain over synthetic four-node databases (straggler_lab.synth: per-node stores with the
agent's thread_time summaries, merged with the real merge): the straggler is named by who waits
least, its numbers equal their own SQL re-run, a clean run has no straggler, missing nodes are said,
the renderers and the fleet paths work. The cause classes are tested on real jobs with real faults
(tests/test_diagnosis.py) and the rules on small tables (tests/test_explain_model.py).

The databases come from straggler_lab.synth (per-node stores as the agent writes them,
merged with the real merge). Sizes are small: the whole file runs in a few seconds of CPU.
"""
import json
import sqlite3
import xml.etree.ElementTree as ET

import pytest

from straggler import cli
from straggler.analysis import explain
from straggler.render.report import to_text
from straggler_lab import synth

EVENTS = 16_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """scenario name -> (cluster.db path, truth)."""
    base = tmp_path_factory.mktemp("explain")
    out = {}
    for name, spec in {
        "io_cpu": synth.SynthSpec(scenario="io_cpu", events=EVENTS, straggler=2),
        "cpu_hog": synth.SynthSpec(scenario="cpu_hog", events=EVENTS, straggler=1),
        "clean": synth.SynthSpec(scenario="clean", events=EVENTS),
        "missing_other": synth.SynthSpec(scenario="io_cpu", events=EVENTS, straggler=2, missing=(3,)),
        "missing_straggler": synth.SynthSpec(scenario="io_cpu", events=EVENTS, straggler=2, missing=(2,)),
    }.items():
        path = str(base / f"{name}.db")
        out[name] = (path, synth.write_cluster(path, spec))
    return out


def _by_cause(report, cause):
    return [f for f in report.findings if f.cause == cause]


def _rows(db, sql):
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(sql)]
    finally:
        conn.close()


def test_the_straggler_is_the_rank_that_waits_least_and_the_writer_is_named(cluster):
    db, truth = cluster["io_cpu"]
    report = explain.explain_db(db)
    assert report.straggler == truth["straggler"] == "gpu-node-03"
    top = report.findings[0]
    assert top.cause == "straggler" and top.node == "gpu-node-03" and top.severity == "critical"
    assert "waits least for its peers" in top.summary
    assert top.numbers["wait_pct"] < top.numbers["others_median_wait_pct"]
    cpu = _by_cause(report, "cpu-contention")
    assert cpu and cpu[0].node == "gpu-node-03"
    assert "ckpt-writer (pid 5152" in cpu[0].summary          # named by process, threads grouped
    waiters = _by_cause(report, "waiters")
    assert waiters and "gpu-node-01" in waiters[0].summary
    assert not any(f.cause not in ("waiters", "no-straggler") and f.node not in (None, "gpu-node-03")
                   for f in report.findings)


def test_a_cpu_hog_case_names_its_node(cluster):
    db, truth = cluster["cpu_hog"]
    report = explain.explain_db(db)
    assert report.straggler == truth["straggler"] == "gpu-node-02"
    assert any("cpu-hog" in f.summary for f in _by_cause(report, "cpu-contention"))


def test_every_number_with_a_source_equals_its_own_sql_rerun(cluster):
    db, _ = cluster["io_cpu"]
    report = explain.explain_db(db)
    checked = 0
    for finding in report.findings:
        for name, src in finding.sources.items():
            rows = _rows(db, finding.sql[src["sql"]])
            hits = [r for r in rows if all(r.get(k) == v for k, v in src["match"].items())]
            assert hits, (name, src)
            value = sum(r[src["column"]] for r in hits) if src.get("sum") else hits[0][src["column"]]
            assert value == pytest.approx(finding.numbers[name]), (finding.cause, name)
            checked += 1
    assert checked >= 3


def test_the_wait_share_matches_direct_sql_over_thread_time(cluster):
    db, truth = cluster["io_cpu"]
    report = explain.explain_db(db)
    row = next(n for n in report.nodes if n["node"] == truth["straggler"])
    top = report.findings[0]
    # recomputed here from the raw table: the calling thread's collective + blocked + sync time over the recent part
    wall = top.numbers["wall_ns"]
    node = truth["straggler"]
    last = _rows(db, f"SELECT MAX(ts) AS t FROM thread_time WHERE node = '{node}'")[0]["t"]   # a partial last second
    window = f"node = '{node}' AND ts >= {last - wall} AND ts < {last}"
    raw = _rows(db, f"SELECT SUM(coll_ns - runq_coll_ns) AS coll, SUM(blocked_ns) AS blocked, "
                    f"SUM(sync_ns - runq_sync_ns) AS sync FROM thread_time WHERE {window} AND tid = 4242")[0]
    helpers = _rows(db, f"SELECT SUM(runq_ns) AS r FROM thread_time WHERE {window} AND tid != 4242")[0]["r"]
    waited = raw["coll"] + raw["blocked"]
    parts = waited - min(helpers, waited) + (raw["sync"] if "synchronize" in top.summary else 0)
    assert row["wait_pct"] == pytest.approx(100.0 * parts / wall, abs=0.3)


def test_a_clean_run_has_no_straggler(cluster):
    db, _ = cluster["clean"]
    report = explain.explain_db(db)
    assert report.straggler is None
    assert [f.cause for f in report.findings] == ["no-straggler"]


def test_a_missing_healthy_node_is_stated_and_the_straggler_still_named(cluster):
    db, truth = cluster["missing_other"]
    report = explain.explain_db(db)
    assert report.straggler == "gpu-node-03"
    missing = _by_cause(report, "missing-nodes")
    assert missing and "rank 3" in missing[0].summary
    assert report.missing and report.missing[0]["status"] == "no-data"


def test_when_the_straggler_itself_is_missing_the_waiters_point_at_it(cluster):
    db, truth = cluster["missing_straggler"]
    report = explain.explain_db(db)
    assert report.straggler is None
    waiters = _by_cause(report, "waiters")
    assert waiters and "probably one of the missing nodes" in waiters[0].summary and "rank 2" in waiters[0].summary


def test_cli_json_markdown_junit_and_fail_on_straggler(cluster, tmp_path, capsys):
    db, _ = cluster["io_cpu"]
    md, xml = tmp_path / "r.md", tmp_path / "r.xml"
    code = cli.main(["explain", "-d", db, "--json", "--fail-on-straggler", "--markdown", str(md), "--junit", str(xml)])
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and out["straggler"] == "gpu-node-03" and out["stragglers"] == ["gpu-node-03"]
    assert out["findings"][0]["sql"]["threads"].lstrip().startswith("WITH")
    assert "gpu-node-03" in md.read_text() and "```sql" in md.read_text()
    suite = ET.parse(xml).getroot()
    failed = [tc.get("name") for tc in suite.iter("testcase") if tc.find("failure") is not None]
    assert failed == ["gpu-node-03 is not the straggler"]
    clean_db, _ = cluster["clean"]
    assert cli.main(["explain", "-d", clean_db, "--fail-on-straggler", "--no-sql"]) == 0
    assert "no straggler" in capsys.readouterr().out
    assert cli.main(["explain", "-d", str(tmp_path / "nope.db")]) == 2
    assert "no such database" in capsys.readouterr().err


def test_a_store_without_thread_time_gets_a_one_line_error(cluster, tmp_path, capsys):
    import shutil
    db = str(tmp_path / "old.db")
    shutil.copy(cluster["cpu_hog"][0], db)
    conn = sqlite3.connect(db)
    conn.execute("DROP TABLE thread_time")
    conn.commit()
    conn.close()
    assert cli.main(["explain", "-d", db]) == 2
    err = capsys.readouterr().err
    assert "no thread_time table" in err and len(err.strip().splitlines()) == 1


def test_min_gap_is_tunable_a_huge_gap_names_no_one(cluster):
    db, _ = cluster["io_cpu"]
    assert explain.explain_db(db, min_gap=0.99).straggler is None


def test_fleet_mode_runs_the_same_sql_on_every_node_and_states_the_unreachable(tmp_path):
    """explain_fleet with a fleet_query stand-in that runs each SQL on per-node stores (the real
    client is another part's); one node does not answer."""
    from types import SimpleNamespace
    from straggler.store.query import run_query
    facts = synth.write_nodes(str(tmp_path), synth.SynthSpec(scenario="io_cpu", events=EVENTS, nodes=5, straggler=1))
    stores = {f["node"]: f["path"] for f in facts["files"]}
    seen_sql = []

    def fake_fleet_query(nodes, sql, tls, limit=10000, timeout_s=5.0, deadline_s=15.0, **kw):
        seen_sql.append(sql)
        columns, rows, statuses = None, [], []
        for address in nodes:
            name = address.split(":")[0]
            if name == "gpu-node-05":
                statuses.append(SimpleNamespace(address=address, node=None, status="unreachable",
                                                message="connection timed out"))
                continue
            res = run_query(stores[name], sql, limit=limit, timeout_s=timeout_s)
            columns = ["node"] + res.columns      # the client's own node column first
            rows += [[name] + r for r in res.rows]
            statuses.append(SimpleNamespace(address=address, node=name, status="ok" if res.rows else "empty", message=""))
        return SimpleNamespace(columns=columns or [], rows=rows, nodes=statuses, offsets={})

    report = explain.explain_fleet([f"gpu-node-0{i}:7433" for i in range(1, 6)], tls=None,
                                   fleet_query=fake_fleet_query)
    assert report.straggler == "gpu-node-02"
    assert any("ckpt-writer" in f.summary for f in _by_cause(report, "cpu-contention"))
    missing = _by_cause(report, "missing-nodes")
    assert missing and "gpu-node-05:7433 (unreachable)" in missing[0].summary
    # every query is per node: grouped by node, or its rows carry their node
    assert all(("GROUP BY" in sql and "node" in sql) or "SELECT e.node" in sql or "pragma_table_list" in sql
               for sql in seen_sql)


def test_fleet_mode_through_the_real_client_and_agents_api(tmp_path):
    """Four real `straggler serve` servers (plain HTTP on loopback, in this process), a fifth address
    with nothing listening: explain_fleet names the straggler and says which node did not answer."""
    import socket
    from straggler.api.server import start_background
    from straggler.tls import TLSOptions
    facts = synth.write_nodes(str(tmp_path), synth.SynthSpec(scenario="io_cpu", events=EVENTS, straggler=3))
    tls = TLSOptions(no_tls=True)
    handles = [start_background(f["path"], node=f["node"], listen="127.0.0.1:0", tls=tls) for f in facts["files"]]
    with socket.socket() as s:                     # a port with nothing behind it
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    try:
        nodes = [f"127.0.0.1:{h.port}" for h in handles] + [f"127.0.0.1:{dead}"]
        report = explain.explain_fleet(nodes, tls)
    finally:
        for h in handles:
            h.stop()
    assert report.straggler == "gpu-node-04", to_text(report)
    assert any("ckpt-writer" in f.summary for f in _by_cause(report, "cpu-contention"))
    missing = _by_cause(report, "missing-nodes")
    assert missing and f"127.0.0.1:{dead}" in missing[0].summary


def test_the_straggler_finding_says_when_the_straggling_began(tmp_path):
    # the writer starts at 70% of the run: explain finds the episode where it begins, without being told
    db = str(tmp_path / "late.db")
    synth.write_cluster(db, synth.SynthSpec(scenario="io_cpu", events=60_000, straggler=1, interference_start=0.7))
    report = explain.explain_db(db)
    assert report.straggler == "gpu-node-02"
    conn = sqlite3.connect(db)
    began = conn.execute("SELECT MIN(ts) FROM events WHERE node = 'gpu-node-02' AND other_comm = 'ckpt-writer'").fetchone()[0]
    began_fleet = conn.execute("SELECT MIN(ts_aligned) FROM events WHERE node = 'gpu-node-02' "
                               "AND other_comm = 'ckpt-writer'").fetchone()[0]
    conn.close()
    found = [f for f in report.findings if f.node == "gpu-node-02" and f.cause != "data-loss"]
    assert found and {f.at_ns for f in found} == {found[0].at_ns}        # its causes share its time
    bin_ns = int(report.timeline["bin_s"] * 1e9)
    start, end = found[0].window_ns
    assert abs(start - began) <= 2 * bin_ns, (start - began) / 1e9        # the window is the episode's
    assert abs(found[0].at_ns - began) <= 2 * bin_ns, (found[0].at_ns - began) / 1e9
    episode = report.episodes[0]
    assert episode["node"] == "gpu-node-02" and abs(episode["start_ns"] - began_fleet) <= 2 * bin_ns
    assert found[0].to_dict()["at_ns"] == found[0].at_ns


def test_a_node_whose_calls_fail_gets_a_cuda_errors_finding_with_its_codes(cluster, tmp_path):
    # (real failing calls from NVIDIA's libraries: tests/test_nvidia_binaries.py; here the rule and its SQL)
    import shutil
    db = str(tmp_path / "errors.db")
    shutil.copy(cluster["io_cpu"][0], db)
    conn = sqlite3.connect(db)
    calls = conn.execute("SELECT COUNT(*) FROM events WHERE node = 'gpu-node-04' AND op = 'cuLaunchKernel'").fetchone()[0]
    conn.execute("UPDATE events SET ret = 719 WHERE node = 'gpu-node-04' AND op = 'cuLaunchKernel'")
    conn.execute("UPDATE events SET ret = 4 WHERE rowid IN (SELECT rowid FROM events WHERE node = 'gpu-node-04' "
                 "AND op = 'ncclAllReduce' LIMIT 3)")
    conn.commit()
    conn.close()
    report = explain.explain_db(db)
    assert report.straggler == "gpu-node-03"                      # the straggler is still named
    errors = [f for f in report.findings if f.cause == "cuda-errors"]
    assert [f.node for f in errors] == ["gpu-node-04"]
    f = errors[0]
    assert f.numbers["failed_calls"] == calls + 3 and f.numbers["failed.cuLaunchKernel.719"] == calls
    assert "cuLaunchKernel → 719 CUDA_ERROR_LAUNCH_FAILED" in f.summary and "ncclAllReduce → 4 ncclInvalidArgument ×3" in f.summary
    assert f.at_ns is not None and f.window_ns[0] == f.at_ns <= f.window_ns[1]
    for name, src in f.sources.items():                           # each number is its own SQL's
        hits = [r for r in _rows(db, f.sql[src["sql"]]) if all(r.get(k) == v for k, v in src["match"].items())]
        value = sum(r[src["column"]] for r in hits) if src.get("sum") else hits[0][src["column"]]
        assert value == f.numbers[name], name
    assert "cuda-errors" not in {x.cause for x in explain.explain_db(cluster["io_cpu"][0]).findings}


def _with_communicators(db, tmp_path, pairs):
    """A copy of a synthetic cluster whose ncclAllReduce rows run on NCCL communicators: the whole job's
    (every rank, made by ncclCommInitRank with one unique id), and the pair
    communicator each rank split off it (ncclCommSplit, color = its pair). Returns the copy's path."""
    import shutil
    copy = str(tmp_path / "comms.db")
    shutil.copy(db, copy)
    conn = sqlite3.connect(copy)
    nodes = [n for (n,) in conn.execute("SELECT DISTINCT node FROM events WHERE op = 'ncclAllReduce' ORDER BY node")]
    for i, node in enumerate(nodes):
        pid, rank, first = conn.execute("SELECT pid, rank, MIN(ts) FROM events WHERE node = ? AND op = 'ncclAllReduce'",
                                        (node,)).fetchone()
        world, pair = f"0x7f00{i}000", f"0x7f00{i}800"          # pointers: this process's own values
        conn.execute("INSERT INTO events (seq, node, rank, source, op, pid, tid, ts, duration, ret, detail) "
                     "VALUES (-1, ?, ?, 'nccl', 'ncclCommInitRank', ?, ?, ?, 900000000, 0, ?)",
                     (node, rank, pid, pid, first - 5_000_000_000,
                      json.dumps({"nranks": len(nodes), "rank": rank, "id": "0x00c0ffee00c0ffee", "comm": world,
                                  "why": ["setup"]})))
        conn.execute("INSERT INTO events (seq, node, rank, source, op, pid, tid, ts, duration, ret, detail) "
                     "VALUES (-2, ?, ?, 'nccl', 'ncclCommSplit', ?, ?, ?, 1000000, 0, ?)",
                     (node, rank, pid, pid, first - 4_000_000_000,
                      json.dumps({"color": pairs[node], "key": rank, "parent": world, "comm": pair, "why": ["setup"]})))
        conn.execute("UPDATE events SET detail = json_set(coalesce(detail, '{}'), '$.comm', "
                     "CASE WHEN (ts / 1000000000) % 2 = 0 THEN ? ELSE ? END) "
                     "WHERE node = ? AND op = 'ncclAllReduce'", (world, pair, node))
    conn.commit()
    conn.close()
    return copy


def test_collectives_are_grouped_per_communicator_across_nodes(cluster, tmp_path):
    db, truth = cluster["io_cpu"]
    pairs = {"gpu-node-01": 0, "gpu-node-02": 0, "gpu-node-03": 1, "gpu-node-04": 1}
    copy = _with_communicators(db, tmp_path, pairs)
    report = explain.explain_db(copy)
    assert report.straggler == truth["straggler"] == "gpu-node-03"
    (f,) = _by_cause(report, "communicators")
    assert f.node == "gpu-node-03"
    # the world communicator: matched across the four nodes by its id, though every process has its own pointer
    assert "communicator id 0x00c0ffee00c0ffee (4 of 4 ranks, made by ncclCommInitRank" in f.summary, f.summary
    # the pair split off it with color 1 holds gpu-node-03 and gpu-node-04 only
    assert "communicator id 0x00c0ffee00c0ffee / color 1 (2 ranks, made by ncclCommSplit: gpu-node-03 rank 2, " \
           "gpu-node-04 rank 3)" in f.summary, f.summary
    # it names the communicator of gpu-node-03's in which its peers spent the most time (median) waiting
    import statistics
    by_comm = {}
    for name, v in f.numbers.items():
        comm, node = name.split(".")[:2]
        by_comm.setdefault(comm, {})[node] = v
    waited = {c: statistics.median(v for n, v in nodes.items() if n != "gpu-node-03")
              for c, nodes in by_comm.items() if "gpu-node-03" in nodes}
    assert len(waited) == 2
    most = max(waited, key=waited.get)
    label = "id 0x00c0ffee00c0ffee / color 1 (2 ranks" if len(by_comm[most]) == 2 else "id 0x00c0ffee00c0ffee (4 of 4"
    assert f.summary.startswith(f"its peers wait for gpu-node-03 (rank 2) in communicator {label}"), (waited, f.summary)
    assert "/ color 0" in f.summary                              # the other pair is listed too
    # every number is its own SQL's
    for name, src in f.sources.items():
        hits = [r for r in _rows(copy, f.sql[src["sql"]]) if all(r.get(k) == v for k, v in src["match"].items())]
        assert hits, name
        assert sum(r[src["column"]] for r in hits) == f.numbers[name], name
    assert len(f.numbers) == 4 + 2 + 2
    # the straggler's own recorded collective time is the smallest in each of its communicators
    mine = {k: v for k, v in f.numbers.items() if ".gpu-node-03." in k}
    for k, v in mine.items():
        comm = k.split(".")[0]
        assert v < min(x for n, x in f.numbers.items() if n.startswith(comm + ".") and n != k), (k, f.numbers)


def test_communicators_without_a_traced_set_up_are_kept_per_process(cluster, tmp_path):
    db, _ = cluster["io_cpu"]
    copy = _with_communicators(db, tmp_path, {"gpu-node-01": 0, "gpu-node-02": 0, "gpu-node-03": 1, "gpu-node-04": 1})
    conn = sqlite3.connect(copy)
    conn.execute("DELETE FROM events WHERE op IN ('ncclCommInitRank', 'ncclCommSplit')")   # attached too late
    conn.commit()
    conn.close()
    report = explain.explain_db(copy)
    (f,) = _by_cause(report, "communicators")
    assert "its set-up was not traced" in f.summary and "cannot be matched" in f.summary
    assert "made by" not in f.summary
    assert "cuda-errors" not in {x.cause for x in report.findings}


def test_no_communicator_finding_without_nccl_communicators(cluster):
    db, _ = cluster["io_cpu"]
    assert "communicators" not in {f.cause for f in explain.explain_db(db).findings}


def test_no_communicator_is_named_when_the_peers_do_not_wait_inside_collectives(cluster, tmp_path):
    """Collectives that only enqueue (NCCL on GPUs) take microseconds on every rank: the wait is in
    synchronize, and the calls cannot tell which communicator holds the ranks; explain must not pick one."""
    db, _ = cluster["io_cpu"]
    copy = _with_communicators(db, tmp_path, {"gpu-node-01": 0, "gpu-node-02": 0, "gpu-node-03": 1, "gpu-node-04": 1})
    conn = sqlite3.connect(copy)
    conn.execute("UPDATE events SET duration = 20000 WHERE op = 'ncclAllReduce'")
    conn.commit()
    conn.close()
    report = explain.explain_db(copy)
    assert report.straggler == "gpu-node-03"
    (f,) = _by_cause(report, "communicators")
    assert not f.summary.startswith("its peers wait for"), f.summary
    assert "recorded collective time per communicator" in f.summary and "nothing to fix here" in f.recommendation
    assert "communicator id 0x00c0ffee00c0ffee / color 1 (2 ranks" in f.summary      # still listed


def test_a_thief_is_called_a_writer_only_for_its_io_in_the_recent_window():
    """A CPU thief that wrote only in the baseline (or a pid reused by a writer before), or a few KiB at its
    start-up, is not told to 'make the checkpoint asynchronous': its label and its recommendation agree
    on what it does now."""
    from straggler.analysis.explain import findings
    thief = ("process", 4242, {"cpuhog"})
    before = [{"pid": 4242, "part": "baseline", "bytes": 1 << 30}]
    now = before + [{"pid": 4242, "part": "recent", "bytes": 1 << 20}]
    startup = [{"pid": 4242, "part": "recent", "bytes": 4096}]          # a program's start-up, not a writer
    for rows in (before, startup):
        assert "a writer" not in findings._thief_label(*thief, rows)
        assert "it writes" not in findings._recommend_cpu(thief, rows)
    assert "a writer: 1.0 MiB" in findings._thief_label(*thief, now)
    assert "it writes" in findings._recommend_cpu(thief, now)


def _store_of(path, rows):
    """A store with the agent's schema holding these events (dicts of events' columns)."""
    from straggler.store import schema
    conn = sqlite3.connect(path)
    schema.create(conn)
    cols = sorted({c for r in rows for c in r})
    conn.executemany(f"INSERT INTO events ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})",
                     [tuple(r.get(c) for c in cols) for r in rows])
    conn.commit()
    conn.close()


def test_kernel_sizes_are_read_from_a_bounded_sample_spread_over_the_whole_window(tmp_path):
    """A long trace keeps every launch (--record-all): explain sizes each rank's kernels from a bounded sample
    (the first SIZE_PER_PIECE launches in time of each of SIZE_PIECES pieces of its window), taken across the
    window, not from its start: a rank whose batches grow half-way sizes at the mean of both halves; launches
    through both APIs (the runtime's and the driver's) count alike. Launches without their dimensions count
    toward the bound but not as sized. A window of many segments is cut in no more pieces, and a short one
    of few is sampled too."""
    from straggler.analysis.explain import sql
    from straggler.analysis.explain.windows import Window
    rows, seq, n = [], 0, 20_000
    for node, grids in (("a", (100, 300)), ("b", (100, 100)), ("c", None)):
        for i in range(n):
            seq += 1
            if grids is None:                       # two APIs in turn: 300 on the runtime's, 100 on the driver's
                source, op, grid = ("cuda", "cudaLaunchKernel", 300) if i % 2 else ("driver", "cuLaunchKernel", 100)
            else:
                source, op, grid = "driver", "cuLaunchKernel", (grids[i >= n // 2] if i % 10 else 0)
            rows.append(dict(seq=seq, node=node, pid=7, tid=7, source=source, op=op, ts=i * 1000, grid_x=grid,
                             block_x=128))
    db = str(tmp_path / "sizes.db")
    _store_of(db, rows)
    windows = [Window(node, 7, (), ((0, n * 1000),)) for node in ("a", "b", "c")]
    got = {r["node"]: r for r in _rows(db, sql.launch_sizes(windows))}
    bound = sql.SIZE_PIECES * sql.SIZE_PER_PIECE
    for node in ("a", "b"):
        assert 0.85 * bound < got[node]["sized"] < bound, got[node]      # bounded; the unsized ones not counted
        assert got[node]["pieces"] == sql.SIZE_PIECES
    assert got["b"]["threads"] == 100 * 128 and got["b"]["threads_sq"] == (100 * 128) ** 2
    assert got["a"]["threads"] == 200 * 128                             # both halves, half each
    assert got["c"]["sized"] == bound and got["c"]["threads"] == 200 * 128      # both APIs
    many = Window("a", 7, (), tuple((k * 1000, k * 1000 + 500) for k in range(100)))    # 100 segments
    assert len(sql._pieces([many], sql.SIZE_PIECES)) <= sql.SIZE_PIECES
    # a short on-phase (the last, and latest) is sampled too, while there are pieces enough for every segment
    pieces = sql._pieces([Window("a", 7, (), ((0, 100), (200, 205)))], 4)
    assert len(pieces) <= 4 and (200, 205) in [(lo, hi) for _, _, lo, hi in pieces]


def test_the_bytes_of_collectives_count_only_calls_of_a_known_datatype(tmp_path):
    """Bytes per collective come from the one read of the recorded collectives (per communicator and op):
    count x the datatype's size, over the calls whose datatype has a size."""
    from straggler.analysis.explain import sql
    from straggler.analysis.explain.windows import Window
    from straggler.probes.symbols import COLLECTIVE_OPS
    rows = []
    for i in range(30):
        datatype = "float32" if i % 3 else "a-type-of-no-known-size"
        rows.append(dict(seq=i + 1, node="a", pid=7, tid=7, source="nccl", op="ncclAllReduce", ts=i * 1000,
                         duration=10, detail=json.dumps(dict(comm="0xc0", count=1024, datatype=datatype))))
    db = str(tmp_path / "bytes.db")
    _store_of(db, rows)
    (got,) = _rows(db, sql.comm_collectives([Window("a", 7, (), ((0, 30_000),))], COLLECTIVE_OPS))
    assert (got["communicator"], got["calls"], got["dur_ns"]) == ("0xc0", 30, 300)
    assert got["sized_calls"] == 20 and got["bytes"] == 20 * 1024 * 4
