"""Staged snapshot copies cannot pile up. GET /api/v1/snapshot writes a copy of the whole store into
a staging directory and streams it; the copy stays staged while a slow reader takes it, after the
one-at-a-time snapshot pool has moved on. At most MAX_STAGED_COPIES are staged at once: the next
request is refused with a 429 and one line (before: every slow reader left a full copy on the
node's disk), and leftovers (a dead server's, or an answer never sent) are cleaned up.

Against a real `straggler serve` on loopback (mutual TLS) with slow readers that never read, and
stage_dir on real directories."""
import http.client
import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_api_helpers import Pki, make_node_db

from straggler.api.server import start_background
from straggler.store import snapshot as snapmod
from straggler.store.snapshot import MAX_STAGED_COPIES, StagingFull, stage_dir
from straggler.tls import client_context

ADDRESS = "127.0.0.1"
PAD_MB = 24             # more than loopback's socket buffers hold: a reader that does not read holds its copy


def _staged(parent):
    return sorted(p for p in Path(parent).iterdir() if p.name.startswith(snapmod.STAGE_PREFIX))


def _wait_for(predicate, what, limit_s=60.0):
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.05)
    pytest.fail(f"not within {limit_s:g} s: {what}")


# ---- stage_dir on real directories ----

def test_stage_dir_refuses_past_the_cap_and_cleans_up_leftovers(tmp_path, monkeypatch):
    parent = tmp_path / "stage"
    parent.mkdir()
    held = [stage_dir(str(parent)) for _ in range(MAX_STAGED_COPIES)]
    with pytest.raises(StagingFull) as refused:
        stage_dir(str(parent))
    assert str(refused.value) == (f"{MAX_STAGED_COPIES} snapshot copies are already staged in {parent}, waiting for "
                                  f"their readers (at most {MAX_STAGED_COPIES} at once); retry when one is fetched")
    assert len(_staged(parent)) == MAX_STAGED_COPIES                  # nothing made for the refused one
    # a leftover of this live process (an answer never sent), untouched for longer than
    # STAGE_MAX_AGE_S (an hour; 1 s here), is removed
    monkeypatch.setattr(snapmod, "STAGE_MAX_AGE_S", 1.0)
    old = time.time() - 2.0
    os.utime(held[0], (old, old))
    fresh = stage_dir(str(parent))
    assert not os.path.exists(held[0]) and os.path.isdir(fresh)
    # a dead server's directory does not count either
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = parent / f"{snapmod.STAGE_PREFIX}{int(gone.stdout)}-abcdefgh"
    dead.mkdir()
    os.rmdir(fresh)
    assert os.path.isdir(stage_dir(str(parent))) and not dead.exists()


# ---- a real agent with slow readers ----

@pytest.fixture
def agent(tmp_path):
    certs = Pki(tmp_path / "pki")
    db = tmp_path / "node.db"
    make_node_db(db, "gpu-node-01", 0)
    conn = sqlite3.connect(str(db))
    conn.execute("CREATE TABLE pad (b BLOB)")
    conn.executemany("INSERT INTO pad VALUES (randomblob(1048576))", [()] * PAD_MB)
    conn.commit()
    conn.close()
    stage = tmp_path / "stage"
    stage.mkdir()
    handle = start_background(str(db), listen=f"{ADDRESS}:0", tls=certs.server(ADDRESS), snapshot_dir=str(stage))
    try:
        yield handle, client_context(certs.client()), stage
    finally:
        handle.stop()


def _slow_reader(handle, context):
    """A TLS connection that asks for a snapshot and never reads the answer."""
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.settimeout(30)
    raw.connect((ADDRESS, handle.port))
    conn = context.wrap_socket(raw, server_hostname=ADDRESS)
    conn.sendall(f"GET /api/v1/snapshot HTTP/1.1\r\nHost: {ADDRESS}\r\n\r\n".encode())
    return conn


def _get_snapshot(handle, context):
    conn = http.client.HTTPSConnection(ADDRESS, handle.port, context=context, timeout=60)
    try:
        conn.request("GET", "/api/v1/snapshot")
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_a_third_staged_copy_is_refused_with_429_and_one_line_until_one_is_fetched(agent):
    handle, context, stage = agent
    readers = []
    try:
        for count in range(1, MAX_STAGED_COPIES + 1):
            readers.append(_slow_reader(handle, context))
            _wait_for(lambda: sum((d / "snapshot.db").exists() for d in _staged(stage)) == count,
                      f"{count} staged copies written")
        status, body = _get_snapshot(handle, context)
        assert status == 429, body[:200]
        answer = json.loads(body)
        assert answer["kind"] == "busy" and "\n" not in answer["error"]
        assert answer["error"] == (f"{MAX_STAGED_COPIES} snapshot copies are already staged in {stage}, waiting for "
                                   f"their readers (at most {MAX_STAGED_COPIES} at once); retry when one is fetched")
        assert len(_staged(stage)) == MAX_STAGED_COPIES
    finally:
        for reader in readers:
            reader.close()
    # the readers went away: their copies are removed, and the next snapshot is served whole
    _wait_for(lambda: not _staged(stage), "the staged copies removed after their readers left")
    status, body = _get_snapshot(handle, context)
    assert status == 200 and body.startswith(b"SQLite format 3\x00") and len(body) > PAD_MB << 20
    _wait_for(lambda: not _staged(stage), "the served copy removed")


def test_head_on_the_snapshot_route_answers_its_headers_without_staging_a_copy(agent, monkeypatch):
    """HEAD costs what headers cost: before, it staged a whole copy of the store (and sent none of it)."""
    handle, context, stage = agent
    copies = []
    real = snapmod.snapshot
    monkeypatch.setattr(snapmod, "snapshot", lambda *a, **kw: copies.append(a) or real(*a, **kw))
    for _ in range(MAX_STAGED_COPIES + 2):        # more than could ever be staged at once
        conn = http.client.HTTPSConnection(ADDRESS, handle.port, context=context, timeout=60)
        try:
            conn.request("HEAD", "/api/v1/snapshot")
            response = conn.getresponse()
            assert response.status == 200 and response.read() == b""
            assert response.getheader("Content-Type") == "application/vnd.sqlite3"
            assert response.getheader("Content-Length") is None
            assert "gpu-node-01.db" in response.getheader("Content-Disposition")
        finally:
            conn.close()
        assert _staged(stage) == []
    assert copies == []
    status, body = _get_snapshot(handle, context)
    assert status == 200 and body.startswith(b"SQLite format 3\x00") and len(copies) == 1
