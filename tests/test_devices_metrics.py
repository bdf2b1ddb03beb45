"""The GPUs on a node's /metrics (straggler.api.metrics): one series per GPU from its newest gpu_samples
row, named and labelled as NVIDIA's dcgm-exporter names them (DCGM_FI_DEV_SM_CLOCK{gpu, UUID, pci_bus_id,
device, modelName, Hostname} ...) plus straggler_gpu_* (per-reason clock events, sample age, NVML read
errors), in dcgm-exporter's units (MHz, C, W, MiB).

Stores are written by the store's own writer (StoreWriter), or by the agent's device thread itself
(DeviceMonitor) reading the STAND-IN NVML in a subprocess, and read back through render() and the plain
/metrics port, parsed by prometheus-client's own text parser. Every time is given (at_ns): nothing here
depends on this machine's clock. A node without GPUs shows none of the GPU families, not even their
HELP lines; a sampler that stopped shows only its age."""
import http.client
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from straggler.api import metrics
from straggler.store import schema
from straggler.store.writer import StoreWriter

REPO = Path(__file__).resolve().parent.parent
SECOND = 1_000_000_000
T = 5_000 * SECOND               # the newest sample's time (CLOCK_MONOTONIC of the store's node)
MIB = 1 << 20
GPU_FAMILY_PREFIXES = ("DCGM_", "straggler_gpu_")


def sample(ts, gpu, **values):
    row = dict.fromkeys(schema.GPU_SAMPLE_COLUMNS)
    row.update(node="n1", ts=ts, gpu=gpu, **values)
    return tuple(row[c] for c in schema.GPU_SAMPLE_COLUMNS)


def write(db, **tables):
    writer = StoreWriter(db, "n1")
    writer.start()
    for table, rows in tables.items():
        writer.submit(table, rows)
    assert writer.flush()
    writer.stop()


HOT = dict(sm_clock_mhz=990, sm_clock_max_mhz=1980, mem_clock_mhz=2619, mem_clock_max_mhz=2619, clock_events=0x40,
           clock_event_names="hw_thermal_slowdown", temperature_c=91, power_mw=612_500, power_limit_mw=700_000,
           util_gpu_pct=97, util_mem_pct=41, mem_used_bytes=60 * 1024 * MIB + 5, mem_total_bytes=80 * 1024 * MIB,
           pcie_gen=3, pcie_gen_max=5, pcie_width=8, pcie_width_max=16, pcie_tx_kb_s=1200, pcie_rx_kb_s=3400,
           nvlink_links=18, nvlink_replay_errors=4, nvlink_recovery_errors=1, nvlink_crc_errors=9, ecc_corrected=7,
           ecc_uncorrected=0, remapped_rows_corrected=2, remapped_rows_uncorrected=1, remap_pending=1, remap_failure=0)
# a PCIe card: no NVLink, no ECC, no power reading (NULL: the device does not report them)
PCIE_CARD = dict(sm_clock_mhz=1755, sm_clock_max_mhz=1755, clock_events=0, clock_event_names="", temperature_c=48,
                 util_gpu_pct=100, mem_used_bytes=512 * MIB, mem_total_bytes=24 * 1024 * MIB, pcie_gen=4,
                 pcie_gen_max=4, pcie_width=16, pcie_width_max=16)


@pytest.fixture
def gpu_store(tmp_path):
    db = str(tmp_path / "gpus.db")
    write(db,
          gpus=[("n1", 0, "GPU-aaaa", "NVIDIA H100 80GB HBM3", "0000:3b:00.0", 0, SECOND, T),
                ("n1", 1, "GPU-bbbb", "NVIDIA L4", "0000:c1:00.0", 3, SECOND, T)],
          gpu_samples=[sample(T - 2 * SECOND, 0, **dict(HOT, sm_clock_mhz=1980, temperature_c=60, clock_events=0)),
                       sample(T - SECOND, 0, **dict(HOT, sm_clock_mhz=1500)),
                       sample(T, 0, **HOT),                                   # the newest: what /metrics shows
                       sample(T - SECOND, 1, **dict(PCIE_CARD, temperature_c=40)),
                       sample(T, 1, **PCIE_CARD)],
          gpu_errors=[("n1", T - 9 * SECOND, 0, "0000:3b:00", "GPU-aaaa", 13, "graphics engine exception", None,
                       None, None, None, "kernel", 1, "NVRM: Xid (PCI:0000:3b:00): 13, ..."),
                      ("n1", T - 3 * SECOND, 0, "0000:3b:00", "GPU-aaaa", 79, "GPU has fallen off the bus", None,
                       None, None, None, "kernel", 2, "NVRM: Xid (PCI:0000:3b:00): 79, ...")])
    return db


