"""The device sampler (straggler.devices: Nvml + DeviceMonitor) against the STAND-IN NVML library
(straggler_lab.standin.build_standin_nvml: libnvidia-ml.so.1 for this GPU-less machine), loaded by
nvidia-ml-py as it loads NVIDIA's. The stand-in's GPUs follow their ranks' control files, so each test
changes a control file and checks what the sampler writes: the configured values, a throttled GPU's
lower clock and its reason, a degraded PCIe link, ECC and remapped rows, NVLink counters, calls the
device does not support (NULL, never a stop), a lost GPU, which process uses which GPU (NVML's list,
from processes that loaded the stand-in libcuda; and /dev/nvidiaN fds), and no NVML or no pynvml at all.

The library is loaded into this process once (by path: nvidia-ml-py's dlopen of libnvidia-ml.so.1 then
finds it loaded); one test checks the LD_LIBRARY_PATH route the agent uses, in a subprocess."""
import ctypes
import os
import subprocess
import sys
import textwrap
import uuid as uuidlib

import pytest

pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is a development requirement (requirements-dev.txt)")

from straggler.devices.monitor import DeviceMonitor  # noqa: E402
from straggler.store.schema import GPU_SAMPLE_COLUMNS  # noqa: E402
from straggler_lab.standin import build_standin, build_standin_nvml, write_nvml_config  # noqa: E402

SECOND = 1_000_000_000
SM_MAX = (1980, 1755, 1410)


class Store:
    """What the monitor hands the StoreWriter: rows per table, meta."""

    def __init__(self):
        self.rows, self.meta = {}, {}

    def submit(self, table, rows):
        self.rows.setdefault(table, []).extend(rows)

    def set_meta(self, key, value):
        self.meta[key] = value

    def samples(self):
        """{gpu: [row dict, ...]} of gpu_samples, in order."""
        out = {}
        for row in self.rows.get("gpu_samples", []):
            d = dict(zip(GPU_SAMPLE_COLUMNS, row))
            out.setdefault(d["gpu"], []).append(d)
        return out

    def last(self, gpu):
        return self.samples()[gpu][-1]


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    lib_dir = tmp_path_factory.mktemp("standin")
    nvml = build_standin_nvml(lib_dir)
    ctypes.CDLL(nvml, mode=ctypes.RTLD_GLOBAL)      # nvidia-ml-py's CDLL("libnvidia-ml.so.1") finds this one
    return {"dir": lib_dir, "nvml": nvml, "libcuda": build_standin(lib_dir)}


def at_work(gpus, *indexes):
    """This process uses the stand-in GPUs `indexes` (the registry the stand-in libcuda writes for a
    process that loaded it: 'pid gpu bytes' lines): they work, the others idle."""
    registry = gpus["config"].with_name(gpus["config"].name + ".procs")
    registry.write_text("".join(f"{os.getpid()} {i} {1 << 30}\n" for i in indexes))


@pytest.fixture
def gpus(libs, tmp_path, monkeypatch):
    """Three stand-in GPUs, each with its rank's control file (empty: no fault); GPU 1's minor is 5."""
    config = tmp_path / "gpus.conf"
    tag = uuidlib.uuid4().hex[:8]
    spec = []
    for index in range(3):
        spec.append(dict(index=index, uuid=f"GPU-{tag}-0000-0000-0000-00000000000{index}", pci=f"0000:{0xc1 + index:02x}:00.0",
                         control=str(tmp_path / f"rank{index}.ctl"), sm_max_mhz=SM_MAX[index],
                         minor=5 if index == 1 else index, nvlinks=4 if index == 0 else 0,
                         unsupported="power,ecc" if index == 2 else ""))
    write_nvml_config(config, spec)
    monkeypatch.setenv("STRAGGLER_STANDIN_NVML_CONFIG", str(config))
    out = {"config": config, "spec": spec, "control": [tmp_path / f"rank{i}.ctl" for i in range(3)], "dir": tmp_path}
    at_work(out, 0, 1, 2)             # each used by this process (an idle GPU idles at its lowest clock)
    return out


