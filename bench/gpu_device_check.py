"""On a node with an NVIDIA GPU: does the agent's GPU reader say what nvidia-smi says, what does its
sampler write and cost under a real CUDA workload, and does /metrics show it? A short prepared check
for the day a GPU machine is lent (a few minutes, no network); on a node without a GPU it says so in
one line and exits 0 ("skipped").

    sudo .venv/bin/python bench/gpu_device_check.py [--seconds 20] [--out bench/results/gpu_device_check.json]

  (a) NVML through the agent's own reader (straggler.devices.nvml) read just before and just after
      `nvidia-smi -q -x`, per GPU (matched by UUID): SM and memory clocks and their maximum, temperature,
      power draw and limit, memory used and total, PCIe generation and width and their maximum, the
      clock-event (throttle) reasons, volatile ECC counts and remapped rows. One line per field:
      agree (nvidia-smi's value within the reader's before..after range, widened by the field's
      tolerance), differ, or missing (one side does not report it: which one is said).
  (b) `straggler trace --pid WORKLOAD` for --seconds while a small CUDA workload runs (torch, else
      cupy, else none: an idle process); where the agent cannot start (no root, no BCC, no eBPF) the
      agent's device thread alone (DeviceMonitor, the same code the agent runs) for the same time.
      Reports the gpu_samples rows written, what they saw under load (utilization, power, SM clock), the
      workload's process among gpu_processes, and the sampler's own CPU: the device thread's CPU (meta
      devices_cpu_ns, bench/bench_devices.py's direct measure) per sampling round and per GPU row.
  (c) /metrics rendered from that store (straggler.api.metrics): every GPU has its DCGM_FI_DEV_* series.

Exit 0 with a one-line summary when every compared field agrees (or is missing on nvidia-smi's side
only), samples were written and /metrics shows every GPU; 1 otherwise. Writes the comparison and the
run as JSON (--out). Every step runs in a child process under a timeout; the children are ended by pid.
Not part of `make bench` (bench/run_all.py runs bench_*.py only). Needs nvidia-ml-py (`pip install
'straggler[gpu]'`); prometheus-client for (c).
This file must not be imported by the agent; it drives the product as a user would.
"""
import argparse
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "agent"))

DEFAULT_OUT = REPO / "bench" / "results" / "gpu_device_check.json"
SMI_TIMEOUT_S = 60               # one nvidia-smi -q -x
READ_TIMEOUT_S = 120             # the NVML reads around it
START_TIMEOUT_S = 180            # the workload's imports, the agent's BPF compile
STOP_TIMEOUT_S = 60
NODE = "gpu-check"
MIB = 1 << 20

# field: (tolerance absolute, relative, what nvidia-smi's side is read from)
FIELDS = {
    "sm_clock_mhz": (30, 0.05, "clocks/sm_clock"),
    "sm_clock_max_mhz": (0, 0, "max_clocks/sm_clock"),
    "mem_clock_mhz": (30, 0.05, "clocks/mem_clock"),
    "mem_clock_max_mhz": (0, 0, "max_clocks/mem_clock"),
    "temperature_c": (3, 0, "temperature/gpu_temp"),
    "power_mw": (10_000, 0.10, "(gpu_)power_readings: power_draw, average_ or instant_power_draw (W)"),
    "power_limit_mw": (1_000, 0, "(gpu_)power_readings: enforced_ or current_power_limit (W)"),
    "mem_used_bytes": (64 * MIB, 0.01, "fb_memory_usage: used, or used + reserved (MiB)"),
    "mem_total_bytes": (MIB, 0, "fb_memory_usage/total (MiB)"),
    "pcie_gen": (0, 0, "pci/pci_gpu_link_info/pcie_gen/current_link_gen"),
    "pcie_gen_max": (0, 0, "pci/pci_gpu_link_info/pcie_gen/max_link_gen"),
    "pcie_width": (0, 0, "pci/pci_gpu_link_info/link_widths/current_link_width"),
    "pcie_width_max": (0, 0, "pci/pci_gpu_link_info/link_widths/max_link_width"),
    "clock_event_names": (None, None, "clocks_event_reasons (or clocks_throttle_reasons): the Active ones"),
    "ecc_corrected": (0, 0, "ecc_errors/volatile: the correctable counts summed (or single_bit/total)"),
    "ecc_uncorrected": (0, 0, "ecc_errors/volatile: the uncorrectable counts summed (or double_bit/total)"),
    "remapped_rows_corrected": (0, 0, "remapped_rows/remapped_row_corr"),
    "remapped_rows_uncorrected": (0, 0, "remapped_rows/remapped_row_unc"),
    "remap_pending": (0, 0, "remapped_rows/remapped_row_pending"),
    "remap_failure": (0, 0, "remapped_rows/remapped_row_failure"),
}