def families(body):
    return {f.name: f for f in text_string_to_metric_families(body if isinstance(body, str) else body.decode())}


def per_gpu(family):
    """{gpu index: value} of a family without extra labels (one sample per GPU)."""
    out = {}
    for s in family.samples:
        assert s.labels["gpu"] not in out, f"two series for GPU {s.labels['gpu']} in {family.name}"
        out[s.labels["gpu"]] = s.value
    return out


def test_each_gpu_has_dcgm_exporters_names_units_and_labels_from_its_newest_sample(gpu_store):
    got = families(metrics.render(gpu_store, "gpu-node-07", at_ns=T + SECOND // 2))
    expect = {
        "DCGM_FI_DEV_SM_CLOCK": {"0": 990, "1": 1755},            # the newest row, not 1980 or 1500 before it
        "DCGM_FI_DEV_MAX_SM_CLOCK": {"0": 1980, "1": 1755},
        "DCGM_FI_DEV_MEM_CLOCK": {"0": 2619},
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": {"0": 0x40, "1": 0},
        "DCGM_FI_DEV_GPU_TEMP": {"0": 91, "1": 48},
        "DCGM_FI_DEV_POWER_USAGE": {"0": 612.5},                   # W; the L4's power is not reported: no series
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": {"0": 700},
        "DCGM_FI_DEV_GPU_UTIL": {"0": 97, "1": 100},
        "DCGM_FI_DEV_MEM_COPY_UTIL": {"0": 41},
        "DCGM_FI_DEV_FB_USED": {"0": 60 * 1024, "1": 512},         # MiB
        "DCGM_FI_DEV_FB_FREE": {"0": 20 * 1024 - 1, "1": 24 * 1024 - 512},
        "DCGM_FI_DEV_FB_TOTAL": {"0": 80 * 1024, "1": 24 * 1024},
        "DCGM_FI_DEV_PCIE_LINK_GEN": {"0": 3, "1": 4},
        "DCGM_FI_DEV_PCIE_MAX_LINK_GEN": {"0": 5, "1": 4},
        "DCGM_FI_DEV_PCIE_LINK_WIDTH": {"0": 8, "1": 16},
        "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH": {"0": 16, "1": 16},
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": {"0": 4},
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": {"0": 1},
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": {"0": 7},
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": {"0": 0},
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": {"0": 2},
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": {"0": 1},
        "DCGM_FI_DEV_ROW_REMAP_PENDING": {"0": 1},
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": {"0": 0},
        "DCGM_FI_DEV_XID_ERRORS": {"0": 79, "1": 0},               # the last Xid (79 after 13); none: 0
        "straggler_gpu_pcie_tx_kb_per_second": {"0": 1200},
        "straggler_gpu_pcie_rx_kb_per_second": {"0": 3400},
        "straggler_gpu_nvlink_links_up": {"0": 18},
        "straggler_gpu_nvlink_crc_errors": {"0": 9},
        "straggler_gpu_sample_age_seconds": {"0": 0.5, "1": 0.5},
    }
    for name, values in expect.items():
        assert name in got, f"{name} missing"
        assert got[name].type == "gauge", name
        assert per_gpu(got[name]) == values, name
    labels = {s.labels["gpu"]: s.labels for s in got["DCGM_FI_DEV_GPU_TEMP"].samples}
    assert labels["0"] == {"gpu": "0", "UUID": "GPU-aaaa", "pci_bus_id": "00000000:3B:00.0", "device": "nvidia0",
                           "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "gpu-node-07", "node": "gpu-node-07"}
    assert labels["1"] == dict(labels["0"], gpu="1", UUID="GPU-bbbb", pci_bus_id="00000000:C1:00.0", device="nvidia3",
                               modelName="NVIDIA L4")
    # the clock-event reasons by name (PromQL has no bitwise and): GPU 0 is held down by heat alone
    reasons = {(s.labels["gpu"], s.labels["reason"]): s.value for s in got["straggler_gpu_clock_event"].samples}
    assert {k for k, v in reasons.items() if v == 1} == {("0", "hw_thermal_slowdown")}
    assert len(reasons) == 2 * 9
    assert "straggler_gpu_read_error" not in got                    # every value of the newest rows was read
    # the node's own families are still there, once each
    assert "straggler_window_seconds" in got and "straggler_agent_cpu_ratio" in got


def test_a_node_without_gpus_has_none_of_the_gpu_families(tmp_path):
    db = str(tmp_path / "cpu-only.db")
    write(db, lost_events=[("n1", "kmsg", 0, SECOND, 0)])
    body = metrics.render(db, "cpu-node", at_ns=T).decode()
    got = families(body)
    assert "straggler_window_seconds" in got                        # the node's metrics are served
    assert not [n for n in got if n.startswith(GPU_FAMILY_PREFIXES)]
    assert "DCGM_" not in body and "straggler_gpu_" not in body     # no empty family (HELP/TYPE) either


def test_a_store_from_before_the_device_tables_has_no_gpu_families(tmp_path):
    from test_devices_store import version_2_store
    db = str(tmp_path / "old.db")
    version_2_store(db)                                             # served read-only: nothing creates the tables
    body = metrics.render(db, "old-node", at_ns=T).decode()
    assert "straggler_window_seconds" in body and "DCGM_" not in body


def test_a_stale_sampler_shows_its_age_and_no_values(gpu_store):
    late = T + 60 * SECOND                                          # the device thread stopped a minute ago
    got = families(metrics.render(gpu_store, "n1", at_ns=late))
    assert per_gpu(got["straggler_gpu_sample_age_seconds"]) == {"0": 60.0, "1": 60.0}
    assert [n for n in got if n.startswith(GPU_FAMILY_PREFIXES)] == ["straggler_gpu_sample_age_seconds"]
    # within a few sampling intervals the values are still shown: one late sample is not a stop
    got = families(metrics.render(gpu_store, "n1", at_ns=T + 2 * SECOND, window_s=1.0))
    assert per_gpu(got["DCGM_FI_DEV_GPU_TEMP"]) == {"0": 91, "1": 48}


def test_a_lost_gpu_says_so_and_keeps_what_was_read(tmp_path):
    db = str(tmp_path / "lost.db")
    write(db, gpus=[("n1", 0, "GPU-aaaa", "NVIDIA H100 80GB HBM3", "0000:3b:00.0", 0, SECOND, T)],
          gpu_samples=[sample(T, 0, sm_clock_max_mhz=1980, read_error="GPU is lost")])
    got = families(metrics.render(db, "n1", at_ns=T))
    errors = got["straggler_gpu_read_error"].samples
    assert [(s.labels["gpu"], s.labels["error"], s.value) for s in errors] == [("0", "GPU is lost", 1.0)]
    assert per_gpu(got["DCGM_FI_DEV_MAX_SM_CLOCK"]) == {"0": 1980}  # carried from before it was lost
    assert "DCGM_FI_DEV_SM_CLOCK" not in got and "straggler_gpu_clock_event" not in got


def test_a_gpu_index_shows_once_when_its_gpu_was_swapped(tmp_path):
    db = str(tmp_path / "swapped.db")
    write(db, gpus=[("n1", 0, "GPU-old", "NVIDIA A100", "0000:3b:00.0", 0, SECOND, 2 * SECOND),
                    ("n1", 0, "GPU-new", "NVIDIA H100 80GB HBM3", "0000:3b:00.0", 0, 3 * SECOND, T)],
          gpu_samples=[sample(T, 0, temperature_c=55)])
    got = families(metrics.render(db, "n1", at_ns=T))
    assert [(s.labels["UUID"], s.value) for s in got["DCGM_FI_DEV_GPU_TEMP"].samples] == [("GPU-new", 55)]


def test_the_plain_metrics_port_serves_the_gpus(gpu_store):
    server, thread = metrics.start_plain_server(gpu_store, "n1", "127.0.0.1:0")
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        body = response.read().decode()
        conn.close()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
    assert response.status == 200
    got = families(body)
    # served at this machine's now: T is long past (or far ahead) on its clock; the GPUs are named either way
    assert {s.labels["UUID"] for s in got["straggler_gpu_sample_age_seconds"].samples} == {"GPU-aaaa", "GPU-bbbb"}


# ---------------------------------------------------------------- from the agent's own sampler

MONITOR = textwrap.dedent("""
    import sys
    from straggler.devices.monitor import DeviceMonitor
    from straggler.store.writer import StoreWriter
    db, at = sys.argv[1], int(sys.argv[2])
    writer = StoreWriter(db, "standin-node")
    writer.start()
    monitor = DeviceMonitor("standin-node", writer.submit, writer.set_meta, kmsg_path="/nonexistent/kmsg")
    notices = monitor.start(now_ns=at, thread=False)
    assert not [n for n in notices if n[0] == "gpu"], notices
    monitor.poll(at)
    monitor.stop()
    assert writer.flush()
    writer.stop()
    print(monitor.samples_written)
""")


def test_what_the_agents_sampler_read_from_nvml_is_on_metrics(tmp_path):
    pytest.importorskip("pynvml", reason="nvidia-ml-py is a development requirement (requirements-dev.txt)")
    from straggler_lab.standin import build_standin_nvml, write_nvml_config
    nvml = build_standin_nvml(tmp_path / "libs")
    hot = tmp_path / "rank0.ctl"
    hot.write_text("gpu_factor=2\nthrottle=thermal\ntemperature=93\npower_w=640\npcie_gen=3\necc_corrected=5\n"
                   "remapped_corrected=2\nremap_pending=1\n")                 # one key a line
    (tmp_path / "rank1.ctl").write_text("")
    config = write_nvml_config(tmp_path / "gpus.conf", [
        dict(index=0, uuid="GPU-11111111-0000-4000-8000-000000000000", pci="0000:3b:00.0", control=str(hot),
             sm_max_mhz=1980, minor=0, nvlinks=4),
        dict(index=1, uuid="GPU-22222222-0000-4000-8000-000000000000", pci="0000:5c:00.0",
             control=str(tmp_path / "rank1.ctl"), sm_max_mhz=1755, minor=1, unsupported="power")])
    # both GPUs at work: used by this process (the stand-in's registry, as its libcuda writes it); an idle GPU
    # would idle at its lowest clock
    Path(f"{config}.procs").write_text(f"{os.getpid()} 0 {1 << 30}\n{os.getpid()} 1 {1 << 30}\n")
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(nvml), STRAGGLER_STANDIN_NVML_CONFIG=config,
               PYTHONPATH=str(REPO / "agent"))
    db = str(tmp_path / "agent.db")
    proc = subprocess.run([sys.executable, "-c", MONITOR, db, str(T)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["2"]
    got = families(metrics.render(db, "standin-node", at_ns=T))
    assert per_gpu(got["DCGM_FI_DEV_SM_CLOCK"]) == {"0": 990, "1": 1755}     # throttled by 2 / not
    assert per_gpu(got["DCGM_FI_DEV_MAX_SM_CLOCK"]) == {"0": 1980, "1": 1755}
    assert per_gpu(got["DCGM_FI_DEV_GPU_TEMP"])["0"] == 93
    assert per_gpu(got["DCGM_FI_DEV_POWER_USAGE"]) == {"0": 640}              # GPU 1 does not report power
    assert per_gpu(got["DCGM_FI_DEV_PCIE_LINK_GEN"])["0"] == 3
    assert per_gpu(got["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"])["0"] == 5
    assert per_gpu(got["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"])["0"] == 2
    assert per_gpu(got["DCGM_FI_DEV_ROW_REMAP_PENDING"])["0"] == 1
    assert per_gpu(got["straggler_gpu_nvlink_links_up"]) == {"0": 4}
    held = {s.labels["gpu"]: s.labels["reason"] for s in got["straggler_gpu_clock_event"].samples if s.value == 1}
    assert held == {"0": "hw_thermal_slowdown"}
    uuids = {s.labels["gpu"]: (s.labels["UUID"], s.labels["pci_bus_id"], s.labels["device"])
             for s in got["DCGM_FI_DEV_GPU_TEMP"].samples}
    assert uuids == {"0": ("GPU-11111111-0000-4000-8000-000000000000", "00000000:3B:00.0", "nvidia0"),
                     "1": ("GPU-22222222-0000-4000-8000-000000000000", "00000000:5C:00.0", "nvidia1")}