@pytest.fixture
def monitor(gpus):
    store = Store()
    mon = DeviceMonitor("n1", store.submit, store.set_meta, interval_ns=SECOND, counters_ns=5 * SECOND,
                        kmsg_path=os.devnull)
    assert mon.start(now_ns=0, thread=False) == []
    mon.store = store
    yield mon
    mon.stop()


def control(gpus, index, text):
    path = gpus["control"][index]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(textwrap.dedent(text))
    os.replace(tmp, path)   # a new inode: the stand-in sees the change at once


# ---- samples -------------------------------------------------------------------------------------
def test_every_gpu_is_sampled_each_interval_with_its_configured_values(monitor, gpus):
    at_work(gpus, 0, 1)               # GPU 2 idles, as a node's spare GPU does
    for second in range(3):
        monitor.poll(second * SECOND)
    samples = monitor.store.samples()
    assert sorted(samples) == [0, 1, 2]
    for index in range(3):
        assert [s["ts"] for s in samples[index]] == [0, SECOND, 2 * SECOND]
        last = samples[index][-1]
        assert last["node"] == "n1"
        if index == 2:                # idle: its lowest clock, NVML's gpu_idle event, no slowdown reason
            assert (last["sm_clock_mhz"], last["sm_clock_max_mhz"], last["util_gpu_pct"]) == (210, SM_MAX[2], 0)
            assert (last["clock_events"], last["clock_event_names"]) == (0x1, "gpu_idle")
            continue
        assert last["sm_clock_mhz"] == last["sm_clock_max_mhz"] == SM_MAX[index]
        assert last["util_gpu_pct"] == 95
        assert (last["clock_events"], last["clock_event_names"]) == (0, "")
        assert (last["pcie_gen"], last["pcie_gen_max"], last["pcie_width"], last["pcie_width_max"]) == (5, 5, 16, 16)
        assert last["mem_total_bytes"] == 80 << 30 and last["temperature_c"] == 45
        assert (last["pcie_tx_kb_s"], last["pcie_rx_kb_s"]) == (1000, 2000)
        assert last["read_error"] is None
    assert samples[0][-1]["nvlink_links"] == 4 and samples[0][-1]["nvlink_crc_errors"] == 0
    gpus_rows = {row[1]: row for row in monitor.store.rows["gpus"]}
    assert {i: (r[2], r[4], r[5]) for i, r in gpus_rows.items()} == {
        i: (gpus["spec"][i]["uuid"], gpus["spec"][i]["pci"], 5 if i == 1 else i) for i in range(3)}
    assert monitor.store.meta["devices_state"] == "read" and monitor.store.meta["devices_gpus"] == 3


def test_throttling_gpu_1_shows_its_lower_clock_and_the_reason_in_the_next_sample(monitor, gpus):
    monitor.poll(0)
    control(gpus, 1, "gpu_factor=2\nthrottle=thermal\n")
    monitor.poll(SECOND)
    hot = monitor.store.last(1)
    assert hot["sm_clock_mhz"] == SM_MAX[1] // 2 + SM_MAX[1] % 2 and hot["sm_clock_max_mhz"] == SM_MAX[1]
    assert (hot["clock_events"], hot["clock_event_names"], hot["temperature_c"]) == (0x40, "hw_thermal_slowdown", 90)
    for other in (0, 2):
        assert monitor.store.last(other)["sm_clock_mhz"] == SM_MAX[other]
        assert monitor.store.last(other)["clock_event_names"] == ""
    control(gpus, 1, "gpu_factor=4\nthrottle=hw_slowdown,power\n")
    monitor.poll(2 * SECOND)
    slow = monitor.store.last(1)
    assert slow["sm_clock_mhz"] == round(SM_MAX[1] / 4)
    assert slow["clock_event_names"] == "sw_power_cap,hw_slowdown" and slow["power_mw"] == slow["power_limit_mw"]
    os.unlink(gpus["control"][1])
    monitor.poll(3 * SECOND)
    assert monitor.store.last(1)["sm_clock_mhz"] == SM_MAX[1] and monitor.store.last(1)["clock_events"] == 0