# ---------------------------------------------------------------- children (run as --part NAME)

def part_read():
    """NVML (the agent's reader) before and after nvidia-smi -q -x; prints one JSON object."""
    out = {}
    try:
        from straggler.devices.nvml import Nvml, NvmlUnavailable
    except ImportError as exc:
        print(json.dumps({"nvml_error": f"the agent's reader does not import ({exc})"}))
        return 0
    nvml = Nvml()
    try:
        nvml.open()
    except NvmlUnavailable as exc:
        out["nvml_error"] = str(exc)
        nvml = None
    if nvml is not None:
        out["driver"] = nvml.driver_version
        out["gpus"] = [{"index": g.index, "uuid": g.uuid, "name": g.name, "pci_bus_id": g.pci_bus_id}
                       for g in nvml.gpus]
        out["before"] = {g.uuid: nvml.sample(g, counters=True) for g in nvml.gpus}
    smi = shutil.which("nvidia-smi")
    if smi is None:
        out["smi_error"] = "nvidia-smi is not on PATH"
    else:
        try:
            proc = subprocess.run([smi, "-q", "-x"], capture_output=True, text=True, timeout=SMI_TIMEOUT_S)
            if proc.returncode == 0:
                out["smi_xml"] = proc.stdout
            else:
                said = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
                out["smi_error"] = f"nvidia-smi -q -x exited {proc.returncode}" + (f": {said[-1]}" if said else "")
        except subprocess.TimeoutExpired:
            out["smi_error"] = f"nvidia-smi -q -x did not answer within {SMI_TIMEOUT_S} s"
    if nvml is not None:
        out["after"] = {g.uuid: nvml.sample(g, counters=True) for g in nvml.gpus}
        nvml.close()
    print(json.dumps(out))
    return 0


def part_workload(seconds, go_file):
    """A small CUDA load for `seconds` after go_file appears: torch, else cupy, else none (idle)."""
    kind, why, step = "none", None, None
    try:
        import torch
        if torch.cuda.is_available():
            a = torch.randn(4096, 4096, device="cuda")

            def step():
                (a @ a).sum().item()             # a matmul and a synchronizing read back
            kind = f"torch {torch.__version__}"
        else:
            why = "torch sees no CUDA device"
    except ImportError:
        why = "torch is not installed"
    except Exception as exc:                      # a CUDA error at the first allocation
        why = f"torch: {type(exc).__name__}: {exc}"
    if step is None:
        try:
            import cupy
            a = cupy.random.random((4096, 4096), dtype=cupy.float32)

            def step():
                float((a @ a).sum())
            kind = f"cupy {cupy.__version__}"
        except Exception as exc:                  # not installed, or no device: no load
            why = f"{why}; cupy: {type(exc).__name__}: {exc}"
    print("ready", flush=True)
    deadline = time.monotonic() + START_TIMEOUT_S + 60
    while not os.path.exists(go_file):
        if time.monotonic() > deadline:
            print(json.dumps({"kind": kind, "error": "no go signal"}))
            return 1
        time.sleep(0.05)
    iterations, started = 0, time.monotonic()
    while time.monotonic() - started < seconds:
        if step is None:
            time.sleep(0.2)
        else:
            step()
            iterations += 1
    print(json.dumps({"kind": kind, "why_none": why if step is None else None, "iterations": iterations,
                      "seconds": round(time.monotonic() - started, 2)}))
    return 0


