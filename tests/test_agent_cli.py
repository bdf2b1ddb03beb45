"""`straggler trace` refusing what it cannot do: one line each, saying what to do, no traceback.
Fast: none of these compiles BPF."""
import os
import platform
import shutil
import sqlite3
import subprocess
import sys

import pytest

from straggler.errors import StragglerError
from straggler.probes import loader
from straggler.store import schema


def trace(*args, prefix=()):
    return subprocess.run([*prefix, sys.executable, "-m", "straggler.cli", "trace", *args],
                          capture_output=True, text=True, timeout=120)


def assert_one_line_error(proc, *fragments):
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("straggler trace: error: ")
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_node_name_with_a_colon_is_refused(tmp_path):
    assert_one_line_error(trace("--node", "gpu:1", "--db", str(tmp_path / "t.db")), "--node", "':'")


def test_a_missing_pid_is_refused(tmp_path):
    assert_one_line_error(trace("--pid", "999999999", "--db", str(tmp_path / "t.db")), "no such process")


def test_a_missing_cuda_library_is_refused(tmp_path):
    assert_one_line_error(trace("--cuda-lib", str(tmp_path / "libcuda.so.1"), "--db", str(tmp_path / "t.db")),
                          "no such file", "libcuda")


def test_a_newer_database_schema_is_refused(tmp_path, root_required):
    db = tmp_path / "newer.db"
    conn = sqlite3.connect(db)
    schema.create(conn)
    conn.execute("UPDATE meta SET value = '999' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    assert_one_line_error(trace("--db", str(db), "--duration", "1"), "newer", "upgrade straggler")


def test_not_root_is_refused_with_the_fix(tmp_path, root_required):
    setpriv = shutil.which("setpriv")
    if not setpriv:
        pytest.skip("no setpriv(1) to drop root")
    proc = trace("--db", str(tmp_path / "t.db"), prefix=(setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"))
    assert_one_line_error(proc, "root", "sudo")


def test_missing_kernel_headers_are_named_with_the_fix(monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("the root check comes first")
    monkeypatch.setattr(platform, "release", lambda: "0.0.0-no-such-kernel")
    monkeypatch.delenv("BCC_KERNEL_SOURCE", raising=False)
    monkeypatch.setattr(loader.os.path, "exists",
                        lambda path, _real=os.path.exists: False if "kheaders" in str(path) else _real(path))
    with pytest.raises(StragglerError, match=r"kernel headers for 0\.0\.0-no-such-kernel not found.*make setup"):
        loader.check_environment()


def test_help_documents_the_record_rule_and_the_ready_signal():
    proc = subprocess.run([sys.executable, "-m", "straggler.cli", "trace", "--help"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    assert "--record-all" in text and "--slow-factor" in text and "1-in---sample" in text
    assert "straggler: tracing (N probes) node=NODE db=PATH" in text