def test_a_degraded_link_and_memory_errors_with_the_counters_read_every_counters_period(monitor, gpus):
    control(gpus, 0, "pcie_gen=3\npcie_width=8\necc_corrected=5\necc_uncorrected=1\nremapped_corrected=2\n"
                     "remap_pending=1\nnvlink_crc=7\nnvlink_replay=3\n")
    monitor.poll(0)
    first = monitor.store.last(0)
    assert (first["pcie_gen"], first["pcie_gen_max"], first["pcie_width"], first["pcie_width_max"]) == (3, 5, 8, 16)
    assert (first["ecc_corrected"], first["ecc_uncorrected"]) == (5, 1)
    assert (first["remapped_rows_corrected"], first["remapped_rows_uncorrected"], first["remap_pending"],
            first["remap_failure"]) == (2, 0, 1, 0)
    assert (first["nvlink_links"], first["nvlink_crc_errors"], first["nvlink_replay_errors"]) == (4, 7, 3)
    control(gpus, 0, "ecc_corrected=9\nnvlink_crc=8\n")
    monitor.poll(SECOND)                 # counters are carried until the next counters period
    assert (monitor.store.last(0)["ecc_corrected"], monitor.store.last(0)["nvlink_crc_errors"]) == (5, 7)
    assert monitor.store.last(0)["pcie_gen"] == 5   # the link is read every sample
    monitor.poll(5 * SECOND)
    assert (monitor.store.last(0)["ecc_corrected"], monitor.store.last(0)["nvlink_crc_errors"]) == (9, 8)


def test_calls_the_device_does_not_support_are_null_and_never_stop_the_sampler(monitor, gpus):
    for second in range(2):
        monitor.poll(second * SECOND)
    no_power = monitor.store.last(2)
    assert no_power["power_mw"] is None and no_power["power_limit_mw"] is None
    assert no_power["ecc_corrected"] is None and no_power["ecc_uncorrected"] is None
    assert no_power["nvlink_links"] is None and no_power["nvlink_crc_errors"] is None   # a GPU without NVLink
    assert no_power["read_error"] is None and no_power["sm_clock_mhz"] == SM_MAX[2]
    assert {"power", "power_limit", "ecc", "nvlink"} <= monitor.nvml.gpus[2].unsupported
    assert len(monitor.store.samples()[2]) == 2


def test_a_lost_gpu_reads_null_with_the_reason_and_comes_back(monitor, gpus):
    control(gpus, 1, "gpu_lost=1\n")
    monitor.poll(0)
    lost = monitor.store.last(1)
    assert lost["read_error"] == "GPU is lost"
    assert all(lost[c] is None for c in GPU_SAMPLE_COLUMNS[3:] if c != "read_error")
    assert monitor.store.last(0)["read_error"] is None
    control(gpus, 1, "")
    monitor.poll(5 * SECOND)
    back = monitor.store.last(1)
    assert back["read_error"] is None and back["sm_clock_mhz"] == SM_MAX[1] and back["ecc_corrected"] == 0


# ---- processes ------------------------------------------------------------------------------------
USER_CODE = "import ctypes, sys; ctypes.CDLL(sys.argv[1]); sys.stdout.write('up\\n'); sys.stdout.flush(); sys.stdin.read()"