def part_monitor(db, seconds, interval_s):
    """The agent's device thread alone (no eBPF) into a store for `seconds`; prints its own count and CPU."""
    from straggler.devices.monitor import DeviceMonitor
    from straggler.store.writer import StoreWriter
    writer = StoreWriter(db, NODE)
    writer.start()
    monitor = DeviceMonitor(NODE, writer.submit, writer.set_meta, interval_ns=int(interval_s * 1e9))
    notices = monitor.start()
    started = time.monotonic_ns()
    time.sleep(seconds)
    monitor.stop()
    elapsed = time.monotonic_ns() - started
    writer.set_meta("agent_started_ns", started)
    writer.set_meta("agent_stopped_ns", started + elapsed)
    writer.flush()
    writer.stop()
    print(json.dumps({"notices": notices, "cpu_ns": monitor.cpu_ns, "samples": monitor.samples_written,
                      "elapsed_ns": elapsed}))
    return 0


# ---------------------------------------------------------------- nvidia-smi's XML

def _number(text):
    """'1980 MHz' -> 1980.0, '16x' -> 16.0, 'Yes' -> 1, 'No' -> 0; None for N/A and the like."""
    if text is None:
        return None
    word = text.strip().split(" ")[0].rstrip("x")
    if word in ("Yes", "No"):
        return 1 if word == "Yes" else 0
    try:
        return float(word)
    except ValueError:
        return None


def _first(gpu, *paths):
    for path in paths:
        value = _number(gpu.findtext(path))
        if value is not None:
            return value
    return None


def _sum(node, names):
    if node is None:
        return None
    values = [_number(node.findtext(n)) for n in names]
    values = [v for v in values if v is not None]
    return sum(values) if values else None


def parse_smi(xml_text):
    """{uuid: {field: [candidate values in the agent's units]}} from nvidia-smi -q -x."""
    root = ET.fromstring(xml_text)
    out = {}
    for gpu in root.findall("gpu"):
        uuid = (gpu.findtext("uuid") or "").strip()
        f = {}

        def put(field, *values, scale=1):
            f[field] = [v * scale for v in values if v is not None]

        put("sm_clock_mhz", _first(gpu, "clocks/sm_clock"))
        put("sm_clock_max_mhz", _first(gpu, "max_clocks/sm_clock"))
        put("mem_clock_mhz", _first(gpu, "clocks/mem_clock"))
        put("mem_clock_max_mhz", _first(gpu, "max_clocks/mem_clock"))
        put("temperature_c", _first(gpu, "temperature/gpu_temp"))
        put("power_mw", *[_number(gpu.findtext(f"{p}/{n}")) for p in ("gpu_power_readings", "power_readings")
                          for n in ("power_draw", "average_power_draw", "instant_power_draw")], scale=1000)
        put("power_limit_mw", *[_number(gpu.findtext(f"{p}/{n}")) for p in ("gpu_power_readings", "power_readings")
                                for n in ("enforced_power_limit", "current_power_limit")], scale=1000)
        used, reserved = _number(gpu.findtext("fb_memory_usage/used")), _number(gpu.findtext("fb_memory_usage/reserved"))
        put("mem_used_bytes", used, used + reserved if used is not None and reserved is not None else None, scale=MIB)
        put("mem_total_bytes", _first(gpu, "fb_memory_usage/total"), scale=MIB)
        link = "pci/pci_gpu_link_info"
        put("pcie_gen", _first(gpu, f"{link}/pcie_gen/current_link_gen"))
        put("pcie_gen_max", _first(gpu, f"{link}/pcie_gen/max_link_gen"))
        put("pcie_width", _first(gpu, f"{link}/link_widths/current_link_width"))
        put("pcie_width_max", _first(gpu, f"{link}/link_widths/max_link_width"))
        reasons = gpu.find("clocks_event_reasons")
        if reasons is None:
            reasons = gpu.find("clocks_throttle_reasons")
        if reasons is not None:
            listed, active = set(), set()
            for child in reasons:
                name = child.tag.replace("clocks_event_reason_", "").replace("clocks_throttle_reason_", "")
                name = {"display_clocks_setting": "display_clock_setting"}.get(name, name)
                listed.add(name)
                if (child.text or "").strip() == "Active":
                    active.add(name)
            f["clock_event_names"] = {"listed": sorted(listed), "active": sorted(active)}
        volatile = gpu.find("ecc_errors/volatile")
        put("ecc_corrected", _sum(volatile, ("sram_correctable", "dram_correctable")) if volatile is not None and
            volatile.find("single_bit") is None else _first(gpu, "ecc_errors/volatile/single_bit/total"))
        put("ecc_uncorrected", _sum(volatile, ("sram_uncorrectable", "sram_uncorrectable_parity",
                                               "sram_uncorrectable_secded", "dram_uncorrectable"))
            if volatile is not None and volatile.find("double_bit") is None
            else _first(gpu, "ecc_errors/volatile/double_bit/total"))
        put("remapped_rows_corrected", _first(gpu, "remapped_rows/remapped_row_corr"))
        put("remapped_rows_uncorrected", _first(gpu, "remapped_rows/remapped_row_unc"))
        put("remap_pending", _first(gpu, "remapped_rows/remapped_row_pending"))
        put("remap_failure", _first(gpu, "remapped_rows/remapped_row_failure"))
        out[uuid] = {"name": (gpu.findtext("product_name") or "").strip(), "bus": gpu.get("id"), "fields": f}
    return out


