"""On a node with an NVIDIA GPU and driver: run real kernels through the driver API alone (no CUDA
toolkit: cuModuleLoadData on a PTX string, cuLaunchKernel, cuCtxSynchronize) under the agent, and
print what the agent recorded beside the program's own count and timings.

    sudo .venv/bin/python bench/gpu_driver_check.py [--launches 2000] [--out results.json]

Needs root (eBPF) and libcuda.so.1 (the driver). Where there is no driver it says so and exits 2:
it is a check for GPU machines, not part of `make bench` (bench/run_all.py runs bench_*.py only).
Every wait is bounded; the agent and the program are ended by pid.
"""
import argparse
import ctypes
import ctypes.util
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OPS = ("cuLaunchKernel", "cuCtxSynchronize", "cuMemAlloc")   # the driver calls the agent traces here

# y[i] = x[i] + 1 for i < n: PTX ISA 6.0 for sm_50, which the driver JIT-compiles for any newer GPU
PTX = b"""
.version 6.0
.target sm_50
.address_size 64
.visible .entry add_one(.param .u64 x, .param .u32 n)
{
    .reg .pred %p;
    .reg .b32 %r<5>;
    .reg .f32 %f<3>;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd1, [x];
    ld.param.u32 %r1, [n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r2, %r2, %r3, %r4;
    setp.ge.u32 %p, %r2, %r1;
    @%p bra DONE;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r2, 4;
    add.s64 %rd4, %rd2, %rd3;
    ld.global.f32 %f1, [%rd4];
    add.f32 %f2, %f1, 0f3F800000;
    st.global.f32 [%rd4], %f2;
DONE:
    ret;
}
\x00"""


def find_driver():
    for name in ("libcuda.so.1", ctypes.util.find_library("cuda")):
        if not name:
            continue
        try:
            ctypes.CDLL(name)
            return name
        except OSError:
            continue
    return None


def program(lib_name, launches, go_file):
    """The traced program: waits for go_file, then runs the kernel `launches` times; prints JSON."""
    cuda = ctypes.CDLL(lib_name)
    deadline = time.monotonic() + 300
    while not os.path.exists(go_file):
        if time.monotonic() > deadline:
            raise SystemExit("gpu_driver_check: no go signal within 300 s")
        time.sleep(0.05)

    def check(what, code):
        if code != 0:
            raise SystemExit(f"gpu_driver_check: {what} returned CUDA error {code}")

    calls = {op: [] for op in OPS}

    def timed(op, fn, *args):
        started = time.perf_counter_ns()
        code = fn(*args)
        calls[op].append(time.perf_counter_ns() - started)
        return code

    check("cuInit", cuda.cuInit(0))
    device, context, module, function = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    check("cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(device), 0))
    check("cuCtxCreate", cuda.cuCtxCreate_v2(ctypes.byref(context), 0, device))
    check("cuModuleLoadData", cuda.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(PTX)))
    check("cuModuleGetFunction", cuda.cuModuleGetFunction(ctypes.byref(function), module, b"add_one"))
    n = 1 << 20
    buffer = ctypes.c_uint64()
    check("cuMemAlloc", timed("cuMemAlloc", cuda.cuMemAlloc_v2, ctypes.byref(buffer), ctypes.c_size_t(4 * n)))
    x_arg, n_arg = ctypes.c_uint64(buffer.value), ctypes.c_uint32(n)
    params = (ctypes.c_void_p * 2)(ctypes.cast(ctypes.byref(x_arg), ctypes.c_void_p),
                                   ctypes.cast(ctypes.byref(n_arg), ctypes.c_void_p))
    wall = time.perf_counter_ns()
    for i in range(launches):
        check("cuLaunchKernel", timed("cuLaunchKernel", cuda.cuLaunchKernel, function, (n + 255) // 256, 1, 1, 256, 1, 1,
                                      0, None, params, None))
        if i % 100 == 99:
            check("cuCtxSynchronize", timed("cuCtxSynchronize", cuda.cuCtxSynchronize))
    check("cuCtxSynchronize", timed("cuCtxSynchronize", cuda.cuCtxSynchronize))
    wall = time.perf_counter_ns() - wall
    cuda.cuMemFree_v2(buffer)
    cuda.cuCtxDestroy_v2(context)
    print(json.dumps({"wall_ns": wall, "calls": {op: {"count": len(v), "total_ns": sum(v)} for op, v in calls.items()}}))


