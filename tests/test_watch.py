"""`straggler watch` and the agent's live surfaces (/api/v1/live, /metrics).

What a user would notice:
- on a real synchronous job (tests/test_diagnosis.py, which shares its agents) a fault started at
  T is named — right node, right cause — before T + 20 s, never before T, and its end is reported
  as a recovery while the job runs on;
- a dead agent is reported and the watch goes on naming the straggler from the others;
- one noisy poll never raises an alarm, a short gap never ends one (Tracker);
- /metrics parses with prometheus-client's own parser, needs a client certificate on the API port,
  and the plain metrics port refuses non-loopback addresses unless told otherwise.
"""
import http.client
import json
import select
import socket
import ssl
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from test_api_helpers import Pki

from straggler.analysis import watch
from straggler_lab import synth
from straggler.api import metrics
from straggler.api.server import start_background
from straggler.errors import StragglerError
from straggler.tls import TLSOptions, client_context

REPO = Path(__file__).resolve().parents[1]
STRAGGLER = str(REPO / ".venv" / "bin" / "straggler")


# ---------------------------------------------------------------- the Tracker (pure)

def V(node=None, cause=None, moved=True):
    return watch.LiveVerdict(straggler=node, cause=cause, rank=0 if node else None,
                             step_moved_s=3.0 if node and moved else None)


def feed_verdicts(tracker, verdicts):
    out = []
    for i, v in enumerate(verdicts):
        out += [(i, e["event"], e.get("node"), e.get("cause")) for e in tracker.verdict(v, now_mono_ns=(i + 1) * 10**9)]
    return out


def test_one_noisy_poll_raises_no_alarm_two_in_a_row_do():
    t = watch.Tracker(confirm=2, clear=3)
    assert feed_verdicts(t, [V(), V("a", "host-compute"), V(), V("b", "gpu-slow"), V()]) == []
    t = watch.Tracker(confirm=2, clear=3)
    assert feed_verdicts(t, [V(), V("a", "host-compute"), V("a", "host-compute")]) == [(2, "onset", "a", "host-compute")]


def test_the_slowest_rank_raises_no_alarm_while_the_step_time_did_not_move():
    t = watch.Tracker(confirm=2, clear=3)
    assert feed_verdicts(t, [V("a", "host-compute", moved=False)] * 5) == []
    assert feed_verdicts(t, [V("a", "host-compute")]) == [(0, "onset", "a", "host-compute")]


def test_a_short_gap_does_not_end_an_alarm_a_long_one_does():
    t = watch.Tracker(confirm=2, clear=3)
    seq = [V("a", "io-self")] * 2 + [V(), V()] + [V("a", "io-self")] + [V()] * 3
    assert feed_verdicts(t, seq) == [(1, "onset", "a", "io-self"), (7, "recovered", "a", "io-self")]


def test_no_recovery_while_the_episode_may_still_resume():
    """explain ends a run at the newest data at its first quiet bin; while a resumption would still be the
    same episode (may_resume) the fault has not ended, whatever the number of quiet polls."""
    t = watch.Tracker(confirm=2, clear=3)
    quiet = watch.LiveVerdict(may_resume=frozenset({"a"}))
    seq = [V("a", "cpu-contention")] * 2 + [quiet] * 6 + [V("a", "cpu-contention")] + [quiet] * 2 + [V()]
    assert feed_verdicts(t, seq) == [(1, "onset", "a", "cpu-contention"), (11, "recovered", "a", "cpu-contention")]
    t = watch.Tracker(confirm=2, clear=3, hold=8)     # an edge that stays open holds it a bounded time
    assert feed_verdicts(t, [V("a", "cpu-contention")] * 2 + [quiet] * 10) == [
        (1, "onset", "a", "cpu-contention"), (9, "recovered", "a", "cpu-contention")]


def test_a_cause_change_is_reported_once_it_holds():
    t = watch.Tracker(confirm=2, clear=3)
    seq = [V("a", "io-self")] * 2 + [V("a", "cpu-contention")] + [V("a", "io-self")] + [V("a", "cpu-contention")] * 2
    events = feed_verdicts(t, seq)
    assert events == [(1, "onset", "a", "io-self"), (5, "cause-change", "a", "cpu-contention")]


def test_another_node_taking_over_ends_the_first_and_starts_the_second():
    t = watch.Tracker(confirm=2, clear=5)
    events = feed_verdicts(t, [V("a", "gpu-slow")] * 2 + [V("b", "host-compute")] * 2)
    assert events == [(1, "onset", "a", "gpu-slow"), (3, "recovered", "a", "gpu-slow"), (3, "onset", "b", "host-compute")]


# ---------------------------------------------------------------- watch over real servers (synthetic stores)

EVENTS = 48000      # about 22 s of a synthetic job: a live watch judges a rank after window + 10 s