def compare_field(field, before, after, smi):
    """(status, detail) for one field of one GPU: agree | differ | missing."""
    ours = [v for v in (before.get(field), after.get(field)) if v is not None and v != ""]
    if field == "clock_event_names":
        if smi is None and not ours and before.get(field) is None:
            return "missing", "neither reports it"
        if smi is None:
            return "missing", "nvidia-smi lists no clock-event reasons"
        if before.get(field) is None and after.get(field) is None:
            return "missing", "the reader has none (nvidia-smi: " + (",".join(smi["active"]) or "none active") + ")"
        listed = set(smi["listed"])
        seen = [sorted(set(filter(None, (v or "").split(","))) & listed) for v in (before.get(field), after.get(field))]
        verdict = "agree" if sorted(smi["active"]) in seen else "differ"
        return verdict, f"reader {' / '.join(','.join(s) or 'none' for s in seen)}; nvidia-smi " \
                        f"{','.join(smi['active']) or 'none'}"
    if not ours and not smi:
        return "missing", "neither reports it"
    if not ours:
        return "missing", f"the reader has none; nvidia-smi {smi[0]:g}"
    if not smi:
        return "missing", f"nvidia-smi has none; reader {ours[0]:g}"
    tol_abs, tol_rel, _ = FIELDS[field]
    low, high = min(ours), max(ours)
    slack = max(tol_abs, tol_rel * high)
    agreeing = [v for v in smi if low - slack <= v <= high + slack]
    shown = f"reader {low:g}" + (f"..{high:g}" if high != low else "")
    verdict = "agree" if agreeing else "differ"
    return verdict, f"{shown}; nvidia-smi {' or '.join(f'{v:g}' for v in smi)}" + (f" (±{slack:g})" if slack else "")


# ---------------------------------------------------------------- the parent

def run_child(args, timeout_s, env=None):
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, timeout=timeout_s,
                          env=env)
    last = proc.stdout.strip().splitlines()[-1:] or [""]
    try:
        return json.loads(last[0]), proc
    except ValueError:
        return None, proc