def _query(db, sql, params=()):
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
        try:
            return conn.execute(sql, params).fetchall()
        finally:
            conn.close()
    except sqlite3.Error:
        return []


def _wait(predicate, timeout_s):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.3)
    return False


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--launches", type=int, default=2000)
    parser.add_argument("--out", default=None, help="also write the comparison as JSON here")
    parser.add_argument("--program", nargs=3, metavar=("LIB", "LAUNCHES", "GO"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.program:
        program(args.program[0], int(args.program[1]), args.program[2])
        return 0
    driver = find_driver()
    if driver is None:
        print("gpu_driver_check: no NVIDIA driver here (libcuda.so.1 does not load); run it on a GPU node", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("gpu_driver_check: the agent needs root (eBPF); run with sudo", file=sys.stderr)
        return 2
    env = {**os.environ, "PYTHONPATH": str(REPO / "agent")}
    with tempfile.TemporaryDirectory(prefix="straggler-gpu-check-") as work:
        db, go = os.path.join(work, "trace.db"), os.path.join(work, "go")
        child = subprocess.Popen([sys.executable, __file__, "--program", driver, str(args.launches), go],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        agent = subprocess.Popen([sys.executable, "-m", "straggler.cli", "trace", "--db", db, "--node", "gpu-check",
                                  "--pid", str(child.pid), "--sample", "0", "--interval", "1", "--rescan", "0.3"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        try:
            attached = _wait(lambda: _query(db, "SELECT count(*) FROM probes WHERE name LIKE 'uprobe:%' AND "
                                                "library LIKE '%libcuda%'") not in ([], [(0,)]), 300)
            open(go, "w").close()
            out, err = child.communicate(timeout=600)
            if child.returncode != 0:
                print(err.strip(), file=sys.stderr)
                return 1
            made = json.loads(out)
            expected = sum(c["count"] for c in made["calls"].values())
            _wait(lambda: (_query(db, "SELECT coalesce(SUM(count), 0) FROM aggregates WHERE pid = ?", (child.pid,))
                           or [(0,)])[0][0] >= expected, 60)
            recorded = {op: (count, total) for op, count, total in _query(
                db, "SELECT op, SUM(count), SUM(sum_ns) FROM aggregates WHERE pid = ? GROUP BY op", (child.pid,))}
        finally:
            for proc in (agent, child):
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    try:
                        proc.wait(60)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait(10)
    report = {"driver": driver, "attached": attached, "wall_ns": made["wall_ns"], "ops": {}}
    print(f"driver {driver}; libcuda attached: {attached}; {args.launches} launches in {made['wall_ns'] / 1e6:.1f} ms")
    print(f"{'op':<18} {'program calls':>13} {'recorded':>9} {'program mean us':>16} {'recorded mean us':>17}")
    for op in OPS:
        mine = made["calls"][op]
        count, total = recorded.get(op, (0, 0))
        report["ops"][op] = {"program": mine, "recorded": {"count": count, "total_ns": total}}
        mean = mine["total_ns"] / mine["count"] / 1e3 if mine["count"] else 0.0
        rec_mean = total / count / 1e3 if count else 0.0
        print(f"{op:<18} {mine['count']:>13} {count:>9} {mean:>16.2f} {rec_mean:>17.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return 0 if all(report["ops"][op]["recorded"]["count"] == report["ops"][op]["program"]["count"] for op in OPS) else 1


if __name__ == "__main__":
    sys.exit(main())
