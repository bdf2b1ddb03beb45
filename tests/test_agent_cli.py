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


@pytest.mark.parametrize("text, seconds", [("300", 300.0), ("90s", 90.0), ("5m", 300.0), ("1h", 3600.0),
                                           ("1.5h", 5400.0), ("2d", 172800.0), (" 10 M ", 600.0), ("0", 0.0),
                                           (".5s", 0.5), (42, 42.0), (2.5, 2.5)])
def test_durations_take_seconds_or_a_unit(text, seconds):
    from straggler.durations import parse_duration
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["5 minutes", "5x", "m", "", "-5", "1h30m", "inf", True, float("nan"), -1])
def test_a_bad_duration_is_one_line_naming_the_option(text):
    from straggler.durations import parse_duration
    with pytest.raises(StragglerError, match="^--max-age "):
        parse_duration(text, "--max-age")


def test_the_role_checks_the_duration_with_the_parsers_own_pattern():
    """The role straggler_agent validates straggler_agent_duration (tasks/main.yml) with the same
    regular expression as the agent's parser (vars/main.yml), so a value the role accepts is one the
    agent accepts."""
    from pathlib import Path
    from straggler.durations import DURATION_PATTERN
    role_vars = (Path(__file__).resolve().parents[1] / "roles" / "straggler_agent" / "vars" / "main.yml").read_text()
    assert f"__straggler_agent_duration_pattern: '{DURATION_PATTERN}'" in role_vars


def test_trace_refuses_a_bad_duration_in_one_line(tmp_path):
    assert_one_line_error(trace("--duration", "5 minutes", "--db", str(tmp_path / "t.db")), "--duration", "5m")


def test_the_command_line_makes_the_same_options_as_plain_values(tmp_path):
    """The agent takes plain values (AgentOptions), whoever makes them: the command's arguments give
    the options a caller would write by hand, units and 'no limit' included."""
    from straggler.agent import AgentOptions
    from straggler.cli import build_parser
    from straggler.cli.trace import agent_options
    from straggler.tls import TLSOptions
    db = str(tmp_path / "t.db")
    args = build_parser(only="trace").parse_args(
        ["trace", "--node", "n1", "--db", db, "--duration", "5m", "--max-db", "0", "--max-age", "1h", "--interval", "2",
         "--summary-interval", "0.5", "--sample", "0", "--no-tls", "--metrics-listen", "127.0.0.1:0"])
    opts = agent_options(args)
    assert opts == AgentOptions(node="n1", db=db, duration_s=300.0, max_db_bytes=None, max_age_s=3600.0, interval_s=2.0,
                                summary_interval_s=0.5, sample=0, tls=TLSOptions(no_tls=True),
                                metrics_listen="127.0.0.1:0")
    assert (opts.interval_ns, opts.summary_ns, opts.max_age_ns, opts.slow_floor_ns) == (2 * 10**9, 5 * 10**8,
                                                                                        3600 * 10**9, 10**7)
    with pytest.raises(StragglerError, match="^--summary-interval 3 is longer than --interval 2"):
        AgentOptions(node="n1", interval_s=2, summary_interval_s=3)