def stop(proc, timeout_s=STOP_TIMEOUT_S):
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def query(db, sql, params=()):
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def start_agent(db, pid, seconds, env):
    """`straggler trace` on the workload; (process, None) once it is tracing, or (None, why not)."""
    cmd = [sys.executable, "-m", "straggler.cli", "trace", "--db", db, "--node", NODE, "--pid", str(pid),
           "--interval", "1", "--gpu-interval", "1", "--duration", f"{int(seconds + START_TIMEOUT_S + 30)}s"]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=env)
    lines, ready = [], threading.Event()

    def read():
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))
            if line.startswith("straggler: tracing ("):
                ready.set()
    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready.wait(0.2):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            why = next((ln for ln in reversed(lines) if ln.strip()), "no output") if lines else \
                f"not tracing within {START_TIMEOUT_S} s"
            return None, why, lines
    return proc, None, lines


def run_load(seconds, work, env, agent_allowed=True):
    """(b): the workload under the agent, or under the device thread alone. Returns the report."""
    db, go = str(work / "trace.db"), str(work / "go")
    report = {"seconds": seconds}
    workload = subprocess.Popen([sys.executable, __file__, "--part", "workload", "--seconds", str(seconds),
                                 "--go", go], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    agent = monitor = None
    try:
        first = []
        reader = threading.Thread(target=lambda: first.append(workload.stdout.readline()), daemon=True)
        reader.start()
        reader.join(START_TIMEOUT_S)                          # its imports (torch: seconds), bounded
        ready = bool(first) and first[0].strip() == "ready"
        if not ready:
            report["error"] = "the workload did not start: " + (workload.stderr.read()[-500:] if
                                                                 workload.poll() is not None else "no ready line")
            return report, db
        if not agent_allowed:
            agent, why = None, "--device-thread-only"
        elif os.geteuid() != 0:
            agent, why = None, "not root (the agent loads eBPF programs)"
        else:
            agent, why, _ = start_agent(db, workload.pid, seconds, env)
        if agent is not None:
            report["mode"] = "straggler trace"
            cpu0, t0 = cpu_seconds(agent.pid), time.monotonic()
        else:
            report["mode"] = "device thread alone (DeviceMonitor)"
            report["agent_not_started"] = why
            if os.path.exists(db):
                os.unlink(db)
            monitor = subprocess.Popen([sys.executable, __file__, "--part", "monitor", "--db", db, "--seconds",
                                        str(seconds + 2)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                       env=env)
            time.sleep(1)
        Path(go).touch()
        out, err = workload.communicate(timeout=seconds + START_TIMEOUT_S)
        try:
            report["workload"] = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            report["workload"] = {"error": (err.strip().splitlines() or ["no output"])[-1]}
        if agent is not None:
            time.sleep(2)                                     # the last samples and summaries
            cpu1, t1 = cpu_seconds(agent.pid), time.monotonic()
            report["agent_cpu_percent"] = round(100 * (cpu1 - cpu0) / (t1 - t0), 3)
            stop(agent)
            agent = None
        else:
            out, err = monitor.communicate(timeout=seconds + READ_TIMEOUT_S)
            monitor = None
            try:
                report["monitor"] = json.loads(out.strip().splitlines()[-1])
            except (ValueError, IndexError):
                report["error"] = "the device thread did not report: " + (err.strip().splitlines() or [""])[-1]
                return report, db
    except subprocess.TimeoutExpired as exc:
        report["error"] = f"timed out: {' '.join(map(str, exc.cmd[-4:]))} after {exc.timeout:.0f} s"
        return report, db
    finally:
        for proc in (agent, monitor, workload):
            stop(proc)
    if not os.path.exists(db):
        report["error"] = "no store was written"
        return report, db
    meta = dict(query(db, "SELECT key, value FROM meta"))
    rows, rounds, gpus = query(db, "SELECT count(*), count(DISTINCT ts), count(DISTINCT gpu) FROM gpu_samples")[0]
    cpu_ns = int(meta.get("devices_cpu_ns") or (report.get("monitor") or {}).get("cpu_ns") or 0)
    started, stopped = int(meta.get("agent_started_ns") or 0), int(meta.get("agent_stopped_ns") or 0)
    report.update(devices_state=meta.get("devices_state"), devices_reason=meta.get("devices_reason"),
                  devices_error=meta.get("devices_error"), gpu_samples=rows, sampling_rounds=rounds, gpus_sampled=gpus,
                  device_thread_cpu_s=round(cpu_ns / 1e9, 4))
    if rounds:
        report["cpu_s_per_round"] = round(cpu_ns / 1e9 / rounds, 6)
        report["cpu_s_per_gpu_sample"] = round(cpu_ns / 1e9 / rows, 6)
    if stopped > started:
        report["device_thread_cpu_percent"] = round(100 * cpu_ns / (stopped - started), 3)
    seen = query(db, "SELECT gpu, max(util_gpu_pct), max(power_mw), min(sm_clock_mhz), max(sm_clock_mhz), "
                     "max(temperature_c), group_concat(DISTINCT clock_event_names) FROM gpu_samples GROUP BY gpu")
    report["under_load"] = [dict(zip(("gpu", "max_util_pct", "max_power_mw", "min_sm_mhz", "max_sm_mhz", "max_temp_c",
                                      "clock_events"), r)) for r in seen]
    report["workload_on_gpu"] = [dict(zip(("gpu", "how", "mem_used_bytes"), r)) for r in query(
        db, "SELECT gpu, how, max(mem_used_bytes) FROM gpu_processes WHERE pid = ? GROUP BY gpu, how", (workload.pid,))]
    return report, db


def check_metrics(db, gpu_indexes):
    """(c): the DCGM families of every sampled GPU on /metrics rendered from the store."""
    try:
        from prometheus_client.parser import text_string_to_metric_families
        from straggler.api import metrics
    except ImportError as exc:
        return {"error": f"not checked: {exc}"}
    newest = query(db, "SELECT max(ts) FROM gpu_samples")[0][0]
    if newest is None:
        return {"error": "no gpu_samples to show"}
    families = {f.name: f for f in text_string_to_metric_families(metrics.render(db, NODE, at_ns=newest).decode())}
    out = {}
    for name in ("DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_FB_USED",
                 "DCGM_FI_DEV_PCIE_LINK_GEN", "DCGM_FI_DEV_XID_ERRORS", "straggler_gpu_sample_age_seconds"):
        family = families.get(name)
        out[name] = {s.labels["gpu"]: s.value for s in family.samples} if family else {}
    out["gpus_shown"] = sorted(out["DCGM_FI_DEV_GPU_TEMP"])
    out["all_shown"] = sorted(str(g) for g in gpu_indexes) == out["gpus_shown"]
    labels = families["DCGM_FI_DEV_GPU_TEMP"].samples[0].labels if families.get("DCGM_FI_DEV_GPU_TEMP") else {}
    out["labels"] = labels
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the workload runs under the sampler")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="the JSON report (default %(default)s)")
    parser.add_argument("--device-thread-only", action="store_true",
                        help="run the agent's device thread alone under the workload, not `straggler trace`")
    parser.add_argument("--part", choices=("read", "workload", "monitor"), help=argparse.SUPPRESS)
    parser.add_argument("--go", help=argparse.SUPPRESS)
    parser.add_argument("--db", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.part == "read":
        return part_read()
    if args.part == "workload":
        return part_workload(args.seconds, args.go)
    if args.part == "monitor":
        return part_monitor(args.db, args.seconds, 1.0)

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "agent"),
                                                                     os.environ.get("PYTHONPATH")]))}
    try:
        read, proc = run_child(["--part", "read"], READ_TIMEOUT_S, env)
    except subprocess.TimeoutExpired:
        print(f"gpu_device_check: FAILED: NVML and nvidia-smi did not answer within {READ_TIMEOUT_S} s")
        return 1
    if read is None:
        print("gpu_device_check: FAILED: the NVML reader stopped: " + (proc.stderr.strip().splitlines() or ["?"])[-1])
        return 1
    if "nvml_error" in read and "smi_error" in read:
        print(f"gpu_device_check: skipped: no NVIDIA GPU here ({read['smi_error']}; {read['nvml_error']})")
        return 0
    report = {"driver": read.get("driver"), "machine": os.uname().release, "cpus": os.cpu_count(),
              "nvml_error": read.get("nvml_error"), "smi_error": read.get("smi_error"), "gpus": []}
    smi = parse_smi(read["smi_xml"]) if "smi_xml" in read else {}
    counts = {"agree": 0, "differ": 0, "missing": 0}
    ours_missing = []
    for gpu in read.get("gpus", []):
        before, after = read["before"][gpu["uuid"]], read["after"][gpu["uuid"]]
        theirs = smi.get(gpu["uuid"], {}).get("fields", {})
        entry = {**gpu, "fields": {}}
        print(f"GPU {gpu['index']} {gpu['name']} {gpu['uuid']} ({gpu['pci_bus_id']})")
        for field in FIELDS:
            status, detail = compare_field(field, before, after, theirs.get(field) or None)
            counts[status] += 1
            if status == "missing" and detail.startswith("the reader has none") and "neither" not in detail:
                ours_missing.append(f"GPU {gpu['index']} {field}")
            entry["fields"][field] = {"status": status, "detail": detail, "reader": [before.get(field),
                                                                                    after.get(field)],
                                      "nvidia_smi": theirs.get(field), "nvidia_smi_from": FIELDS[field][2]}
            print(f"  {field:<26} {status:<7} {detail}")
        report["gpus"].append(entry)
    if not read.get("gpus"):
        print(f"gpu_device_check: FAILED: nvidia-smi sees a GPU but the agent's reader does not: {read['nvml_error']}")
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(dict(report, smi_gpus=list(smi)), indent=2) + "\n")
        return 1
    with tempfile.TemporaryDirectory(prefix="straggler-gpu-device-check-") as tmp:
        load, db = run_load(args.seconds, Path(tmp), env, agent_allowed=not args.device_thread_only)
        report["load"] = load
        report["metrics"] = check_metrics(db, [g["index"] for g in read["gpus"]]) if load.get("gpu_samples") else \
            {"error": "no gpu_samples"}
    for key in ("mode", "agent_not_started", "workload", "gpu_samples", "sampling_rounds", "cpu_s_per_round",
                "cpu_s_per_gpu_sample", "device_thread_cpu_percent", "agent_cpu_percent", "under_load",
                "workload_on_gpu", "devices_error", "error"):
        if load.get(key) not in (None, [], ""):
            print(f"load  {key:<26} {json.dumps(load[key])}")
    print(f"metrics {json.dumps(report['metrics'])}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    problems = []
    if counts["differ"]:
        problems.append(f"{counts['differ']} field(s) differ")
    if ours_missing:
        problems.append("the reader lacks what nvidia-smi has: " + ", ".join(ours_missing))
    if "smi_xml" not in read:
        problems.append(f"no nvidia-smi to compare with ({read.get('smi_error')})")
    if not load.get("gpu_samples"):
        problems.append("no gpu_samples written" + (f" ({load['error']})" if load.get("error") else ""))
    if not report["metrics"].get("all_shown"):
        problems.append("/metrics does not show every GPU: " + str(report["metrics"].get("error") or
                                                                   report["metrics"].get("gpus_shown")))
    names = sorted({g["name"] for g in read["gpus"]})
    per_sample = f"{load['cpu_s_per_gpu_sample'] * 1e3:.3f} ms CPU per GPU sample" if load.get("cpu_s_per_gpu_sample") \
        else "sampler cost unknown"
    summary = (f"{len(read['gpus'])} GPU(s) ({', '.join(names)}; driver {read.get('driver')}): {counts['agree']} fields "
               f"agree, {counts['differ']} differ, {counts['missing']} missing; {load.get('mode', 'no load run')} "
               f"with {((load.get('workload') or {}).get('kind') or 'no').replace('none', 'no')} workload wrote {load.get('gpu_samples', 0)} "
               f"gpu_samples in {args.seconds:g} s, {per_sample}; /metrics shows GPU(s) "
               f"{','.join(report['metrics'].get('gpus_shown', [])) or 'none'}; {args.out}")
    print(f"gpu_device_check: {'FAILED: ' + '; '.join(problems) + ': ' if problems else 'OK: '}{summary}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
