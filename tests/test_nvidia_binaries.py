"""The agent (real eBPF) against NVIDIA's real binaries, not the stand-in. There is no GPU here, so
every call fails at once with its real error code; the agent must record each one (a failing call
always gets a row), with its op, return code, rank and node, and explain must say so.

One agent run (default record rule without the random sample: --sample 0, so a call gets a row only
because it failed; --pid of a launcher whose children are the programs) traces:
  - the CUDA 12 runtime (libcudart.so.12) from NVIDIA's wheel, loaded through ctypes by the Python of
    a virtual environment (where pip puts it): found in the process's maps and attached while it runs;
  - NCCL (libnccl.so.2) from its wheel, the same way;
  - when this machine has nvcc: a program built with the CUDA runtime as a shared library
    (-cudart shared: this machine's CUDA 13 libcudart.so.13) and the same program with the runtime
    linked in statically (nvcc's default), whose executable the agent attaches like a library;
  - a library that has cudaMalloc and nothing else: the runtime functions it lacks are listed as
    expected but missing, in `probes` and in `straggler status`.
The wheels are installed by `make setup` into a test-only virtual environment (STRAGGLER_NVIDIA_VENV,
default ~/.cache/straggler/nvidia-venv); without it the tests are skipped with the reason.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from straggler.probes.symbols import SYNC_OPS
from test_agent import AgentRun, Launcher, query, scalar, wait_until

pytestmark = pytest.mark.bpf

HERE = Path(__file__).resolve().parent
NODE = "nvidia-test"
NVIDIA_VENV = Path(os.environ.get("STRAGGLER_NVIDIA_VENV", Path.home() / ".cache" / "straggler" / "nvidia-venv"))
RANKS = {"cudart12": 11, "nccl": 12, "shared": 13, "static": 14, "malloc": 15}


def venv_library(pattern):
    found = sorted(NVIDIA_VENV.glob(f"lib/python3*/site-packages/nvidia/{pattern}"))
    return found[0] if found else None


@pytest.fixture(scope="module")
def nvidia():
    python = NVIDIA_VENV / "bin" / "python"
    libs = {"cudart12": venv_library("cuda_runtime/lib/libcudart.so.12"), "nccl": venv_library("nccl/lib/libnccl.so.2")}
    if not python.exists() or None in libs.values():
        pytest.skip(f"NVIDIA's runtime and NCCL wheels are not installed in {NVIDIA_VENV} (make setup installs them "
                    "from the package registry; it was unreachable or the set-up was skipped)")
    return dict(python=str(python), **libs)


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    """The nvcc-built program, shared and static runtime (None when nvcc is not here), and a library
    with cudaMalloc only (cc)."""
    out = tmp_path_factory.mktemp("nvidia-programs")
    built = {"shared": None, "static": None}
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
    if nvcc:
        for kind, flags in (("shared", ["-cudart", "shared"]), ("static", [])):
            exe = out / f"kernel-{kind}"
            subprocess.run([nvcc, *flags, "-o", str(exe), str(HERE / "nvidia_kernel.cu")], check=True, timeout=300,
                           capture_output=True)
            built[kind] = exe
    lib = out / "only-malloc" / "libcudart.so.99"
    lib.parent.mkdir()
    src = out / "only_malloc.c"
    src.write_text("#include <stddef.h>\nint cudaMalloc(void **p, size_t n) { (void)p; (void)n; return 2; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, timeout=120)
    built["malloc"] = lib
    return built


@pytest.fixture(scope="module")
def traced(nvidia, programs, tmp_path_factory):
    """Run every program under one agent; returns {name: (program's own output, pid)} and the agent."""
    work = tmp_path_factory.mktemp("nvidia-run")
    launcher = Launcher(work)
    agent = AgentRun(work / "trace.db", ["--node", NODE, "--sample", "0", "--pid", str(launcher.pid), "--interval", "1",
                                         "--rescan", "0.3"])
    results = {}
    try:
        agent.wait_ready()
        runs = [("cudart12", [nvidia["python"], HERE / "nvidia_workload.py", "cudart", nvidia["cudart12"]], nvidia["cudart12"]),
                ("nccl", [nvidia["python"], HERE / "nvidia_workload.py", "nccl", nvidia["nccl"]], nvidia["nccl"]),
                ("malloc", [nvidia["python"], HERE / "nvidia_workload.py", "malloc", programs["malloc"]], programs["malloc"])]
        for kind in ("shared", "static"):
            if programs[kind]:
                runs.append((kind, [programs[kind]], programs[kind] if kind == "static" else None))
        for name, argv, attached_to in runs:
            go = work / f"go-{name}"
            child = launcher.start([*argv, go], env={"RANK": str(RANKS[name]), "LOCAL_RANK": "0", "WORLD_SIZE": "16"})
            try:
                # the agent has seen the process (its rank read from its environment) ...
                ok = wait_until(lambda: query(agent.db, "SELECT rank FROM processes WHERE pid = ?", (child.pid,))
                                == [(RANKS[name],)], timeout=120)
                assert ok, f"process {child.pid} ({name}) was not tracked with its rank"
                if attached_to is not None:    # ... and attached to what it maps (or is)
                    ok = wait_until(lambda: scalar(agent.db, "SELECT count(*) FROM probes WHERE name LIKE 'uprobe:%' "
                                                             "AND library = ?", (str(attached_to),)) > 0, timeout=120)
                    assert ok, f"{attached_to} was not attached:\n" + "\n".join(agent.stderr_lines[-10:])
            finally:
                go.touch()
            rc, out, err = child.wait(180)
            assert rc == 0, err
            results[name] = (json.loads(out), child.pid)
        for name, (output, pid) in results.items():     # every call the programs made has reached the store:
            rows, made = expected_calls(output)          # its row if it failed, its count in any case
            wait_until(lambda: scalar(agent.db, "SELECT count(*) FROM events WHERE pid = ? AND source IN "
                                                "('cuda', 'driver', 'nccl')", (pid,)) >= rows
                       and scalar(agent.db, "SELECT coalesce(SUM(count), 0) FROM aggregates WHERE pid = ? AND source IN "
                                            "('cuda', 'driver', 'nccl')", (pid,)) >= made, timeout=60)
        yield dict(results=results, agent=agent, db=agent.db, programs=programs, nvidia=nvidia)
    finally:
        agent.stop(signal.SIGKILL)          # (test_agent.py tests SIGTERM's orderly exit; this saves its detaches)
        launcher.close()


def expected_calls(output):
    """(rows, calls) a program's calls make: a row for each failing call (the others are only counted
    in the aggregates, written each interval), and every call counted."""
    if "calls" in output:
        pairs = [(1, ret) for rets in output["calls"].values() for ret in rets]
    else:
        pairs = [tuple(v) for v in output.values()]
    return sum(n for n, ret in pairs if ret != 0), sum(n for n, _ in pairs)


def rows_of(db, pid):
    return query(db, "SELECT op, ret, rank, node, source, COUNT(*) FROM events WHERE pid = ? AND source IN "
                     "('cuda', 'driver', 'nccl') GROUP BY op, ret, rank, node, source ORDER BY op, ret", (pid,))


def assert_one_row_per_call(traced, name, source):
    """Each failing call one row (op, code, rank, node), and every call, failing or not, counted in the
    kernel's aggregates (a fast call that succeeds gets no row of its own: --sample 0)."""
    output, pid = traced["results"][name]
    want, made = {}, {}
    for op, rets in output["calls"].items():
        made[op] = len(rets)
        for ret in rets:
            if ret != 0:
                want[(op, ret)] = want.get((op, ret), 0) + 1
    # a call that succeeds has a row only when it was slow or off CPU, or is a synchronize (the slow threshold adapts to the
    # call's median: a scheduling stall on this shared machine can make a 2 µs ncclGroupStart "slow")
    got = {(op, ret): n for op, ret, rank, node, src, n in rows_of(traced["db"], pid)
           if rank == RANKS[name] and node == NODE and src == source and ret != 0}
    succeeded = query(traced["db"], "SELECT op, json_extract(detail, '$.why') FROM events WHERE pid = ? AND ret = 0 "
                                    "AND source = ?", (pid, source))
    assert all(why and set(json.loads(why)) <= {"slow", "offcpu"} | ({"sync"} if op in SYNC_OPS else set())
               for op, why in succeeded), (name, succeeded)
    assert got == want and want, (name, got, want)
    counted = dict(query(traced["db"], "SELECT op, SUM(count) FROM aggregates WHERE pid = ? AND source IN "
                                       "('cuda', 'driver', 'nccl') GROUP BY op", (pid,)))
    assert counted == made, (name, counted, made)


def test_the_cuda_12_runtime_from_its_wheel_in_a_virtualenv(traced):
    assert_one_row_per_call(traced, "cudart12", "cuda")
    libs = {lib for (lib,) in query(traced["db"], "SELECT DISTINCT library FROM probes WHERE name LIKE 'uprobe:%'")}
    assert str(traced["nvidia"]["cudart12"]) in libs


def test_nccl_from_its_wheel_with_each_calls_arguments(traced):
    from nvidia_workload import NCCL_CALLS
    assert_one_row_per_call(traced, "nccl", "nccl")
    output, pid = traced["results"]["nccl"]
    assert set(output["calls"]["ncclAllReduce"]) == {4}          # ncclInvalidArgument: not a communicator
    for op, (times, args) in NCCL_CALLS.items():
        details = [json.loads(d) for (d,) in query(traced["db"], "SELECT detail FROM events WHERE pid = ? AND op = ?",
                                                     (pid, op))]
        assert len(details) == times
        for detail in details:
            assert {k: detail.get(k) for k in args} == args, (op, detail)
            assert detail["comm"] == output["comm"] != "0x0" and own_reasons(detail) == ["error", "collective"]
            assert not {"op", "root", "peer"} - set(args) & set(detail), (op, detail)   # only what the call has
    sizes = dict(query(traced["db"], "SELECT op, MIN(bytes) FROM events WHERE pid = ? GROUP BY op", (pid,)))
    assert sizes["ncclAllReduce"] == 4000 and sizes["ncclReduce"] == 128 and sizes["ncclSend"] == 64


def test_nccl_communicator_set_up_is_recorded_with_its_arguments(traced):
    """ncclCommInitRank(Config) and ncclCommSplit always get a row (they define the communicators explain
    groups the collectives by): nranks, rank and the id's magic, or the parent, color and key."""
    from nvidia_workload import SETUP
    output, pid = traced["results"]["nccl"]
    rows = query(traced["db"], "SELECT op, ret, detail FROM events WHERE pid = ? AND op IN ('ncclCommInitRank', "
                               "'ncclCommSplit') ORDER BY ts", (pid,))
    assert [(op, ret) for op, ret, _ in rows] == [("ncclCommInitRank", 1), ("ncclCommInitRank", 1), ("ncclCommSplit", 1)]
    init, init_config, split = (json.loads(d) for _, _, d in rows)
    assert [own_reasons(d) for d in (init, init_config, split)] == [["error", "setup"]] * 3
    magic = f"0x{SETUP['id']:016x}"
    assert without_why(init) == {"nranks": 4, "rank": 2, "id": magic, "comm": "0x0"}
    assert without_why(init_config) == {"nranks": 4, "rank": 3, "id": magic, "comm": "0x0",
                                        "symbol": "ncclCommInitRankConfig"}
    assert without_why(split) == {"color": 1, "key": 7, "parent": output["comm"], "comm": "0x0"}


def own_reasons(detail):
    """Why a call got a row, less what the machine's load decides: a call that failed at once may still be
    preempted on a busy machine, and is then recorded as off-CPU or slow too."""
    return [w for w in detail["why"] if w not in ("offcpu", "slow")]


def without_why(detail):
    return {k: v for k, v in detail.items() if k != "why"}


def _nvcc_case(traced, kind):
    if traced["programs"][kind] is None:
        pytest.skip("no nvcc on this machine: the nvcc-built programs are not tested")
    output, pid = traced["results"][kind]
    got = {}
    for op, ret, rank, node, source, n in rows_of(traced["db"], pid):
        assert (rank, node, source) == (RANKS[kind], NODE, "cuda")
        got[op] = got.get(op, 0) + n
    rets = {op: ret for op, ret, *_ in rows_of(traced["db"], pid)}
    assert got == {"cudaMalloc": output["cudaMalloc"][0], "cudaLaunchKernel": output["launch"][0],
                   "cudaDeviceSynchronize": output["cudaDeviceSynchronize"][0]}, got
    assert rets["cudaMalloc"] == output["cudaMalloc"][1] and rets["cudaDeviceSynchronize"] == output["cudaDeviceSynchronize"][1]
    return pid


def test_an_nvcc_program_with_the_shared_runtime(traced):
    _nvcc_case(traced, "shared")


def test_an_nvcc_program_with_the_runtime_linked_in_statically_is_attached_itself(traced):
    _nvcc_case(traced, "static")
    exe = str(traced["programs"]["static"])
    attached = {n[len("uprobe:"):] for (n,) in query(traced["db"], "SELECT name FROM probes WHERE library = ? AND "
                                                                      "name LIKE 'uprobe:%'", (exe,))}
    assert {"cudaMalloc", "cudaLaunchKernel", "cudaDeviceSynchronize"} <= attached


def test_functions_a_library_lacks_are_listed_in_probes_and_status(traced):
    lib = str(traced["programs"]["malloc"])
    assert_one_row_per_call(traced, "malloc", "cuda")
    missing = {n for (n,) in query(traced["db"], "SELECT name FROM probes WHERE library = ? AND name LIKE 'missing:%'",
                                   (lib,))}
    assert missing == {"missing:cudaLaunchKernel", "missing:cudaFree", "missing:cudaMemcpy", "missing:cudaMemcpyAsync",
                       "missing:cudaStreamSynchronize", "missing:cudaDeviceSynchronize"}
    status = json.loads(subprocess.run([sys.executable, "-m", "straggler.cli", "status", "--db", traced["db"], "--json"],
                                       capture_output=True, text=True, timeout=60, check=True).stdout)
    assert status["libraries"][lib]["attached"] == ["cudaMalloc"]
    assert sorted(status["libraries"][lib]["missing"]) == sorted(m[len("missing:"):] for m in missing)
    # the wheels' libraries have everything the agent traces
    assert status["libraries"][str(traced["nvidia"]["nccl"])]["missing"] == []
    text = subprocess.run([sys.executable, "-m", "straggler.cli", "status", "--db", traced["db"]],
                          capture_output=True, text=True, timeout=60, check=True).stdout
    assert "expected but missing" in text and "cudaLaunchKernel" in text


def test_explain_names_the_failing_calls_with_their_codes(traced):
    from straggler.analysis.explain import explain_db
    report = explain_db(traced["db"])
    errors = [f for f in report.findings if f.cause == "cuda-errors"]
    assert [f.node for f in errors] == [NODE] and errors[0].severity == "critical"
    summary = errors[0].summary
    assert "cudaMalloc → 35 cudaErrorInsufficientDriver" in summary and "ncclAllReduce → 4 ncclInvalidArgument ×30" in summary
    failed = sum(expected_calls(output)[0] for output, _ in traced["results"].values())
    made = sum(expected_calls(output)[1] for output, _ in traced["results"].values())
    assert (errors[0].numbers["failed_calls"], errors[0].numbers["calls"]) == (failed, made)
    assert failed < made                                           # ncclGroupStart succeeds: counted, no row