def test_which_process_uses_which_gpu_from_nvml_and_from_its_device_files(monitor, gpus, libs):
    at_work(gpus)                     # only the processes this test starts use a GPU
    env = dict(os.environ, STRAGGLER_STANDIN_CONTROL=str(gpus["control"][2]))
    user = subprocess.Popen([sys.executable, "-c", USER_CODE, libs["libcuda"]], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert user.stdout.readline() == "up\n"       # it has loaded the stand-in libcuda
        proc_root = gpus["dir"] / "proc"
        (proc_root / "4242" / "fd").mkdir(parents=True)
        os.symlink("/dev/nvidia5", proc_root / "4242" / "fd" / "7")      # minor 5 is GPU 1
        os.symlink("/dev/nvidiactl", proc_root / "4242" / "fd" / "8")
        monitor.proc_root = str(proc_root)
        monitor.pids = lambda: [4242]
        monitor.rank_of = lambda pid: {user.pid: 2, 4242: 1}.get(pid)
        monitor.poll(0)
        rows = {(r[1], r[2], r[5]): r for r in monitor.store.rows["gpu_processes"]}
        assert set(rows) == {(user.pid, 2, "nvml"), (4242, 1, "fd")}
        nvml_row, fd_row = rows[(user.pid, 2, "nvml")], rows[(4242, 1, "fd")]
        assert (nvml_row[3], nvml_row[4], nvml_row[6], nvml_row[7], nvml_row[8]) == (
            gpus["spec"][2]["uuid"], 2, 1 << 30, 0, 0)
        assert (fd_row[3], fd_row[4], fd_row[6]) == (gpus["spec"][1]["uuid"], 1, None)
        busy = monitor.store.last(2)
        assert busy["util_gpu_pct"] == 95 and busy["mem_used_bytes"] == (512 << 20) + (1 << 30)
        monitor.poll(5 * SECOND)      # still there: the same first_seen, a later last_seen
        again = [r for r in monitor.store.rows["gpu_processes"] if r[1] == user.pid][-1]
        assert (again[7], again[8]) == (0, 5 * SECOND)
    finally:
        user.stdin.close()
        user.wait(30)
    monitor.poll(10 * SECOND)
    assert not [r for r in monitor.store.rows["gpu_processes"] if r[1] == user.pid and r[8] == 10 * SECOND]
    assert monitor.store.last(2)["util_gpu_pct"] == 0


# ---- no NVML ----------------------------------------------------------------------------------------
NO_GPU_CODE = textwrap.dedent("""
    import json, os, sys
    if sys.argv[1] == "no-pynvml":
        sys.modules["pynvml"] = None          # as if nvidia-ml-py were not installed
    from straggler.devices.monitor import DeviceMonitor
    rows, meta = {}, {}
    mon = DeviceMonitor("n1", lambda t, r: rows.setdefault(t, []).extend(r), meta.__setitem__, kmsg_path=os.devnull)
    notices = mon.start(now_ns=0, thread=False)
    mon.poll(0)
    mon.stop()
    print(json.dumps({"notices": notices, "meta": meta, "tables": sorted(rows)}))
""")


def run_no_gpu(mode, env):
    proc = subprocess.run([sys.executable, "-c", NO_GPU_CODE, mode], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    import json
    return json.loads(proc.stdout)


@pytest.mark.parametrize("mode, why", [("no-library", "NVML did not start"),
                                       ("no-pynvml", "the nvidia-ml-py package (pynvml) is not installed")])
def test_without_nvml_or_pynvml_no_gpu_is_read_and_it_is_said_once(mode, why):
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "STRAGGLER_STANDIN_NVML_CONFIG")}
    out = run_no_gpu(mode, env)
    assert len(out["notices"]) == 1 and out["notices"][0][0] == "gpu" and out["notices"][0][1].startswith(why)
    assert out["meta"]["devices_state"] == "not read" and out["meta"]["devices_reason"].startswith(why)
    assert "gpu_samples" not in out["tables"] and "gpus" not in out["tables"]


def test_nvidia_ml_py_loads_the_standin_by_ld_library_path(gpus, libs):
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(libs["nvml"]))
    code = ("import pynvml; pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(1); "
            "print(pynvml.nvmlDeviceGetCount(), pynvml.nvmlDeviceGetUUID(h), pynvml.nvmlDeviceGetPciInfo(h).busId)")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["3", gpus["spec"][1]["uuid"], "00000000:C2:00.0"]