def _free_port():
    with socket.socket() as s:                      # a port with nothing behind it (yet)
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def late_hog_nodes(tmp_path):
    """A synthetic job of 4 nodes whose hog starts late on gpu-node-02, its times moved to now (the watch's
    window holds the hog, its baseline mostly does not)."""
    facts = synth.write_nodes(str(tmp_path), synth.SynthSpec(scenario="cpu_hog", events=EVENTS, straggler=1,
                                                             interference_start=0.7))
    synth.shift_to_now([f["path"] for f in facts["files"]])
    return facts


def test_a_dead_agent_is_reported_and_the_watch_goes_on_with_the_others(tmp_path):
    # the hog starts late in the synthetic job: the watch's window holds it, its baseline mostly does not
    facts = late_hog_nodes(tmp_path)
    tls = TLSOptions(no_tls=True)
    files = facts["files"]
    handles = [start_background(f["path"], node=f["node"], listen="127.0.0.1:0", tls=tls) for f in files[:3]]
    port = _free_port()                             # the fourth agent is a process of its own: it will die
    agent = subprocess.Popen([STRAGGLER, "serve", "--db", files[3]["path"], "--listen", f"127.0.0.1:{port}", "--no-tls"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        lines, deadline = [], time.monotonic() + 60
        while not any(" http://" in line for line in lines) and len(lines) < 10:
            ready, _, _ = select.select([agent.stderr], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, f"the agent did not say it was ready in 60 s: {lines}"
            lines.append(agent.stderr.readline())   # the --no-tls warning, a log line, then the ready line
        nodes = [f"127.0.0.1:{h.port}" for h in handles] + [f"127.0.0.1:{port}", f"127.0.0.1:{_free_port()}"]
        ticks = []

        def on_tick(verdict, feeds):
            ticks.append(verdict.straggler)
            if len(ticks) == 4:
                agent.kill()                        # an agent dies during the watch

        code, events = watch.watch(nodes, tls, interval_s=0.5, window_s=5, timeout_s=8, on_tick=on_tick)
    finally:
        agent.kill()
        agent.wait()
        for h in handles:
            h.stop()
    kinds = [(e["event"], e.get("node")) for e in events]
    assert ("lost", nodes[-1]) in kinds, kinds              # never answered: by its address
    assert ("lost", "gpu-node-04") in kinds, kinds          # died mid-watch: by its node name
    assert ("onset", "gpu-node-02") in kinds, kinds         # the straggler is named from the others
    assert len(ticks) >= 6 and ticks[-1] == "gpu-node-02", ticks    # polls went on after the death (at the 4th)
    assert code == 0 and events[-1]["event"] == "end"


def test_two_agents_answering_as_one_node_are_both_refused_and_the_watch_goes_on(tmp_path):
    """The identity rule of every path (fleet.combine): two addresses naming one node are each reported
    (lost, wrong-node, one line) and their rows left out; the straggler is named from the others."""
    facts = late_hog_nodes(tmp_path)
    tls = TLSOptions(no_tls=True)
    files = facts["files"]
    names = [f["node"] for f in files]
    names[3] = names[2]                              # the fourth agent answers as the third's node
    handles = [start_background(f["path"], node=name, listen="127.0.0.1:0", tls=tls) for f, name in zip(files, names)]
    try:
        nodes = [f"127.0.0.1:{h.port}" for h in handles]
        code, events = watch.watch(nodes, tls, interval_s=0.5, window_s=5, timeout_s=8)
    finally:
        for h in handles:
            h.stop()
    lost = [e for e in events if e["event"] == "lost"]
    assert sorted(e["address"] for e in lost) == sorted(nodes[2:]), events
    assert all(e["status"] == "wrong-node" and "all answered as node " + names[2] in e["message"] for e in lost), lost
    assert ("onset", "gpu-node-02") in [(e["event"], e.get("node")) for e in events], events
    assert code == 0


def test_a_job_that_has_ended_raises_no_alarm(tmp_path):
    """The stores of a finished job (their newest summaries minutes old on the node's clock) hold a
    straggler (the same job that raises an alarm when it runs now, above), but a live watch judges
    only ranks that are running. The job is placed on this machine's clock by construction (it ended
    five minutes ago), whatever the machine's uptime."""
    facts = synth.write_nodes(str(tmp_path), synth.SynthSpec(scenario="cpu_hog", events=EVENTS, straggler=1,
                                                             interference_start=0.7))
    synth.shift_to_now([f["path"] for f in facts["files"]], ahead_s=-300.0)
    tls = TLSOptions(no_tls=True)
    handles = [start_background(f["path"], node=f["node"], listen="127.0.0.1:0", tls=tls) for f in facts["files"]]
    ticks = []
    try:
        code, events = watch.watch([f"127.0.0.1:{h.port}" for h in handles], tls, interval_s=0.5, window_s=5,
                                   timeout_s=4, on_tick=lambda v, feeds: ticks.append((v.straggler, v.ranks)))
    finally:
        for h in handles:
            h.stop()
    assert ticks and all(t == (None, 0) for t in ticks), ticks
    assert [e["event"] for e in events] == ["start", "end"], events


def test_cli_until_straggler_exits_1_and_exec_gets_the_finding(tmp_path):
    """The command line: --until-straggler ends at the first onset with exit status 1 (for CI);
    --exec's command gets the finding as JSON on stdin and STRAGGLER_* in its environment. Lost
    events a node records reach the watch, even though their
    longer interval is written after the summaries the watch already has (and comes once)."""
    import sqlite3
    facts = late_hog_nodes(tmp_path)
    tls = TLSOptions(no_tls=True)
    handles = [start_background(f["path"], node=f["node"], listen="127.0.0.1:0", tls=tls) for f in facts["files"]]
    hook = tmp_path / "hook.out"
    try:
        proc = subprocess.run([STRAGGLER, "watch", "--no-tls", "--nodes", ",".join(f"127.0.0.1:{h.port}" for h in handles),
                               "--interval", "0.5", "--window", "5", "--timeout", "60", "--until-straggler",
                               "--exec", f'(cat; echo; echo "$STRAGGLER_NODE $STRAGGLER_CAUSE") > {hook}'],
                              capture_output=True, text=True, timeout=120)
    finally:
        for h in handles:
            h.stop()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "STRAGGLER gpu-node-02 rank 1: " in proc.stdout, proc.stdout
    cause = proc.stdout.split("STRAGGLER gpu-node-02 rank 1: ", 1)[1].split(" ", 1)[0]
    finding, env_line = hook.read_text().strip().splitlines()
    finding = json.loads(finding)
    assert finding["event"] == "onset" and finding["node"] == "gpu-node-02" and finding["cause"] == cause
    assert env_line == f"gpu-node-02 {cause}"
    # the lost events came through /api/v1/live into the watch's store
    from straggler.analysis.watch import NodeFeed
    from straggler.fleet.client import LiveFeed
    handle = start_background(facts["files"][0]["path"], listen="127.0.0.1:0", tls=tls)
    try:
        live, feed = LiveFeed(f"127.0.0.1:{handle.port}", tls), NodeFeed(address="n1")
        feed.apply(*live.get(feed.since_ns), horizon_ns=120 * 10**9)
        # after that poll the agent closes a 5 s interval that began 4 s before its newest summary
        conn = sqlite3.connect(facts["files"][0]["path"])
        (end,) = conn.execute("SELECT MAX(ts + interval_ns) FROM thread_time").fetchone()
        conn.execute("INSERT INTO lost_events(node, probe, ts, interval_ns, count) VALUES ('gpu-node-01', "
                     "'ringbuf:calls', ?, 5000000000, 17)", (end - 4_000_000_000,))
        conn.commit()
        conn.close()
        for _ in range(2):           # the next polls ask for what is new since the newest summary
            feed.apply(*live.get(feed.since_ns), horizon_ns=120 * 10**9)
        live.close()
    finally:
        handle.stop()
    assert [dict(zip(feed.columns["lost"], r))["count"] for r in feed.lost.values()] == [17]


def test_watch_with_no_agent_answering_fails_with_one_line(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    proc = subprocess.run([STRAGGLER, "watch", "--nodes", f"127.0.0.1:{dead}", "--no-tls", "--timeout", "3",
                           "--interval", "0.5", "--window", "2"], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    err = proc.stderr.strip().splitlines()
    assert err[-1].startswith("straggler watch: error: no agent answered"), proc.stderr
    assert "LOST 127.0.0.1" in proc.stdout


# ---------------------------------------------------------------- /metrics and /api/v1/live

@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_agent(certs, tmp_path_factory):
    out = tmp_path_factory.mktemp("metrics")
    facts = synth.write_nodes(str(out), synth.SynthSpec(scenario="cpu_hog", events=EVENTS, straggler=0, nodes=2))
    path = facts["files"][0]["path"]
    synth.shift_to_now(path, ahead_s=0)             # a job running now: /metrics shows running ranks only
    handle = start_background(path, node=None, listen="127.0.0.1:0", tls=certs.server("127.0.0.1"))
    handle.db = path
    yield handle
    handle.stop()


def test_metrics_parse_with_prometheus_clients_parser_and_carry_the_model(certs, tls_agent):
    from prometheus_client.parser import text_string_to_metric_families
    conn = http.client.HTTPSConnection("127.0.0.1", tls_agent.port, context=client_context(certs.client()), timeout=10)
    conn.request("GET", "/metrics")
    response = conn.getresponse()
    body = response.read().decode()
    assert response.status == 200 and response.getheader("Content-Type").startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(body)}
    wait = {s.labels["wait"]: s.value for s in families["straggler_rank_wait_ratio"].samples}
    assert set(wait) == {"blocking", "enqueue"} and all(0 <= v <= 1 for v in wait.values())
    components = {s.labels["component"]: s.value for s in families["straggler_rank_component_ratio"].samples}
    assert set(components) == {"work", "sync", "coll", "runq", "io", "blocked", "host"}
    assert abs(sum(components.values()) - 1.0) < 0.02, components    # exclusive parts of the wall time
    # the synthetic straggler is CPU-starved by a hog: its top thief is named
    thieves = families["straggler_rank_runq_thief_ratio"].samples
    assert thieves and thieves[0].labels["thief"] and thieves[0].value > 0
    assert "straggler_agent_cpu_ratio" in families and "straggler_lost_events" in families


def test_metrics_of_a_job_that_ended_have_no_rank_series(tmp_path):
    from prometheus_client.parser import text_string_to_metric_families
    facts = synth.write_nodes(str(tmp_path), synth.SynthSpec(scenario="cpu_hog", events=EVENTS, straggler=0, nodes=2))
    path = facts["files"][0]["path"]
    synth.shift_to_now(path, ahead_s=-300.0)        # its summaries ended five minutes ago on this clock
    families = {f.name: f for f in text_string_to_metric_families(metrics.render(path, "n").decode())}
    assert families["straggler_rank_wait_ratio"].samples == []
    assert families["straggler_summary_age_seconds"].samples[0].value > 60
    synth.shift_to_now(path, ahead_s=0)
    families = {f.name: f for f in text_string_to_metric_families(metrics.render(path, "n").decode())}
    assert len(families["straggler_rank_wait_ratio"].samples) == 2


def test_metrics_and_live_need_a_client_certificate_on_the_api_port(certs, tls_agent):
    for path in ("/metrics", "/api/v1/live"):
        context = ssl.create_default_context(cafile=certs.client().ca)   # trusts the agent, shows no certificate
        context.check_hostname = False
        conn = http.client.HTTPSConnection("127.0.0.1", tls_agent.port, context=context, timeout=10)
        with pytest.raises((ssl.SSLError, ConnectionError, http.client.RemoteDisconnected)):
            conn.request("GET", path)
            conn.getresponse().read()
        conn.close()


def test_live_returns_the_rows_since_a_time_and_refuses_a_bad_since(certs, tls_agent):
    conn = http.client.HTTPSConnection("127.0.0.1", tls_agent.port, context=client_context(certs.client()), timeout=10)
    conn.request("GET", "/api/v1/live")
    everything = json.loads(conn.getresponse().read())
    ts = sorted({r[1] for r in everything["thread_time"]})
    assert len(ts) > 3 and everything["node"] and everything["monotonic_ns"] > 0
    conn.request("GET", f"/api/v1/live?since={ts[-2]}")
    later = json.loads(conn.getresponse().read())
    assert sorted({r[1] for r in later["thread_time"]}) == ts[-2:]
    conn.request("GET", "/api/v1/live?since=yesterday")
    response = conn.getresponse()
    answer = json.loads(response.read())
    assert response.status == 400 and "since" in answer["error"]
    conn.request("GET", f"/api/v1/live?since={ts[-2]}&after_seq=last")
    response = conn.getresponse()
    answer = json.loads(response.read())
    assert response.status == 400 and "after_seq" in answer["error"] and "\n" not in answer["error"]


def test_plain_metrics_port_is_loopback_only_unless_told(tls_agent, tmp_path):
    with pytest.raises(StragglerError, match="loopback only"):
        metrics.start_plain_server(tls_agent.db, "n", "0.0.0.0:0")
    with pytest.raises(StragglerError, match="loopback only"):
        metrics.start_plain_server(tls_agent.db, "n", "192.0.2.7:0")
    server, thread = metrics.start_plain_server(tls_agent.db, "n", "127.0.0.1:0")
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        assert response.status == 200 and b"straggler_rank_wait_ratio" in response.read()
        conn.request("GET", "/api/v1/live")                 # only the metrics on this port
        response = conn.getresponse()
        response.read()
        assert response.status == 404
    finally:
        server.shutdown()
        server.server_close()
    # told otherwise: any address
    server, _ = metrics.start_plain_server(tls_agent.db, "n", "0.0.0.0:0", any_address=True)
    server.shutdown()
    server.server_close()


def test_plain_metrics_port_holds_a_bounded_number_of_connections_each_for_a_bounded_time(tls_agent, monkeypatch):
    """Idle clients past the cap get a 503 at once (no thread each); the ones held are cut at their
    deadline, and a scrape is served again after it."""
    import threading
    monkeypatch.setattr(metrics, "PLAIN_CONNECTION_S", 2.0)
    server, _ = metrics.start_plain_server(tls_agent.db, "n", "127.0.0.1:0")
    port = server.server_address[1]
    idle = []
    try:
        threads_before = threading.active_count()
        for _ in range(metrics.PLAIN_MAX_CONNECTIONS):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        time.sleep(0.5)
        extra = []
        for _ in range(20):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            extra.append(sock.recv(4096))
            sock.close()
        assert all(answer.startswith(b"HTTP/1.1 503") for answer in extra), extra[:2]
        assert b"too many connections" in extra[0]
        assert threading.active_count() <= threads_before + 2 * metrics.PLAIN_MAX_CONNECTIONS
        for sock in idle:                                   # cut at their deadline: the server closed them
            sock.settimeout(10)
            assert sock.recv(1) == b""
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        assert response.status == 200 and b"straggler_rank_wait_ratio" in response.read()
        conn.close()
    finally:
        for sock in idle:
            sock.close()
        server.shutdown()
        server.server_close()


# The real case (a synchronous job on the test bed, real eBPF agents serving mutual TLS, a CPU hog
# at T) is in tests/test_diagnosis.py, which shares its agents.


def test_the_watch_serves_the_episode_going_on_as_prometheus_metrics(tmp_path):
    """`straggler watch --metrics-listen`: while the straggler's episode goes on, /metrics says its node,
    rank and cause, and when it began (prometheus-client's own parser reads it); a non-loopback address
    is refused without --metrics-any-address."""
    import time
    import urllib.request
    from prometheus_client.parser import text_string_to_metric_families
    facts = late_hog_nodes(tmp_path)
    tls = TLSOptions(no_tls=True)
    handles = [start_background(f["path"], node=f["node"], listen="127.0.0.1:0", tls=tls) for f in facts["files"]]
    port = _free_port()
    proc = subprocess.Popen([STRAGGLER, "watch", "--nodes", ",".join(f"127.0.0.1:{h.port}" for h in handles),
                             "--no-tls", "--interval", "0.5", "--window", "5", "--json", "--timeout", "30",
                             "--metrics-listen", f"127.0.0.1:{port}"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    try:
        families = {}
        deadline = time.monotonic() + 25
        while time.monotonic() < deadline:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            except OSError:
                time.sleep(0.5)
                continue
            families = {f.name: f for f in text_string_to_metric_families(body)}
            if families.get("straggler_episode") and families["straggler_episode"].samples:
                break
            time.sleep(0.5)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        for h in handles:
            h.stop()
    (sample,) = families["straggler_episode"].samples
    assert sample.labels["node"] == "gpu-node-02" and sample.labels["cause"] and sample.value == 1
    assert families["straggler_episode_start_timestamp_seconds"].samples[0].value > 1.7e9
    assert len(families["straggler_watch_node_up"].samples) == 4
    refused = subprocess.run([STRAGGLER, "watch", "--nodes", "127.0.0.1:1", "--no-tls", "--metrics-listen",
                              "0.0.0.0:9", "--timeout", "1"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "loopback only" in refused.stderr and refused.stderr.count("\n") == 1


def test_the_time_an_episode_cost_is_in_its_recovery_and_in_the_watchs_metrics():
    from prometheus_client.core import CollectorRegistry
    from prometheus_client.exposition import generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    from straggler.render.events import format_event
    from straggler.render.watch_metrics import WatchCollector, WatchState
    t = watch.Tracker(confirm=2, clear=3)
    state = WatchState()
    going = [watch.LiveVerdict(straggler="a", cause="cpu-contention", rank=0, step_moved_s=3.0, lost_s=s)
             for s in (1.0, 2.5, 4.0)]
    events = []
    for i, v in enumerate(going + [V()] * 3):
        for e in t.verdict(v, now_mono_ns=(i + 1) * 10**9):
            events.append(e)
            state.on_event(e)
        state.on_tick(v, [])
        if i == 2:
            families = _families(generate_latest(_registry(WatchCollector(state), CollectorRegistry)).decode(),
                                 text_string_to_metric_families)
            assert families["straggler_episode_time_lost_seconds"] == [({"node": "a"}, 4.0)]
    recovered = next(e for e in events if e["event"] == "recovered")
    assert recovered["lost_s"] == 4.0 and "the job lost 4 s to it" in format_event(dict(recovered, time=""))
    families = _families(generate_latest(_registry(WatchCollector(state), CollectorRegistry)).decode(),
                         text_string_to_metric_families)
    assert families["straggler_episode_time_lost_seconds"] == []
    assert families["straggler_episodes_time_lost_seconds"] == [({}, 4.0)]


def _registry(collector, CollectorRegistry):
    registry = CollectorRegistry()
    registry.register(collector)
    return registry


def _families(body, parse):
    return {f.name: [(s.labels, s.value) for s in f.samples if not s.name.endswith("_created")] for f in parse(body)}


def test_a_live_answer_with_a_row_the_watch_cannot_key_is_refused_not_a_crash():
    """A node sending a summary whose ts is text (or a row of the wrong length) made the watch's poller thread
    die and its main loop stop with a traceback; the live feed now refuses such an answer (sql-error)."""
    from straggler.fleet.client import _NodeFailure
    from straggler.fleet.live import checked_live
    cols = {"thread_time": ["node", "ts", "interval_ns", "pid", "tid", "calls"]}
    good = {"columns": cols, "thread_time": [["n", 1, 1000, 7, 7, 3]]}
    checked_live("10.0.0.9:7433", good)
    for row in (["n", "x", 1000, 7, 7, 3], ["n", 1, 1000, 7, 7], ["n", 1, 1000, True, 7, 3]):
        with pytest.raises(_NodeFailure) as refused:
            checked_live("10.0.0.9:7433", {"columns": cols, "thread_time": [row]})
        assert refused.value.status == "sql-error" and "malformed thread_time row" in refused.value.message


# ---------------------------------------------------------------- the job's time lost, live

def _sync_store(path, node, calls):
    """A node's store holding these collective calls [(seq, ts)] of rank 0 (pid 7) and the kernel's counts."""
    import sqlite3
    from straggler.store import schema
    conn = sqlite3.connect(path)
    schema.create(conn, node)
    conn.executemany("INSERT INTO events(seq, node, source, op, ts, duration, pid, tid, rank, detail) "
                     "VALUES (?, ?, 'nccl', 'ncclAllReduce', ?, 1000, 7, 7, 0, ?)",
                     [(seq, node, ts, json.dumps({"comm": "0xc0", "count": 8, "datatype": "float32"}))
                      for seq, ts in calls])
    conn.executemany("INSERT INTO aggregates(node, ts, interval_ns, pid, rank, source, op, count, sum_ns, max_ns) "
                     "VALUES (?, ?, 1000000000, 7, 0, ?, ?, ?, 0, 0)",
                     [(node, s * 10**9, source, op, n) for s in range(1, 4)
                      for source, op, n in (("nccl", "ncclAllReduce", 10), ("driver", "cuLaunchKernel", 40))])
    conn.commit()
    conn.close()


def test_the_live_answer_carries_the_jobs_sync_points_and_the_watch_keeps_each_call_once(tmp_path):
    """The watch's what-if lines up the job's collective calls: /live answers them (and the kernel's counts of
    every call) from a little before the time asked — a call is written when it returns, after summaries the
    watch already holds — and the watch keeps each one once, under the node its feed answers for."""
    from straggler.store.live import LATE_NS, live_summary
    db = str(tmp_path / "node.db")
    calls = [(i + 1, 10**9 + i * 10**8) for i in range(20)]          # 2 s of calls, 10 per second
    _sync_store(db, "what-it-says", calls)
    since = 3 * 10**9 - 1
    answer = live_summary(db, since_ns=since)
    got = [dict(zip(answer["columns"]["collectives"], r)) for r in answer["collectives"]]
    assert [c["seq"] for c in got] == [seq for seq, ts in calls if ts >= since - LATE_NS]
    assert got[0]["communicator"] == "0xc0" and got[0]["op"] == "ncclAllReduce" and got[0]["pid"] == 7
    aggs = [dict(zip(answer["columns"]["aggregates"], r)) for r in answer["aggregates"]]
    assert {(a["source"], a["op"], a["count"]) for a in aggs} == {("nccl", "ncclAllReduce", 10),
                                                                   ("driver", "cuLaunchKernel", 40)}
    feed = watch.NodeFeed(address="127.0.0.1:1")
    status = SimpleNamespace(status="ok", message="", node="gpu-node-03")
    for _ in range(2):                                                # the same calls twice: kept once
        feed.apply(status, dict(answer, node="gpu-node-03", thread_time=[]), None, 60 * 10**9)
    # the next poll asks for the calls written after the newest it holds: none again, only the new ones
    assert feed.after_seq == got[-1]["seq"]
    assert live_summary(db, since_ns=since, after_seq=feed.after_seq)["collectives"] == []
    assert [r[1] for r in live_summary(db, since_ns=since, after_seq=got[-3]["seq"])["collectives"]] == \
        [c["seq"] for c in got[-2:]]
    assert watch.build_store([feed]).execute("SELECT COUNT(*) FROM events WHERE source = 'nccl'").fetchone() == (0,), \
        "the verdicts are made without the calls, as they always were"
    conn = watch.build_store([feed], calls=True)
    rows = conn.execute("SELECT node, COUNT(*), MIN(json_extract(detail, '$.comm')) FROM events "
                        "WHERE source = 'nccl' GROUP BY node").fetchall()
    assert rows == [("gpu-node-03", len(got), "0xc0")]
    assert conn.execute("SELECT COUNT(*), SUM(count) FROM aggregates WHERE node = 'gpu-node-03'").fetchone() == \
        (len(aggs), sum(a["count"] for a in aggs))


def test_with_collectives_that_only_enqueue_the_live_answer_carries_the_synchronize_calls_too(tmp_path):
    """Where collectives only enqueue (NCCL on GPUs) the ranks wait for each other in synchronize: its calls
    travel with the collectives (in the watch's store under their own library, where explain reads them), a
    launch the agent happened to record does not."""
    import sqlite3
    from straggler.store.live import live_summary
    db = str(tmp_path / "node.db")
    _sync_store(db, "gpu-node-03", [(1, 2 * 10**9)])
    conn = sqlite3.connect(db)
    conn.executemany("INSERT INTO events(seq, node, source, op, ts, duration, pid, tid, rank) "
                     "VALUES (?, 'gpu-node-03', ?, ?, ?, 5000000, 7, 7, 0)",
                     [(2, "cuda", "cudaStreamSynchronize", 2 * 10**9 + 10**6),
                      (3, "driver", "cuLaunchKernel", 2 * 10**9 + 10**7)])
    conn.commit()
    conn.close()
    answer = live_summary(db, since_ns=3 * 10**9)
    assert [r[answer["columns"]["collectives"].index("op")] for r in answer["collectives"]] == \
        ["ncclAllReduce", "cudaStreamSynchronize"]
    feed = watch.NodeFeed(address="127.0.0.1:1")
    feed.apply(SimpleNamespace(status="ok", message="", node="gpu-node-03"), dict(answer, thread_time=[]), None,
               60 * 10**9)
    stored = watch.build_store([feed], calls=True).execute("SELECT source, op FROM events ORDER BY seq").fetchall()
    assert stored == [("nccl", "ncclAllReduce"), ("cuda", "cudaStreamSynchronize")]


def _lost(measured=True, imbalance_s=0.0, episode=None):
    if not measured:
        return {"measured": False, "why": "its collectives only enqueue"}
    parts = [dict(what="episode", node=episode, all_along=False, lost_s=4.0)] if episode else []
    return {"measured": True, "span_s": 50.0, "sync_points": 500, "lost_s": 4.0 * bool(episode) + imbalance_s,
            "lost_ratio": (4.0 * bool(episode) + imbalance_s) / 50.0, "parts": parts,
            "imbalance": {"lost_s": imbalance_s, "sync_points": 300, "slowest": []}}


def test_imbalance_that_moves_is_reported_once_it_holds_and_its_end_too():
    """The job's own loss, no node's: explain's imbalance finding in two polls in a row is an `imbalance` event
    (naming no straggler), its absence in three a `balanced` one; a poll whose time lost was not measured
    changes nothing."""
    t = watch.Tracker(confirm=2, clear=3)
    moving = watch.LiveVerdict(whatif=_lost(imbalance_s=20.0), imbalance="imbalance that moves between ranks: ...")
    calm = watch.LiveVerdict(whatif=_lost())
    blind = watch.LiveVerdict(whatif=_lost(measured=False))
    seen = []
    for i, v in enumerate([moving, calm, moving, blind, moving, moving, calm, blind, calm, calm]):
        seen += [(i, e["event"]) for e in t.imbalance(v, now_mono_ns=(i + 1) * 10**9) + t.verdict(v)]
    assert seen == [(4, "imbalance"), (9, "balanced")], seen


def test_the_watchs_metrics_and_its_end_say_what_the_job_lost_over_the_window():
    from prometheus_client.core import CollectorRegistry
    from prometheus_client.exposition import generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    from straggler.render.events import format_event
    from straggler.render.watch_metrics import WatchCollector, WatchState
    state = WatchState()
    state.on_tick(watch.LiveVerdict(whatif=_lost(imbalance_s=2.5, episode="gpu-node-02")), [])
    families = _families(generate_latest(_registry(WatchCollector(state), CollectorRegistry)).decode(),
                         text_string_to_metric_families)
    assert families["straggler_window_time_lost_seconds"] == [({"what": "episode", "node": "gpu-node-02"}, 4.0),
                                                              ({"what": "imbalance", "node": ""}, 2.5)]
    assert families["straggler_window_time_lost_ratio"] == [({}, 0.13)]
    assert families["straggler_window_span_seconds"] == [({}, 50.0)]
    state.on_tick(watch.LiveVerdict(whatif=_lost(measured=False)), [])
    families = _families(generate_latest(_registry(WatchCollector(state), CollectorRegistry)).decode(),
                         text_string_to_metric_families)
    assert families["straggler_window_time_lost_seconds"] == [] and families["straggler_window_time_lost_ratio"] == []
    end = format_event(dict(event="end", reason="stopped", time="", window=_lost(imbalance_s=2.5, episode="gpu-node-02")))
    assert "over the time the watch held, time lost: 6.5 s of 50 s (13%)" in end and "gpu-node-02 (its episode) 4 s" in end


def test_calls_travel_once_in_the_order_they_were_written_whatever_the_caps_and_the_store(tmp_path, monkeypatch):
    """Calls are written when they return, not in the order they began: a watch holding the calls up to a seq
    gets every later one once, across answers cut at their cap (each continues where the last was cut). A
    first answer cut at its cap holds the newest, and the watch then compares the calls with the counts only
    from where its calls are complete. Counts of an interval longer than the late margin still come. A store
    replaced under the agent (its seqs begin again) and an older agent (no calls) reset the watch's cursor
    instead of stalling it; a seq_high missing or not a number does not."""
    import sqlite3
    from straggler.store import live
    db = str(tmp_path / "node.db")
    # 12 calls, written (seq) in another order than they began (ts): a long one began first, returned last
    order = [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1]
    _sync_store(db, "n", [(seq, 36 * 10**9 + k * 10**8) for seq, k in zip(range(1, 13), order)])
    conn = sqlite3.connect(db)
    conn.execute("INSERT INTO aggregates(node, ts, interval_ns, pid, rank, source, op, count, sum_ns, max_ns) "
                 "VALUES ('n', 10000000000, 30000000000, 7, 0, 'nccl', 'ncclAllReduce', 12, 0, 0)")   # 10 s to 40 s
    conn.execute("INSERT INTO meta(key, value) VALUES ('seq_high', '12')")
    conn.commit()
    conn.close()
    since = 40 * 10**9                                        # the calls from 35 s on; that interval ends at 40 s
    monkeypatch.setattr(live, "MAX_COLLECTIVE_ROWS", 5)
    first = live.live_summary(db, since_ns=since)
    assert [r[1] for r in first["collectives"]] == [8, 9, 10, 11, 12] and first["calls_truncated"]   # the newest
    assert first["seq_high"] == 12
    assert [r[1] for r in first["aggregates"]] == [10 * 10**9], "an interval that ends after the margin comes"
    got, cursor = [], 0
    for _ in range(4):
        answer = live.live_summary(db, since_ns=since, after_seq=cursor)
        got += [r[1] for r in answer["collectives"]]
        cursor = max(got, default=cursor)
    assert got == list(range(1, 13)), got                    # each once, none lost at the cap

    feed = watch.NodeFeed(address="127.0.0.1:1")
    status = SimpleNamespace(status="ok", message="", node="n")
    feed.apply(status, dict(first, node="n", thread_time=[]), None, 60 * 10**9)
    assert feed.after_seq == 12 and len(feed.collectives) == 5
    held = watch.NodeFeed(address="127.0.0.1:2")               # a feed holds the newest MAX_HELD_CALLS
    monkeypatch.setattr(watch, "MAX_HELD_CALLS", 3)
    summary = [["n", 36 * 10**9, 10**9, 7, 7] + [0] * (len(first["columns"]["thread_time"]) - 5)]
    held.apply(status, dict(first, node="n", thread_time=summary), None, 60 * 10**9)
    assert list(held.collectives) == [10, 11, 12]
    monkeypatch.setattr(watch, "MAX_HELD_CALLS", 100)
    later = [["n", 99 * 10**9, 10**9, 7, 7] + [0] * (len(first["columns"]["thread_time"]) - 5)]
    held.apply(status, dict(first, node="n", thread_time=later, collectives=[]), None, 60 * 10**9)
    assert held.collectives == {}, "calls older than the time the watch holds are dropped"
    store = watch.build_store([feed], calls=True)
    assert store.execute("SELECT COUNT(*) FROM events").fetchone() == (5,)
    assert store.execute("SELECT COUNT(*) FROM aggregates").fetchone() == (0,), \
        "counts from before the calls held are complete are not compared with them"
    for high in (None, "3"):
        feed.apply(status, dict(first, node="n", thread_time=[], collectives=[], seq_high=high), None, 60 * 10**9)
        assert feed.after_seq == 12
    feed.apply(status, dict(first, node="n", thread_time=[], collectives=[], seq_high=3), None, 60 * 10**9)
    assert feed.after_seq is None and feed.collectives == {}, "a new store: the cursor begins again"
    feed.apply(status, dict(first, node="n", thread_time=[]), None, 60 * 10**9)
    older = dict(first, node="n", thread_time=[], columns={k: v for k, v in first["columns"].items()
                                                          if k not in ("collectives", "aggregates")})
    older.pop("collectives"), older.pop("aggregates")
    feed.apply(status, older, None, 60 * 10**9)              # an older agent now: no KeyError, nothing held
    assert feed.after_seq is None and feed.collectives == {}


def test_a_live_answer_with_an_integer_sqlite_cannot_hold_is_refused():
    """A number past 64 bits (JSON has no bound) would stop the watch where it puts the rows into its store:
    the feed refuses the answer (sql-error, one line), whatever the table."""
    from straggler.fleet.client import _NodeFailure
    from straggler.fleet.live import checked_live
    cols = {"collectives": ["node", "seq", "ts", "duration", "pid"]}
    checked_live("10.0.0.9:7433", {"columns": cols, "collectives": [["n", 1, 5, 10, 7]]})
    for row in (["n", 1, 5, 2**70, 7], ["n", 2**63, 5, 10, 7], ["n", 1, 5, 10, -2**64]):
        with pytest.raises(_NodeFailure) as refused:
            checked_live("10.0.0.9:7433", {"columns": cols, "collectives": [row]})
        assert refused.value.status == "sql-error" and "within 64 bits" in refused.value.message
    for key in ("monotonic_ns", "realtime_ns", "seq_high"):          # the answer's own numbers too
        with pytest.raises(_NodeFailure) as refused:
            checked_live("10.0.0.9:7433", {"columns": cols, "collectives": [], key: 2**70})
        assert refused.value.status == "sql-error" and key in refused.value.message
