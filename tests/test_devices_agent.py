"""The agent (`straggler trace`, real eBPF) reads the devices: the STAND-IN NVML (libnvidia-ml.so.1 by
LD_LIBRARY_PATH, as nvidia-ml-py finds NVIDIA's) for four stand-in GPUs, and the REAL kernel log.

  TestWithGpus   four ranks (each its own stand-in GPU through its control file, launched by a process
                 the agent traces with --pid) run kernels and synchronize: gpu_samples for the four GPUs
                 every interval with the configured values; every rank tied to its GPU; throttling GPU 1
                 in its control file shows its lower clock and the reason in the next samples, and its
                 kernels get slower by the same factor; an Xid line written into /dev/kmsg on a GPU's
                 bus appears in gpu_errors with that GPU's index and meaning, odd lines do not; a burst
                 of 10k kernel log lines does not stall the agent; `straggler status` counts the GPUs.
  TestWithoutNvml  no NVML library: the agent says once that no GPU is read, records why, and traces
                 as before.
Each Xid line carries a PCI bus id made for this run. No timed assertions: waits poll the database."""
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from straggler_lab.standin import build_standin, build_standin_nvml, write_nvml_config
from straggler.devices.xid import XID_MEANINGS
from test_agent import AgentRun, Launcher, query, scalar, standin_libs, wait_until

pytest.importorskip("pynvml", reason="nvidia-ml-py is a development requirement (requirements-dev.txt)")
pytestmark = pytest.mark.bpf

GPUS = 4
SM_MAX = 1980
RANK_CODE = r"""
import ctypes, os, sys, time
cuda = ctypes.CDLL(sys.argv[1])
stop = sys.argv[2]
while not os.path.exists(stop):
    for _ in range(5):
        cuda.cuLaunchKernel(None, 1, 1, 1, 32, 1, 1, 0, None, None, None)
    cuda.cuCtxSynchronize()
    time.sleep(0.02)
"""


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    lib_dir = tmp_path_factory.mktemp("standin")
    build_standin(lib_dir)
    return {"lib_dir": str(lib_dir), "libcuda": os.path.join(lib_dir, "libcuda.so.1"),
            "nvml_dir": os.path.dirname(build_standin_nvml(lib_dir))}


def kmsg_write(*lines):
    """Each line through its own open: the kernel rate-limits a writer to 10 lines per 5 s per open file."""
    for line in lines:
        fd = os.open("/dev/kmsg", os.O_WRONLY)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


# ---- with four stand-in GPUs -------------------------------------------------------------------------
@pytest.fixture(scope="class")
def job(libs, tmp_path_factory):
    """The GPUs file, four ranks' control files, a launcher (traced by the agent) and the agent."""
    work = tmp_path_factory.mktemp("devices-job")
    domain = random.randint(0x100, 0xfff)           # this run's PCI domain: its Xid lines match nothing else
    gpus = [dict(index=i, uuid=f"GPU-{domain:04x}{i:04x}-0000-4000-8000-{random.getrandbits(48):012x}",
                 pci=f"{domain:04x}:{0xc1 + i:02x}:00.0", control=str(work / f"rank{i}.ctl"), sm_max_mhz=SM_MAX)
            for i in range(GPUS)]
    config = write_nvml_config(work / "gpus.conf", gpus)
    launcher = Launcher(work)
    agent = AgentRun(work / "trace.db", ["--node", "devices-a", "--pid", str(launcher.pid), "--interval", "1",
                                         "--rescan", "0.5", "--record-all", *standin_libs(libs)],
                     prefix=["env", f"LD_LIBRARY_PATH={libs['nvml_dir']}", f"STRAGGLER_STANDIN_NVML_CONFIG={config}"])
    agent.wait_ready()
    stop = work / "stop"
    ranks = []
    for i in range(GPUS):
        env = {"RANK": str(i), "LOCAL_RANK": str(i), "WORLD_SIZE": str(GPUS), "STRAGGLER_STANDIN_CONTROL": gpus[i]["control"],
               "STRAGGLER_STANDIN_NVML_CONFIG": config, "STRAGGLER_STANDIN_KERNEL_US": "2000",
               "STRAGGLER_STANDIN_LAUNCH_US": "5", "STRAGGLER_STANDIN_SYNC_US": "0"}
        ranks.append(launcher.start([sys.executable, "-c", RANK_CODE, libs["libcuda"], stop], env=env))
    yield {"agent": agent, "db": agent.db, "gpus": gpus, "ranks": ranks, "work": work}
    stop.write_text("")
    for rank in ranks:
        rank.wait(60)
    agent.stop(signal.SIGTERM)
    launcher.close()


def samples(db, gpu, where="1"):
    return query(db, f"SELECT ts, sm_clock_mhz, sm_clock_max_mhz, clock_events, clock_event_names, temperature_c, "
                     f"pcie_gen, pcie_width, read_error FROM gpu_samples WHERE gpu = ? AND {where} ORDER BY ts", (gpu,))


class TestWithGpus:
    def test_every_gpu_is_sampled_each_interval_with_its_configured_values(self, job):
        db = job["db"]
        def three_samples_each():
            gpus, least = query(db, "SELECT count(*), min(n) FROM (SELECT count(*) AS n FROM gpu_samples GROUP BY gpu)")[0]
            return gpus == GPUS and least >= 3
        assert wait_until(three_samples_each)
        by_ts = query(db, "SELECT ts, group_concat(gpu) FROM (SELECT ts, gpu FROM gpu_samples ORDER BY ts, gpu) "
                          "GROUP BY ts ORDER BY ts LIMIT 3")
        assert [gpus for _, gpus in by_ts] == ["0,1,2,3"] * 3          # all GPUs in each sample
        for gpu in range(GPUS):       # at work (its rank has loaded the stand-in libcuda): its configured values
            first = wait_until(lambda: samples(db, gpu, "util_gpu_pct > 0"))[0]
            assert first[1:] == (SM_MAX, SM_MAX, 0, "", 45, 5, 16, None)
        assert query(db, "SELECT gpu, uuid, pci_bus_id FROM gpus ORDER BY gpu") == [
            (g["index"], g["uuid"], g["pci"]) for g in job["gpus"]]
        meta = dict(query(db, "SELECT key, value FROM meta WHERE key LIKE 'devices_%' OR key LIKE 'xid_%'"))
        assert (meta["devices_state"], meta["devices_gpus"], meta["xid_state"]) == ("read", "4", "read")

    def test_every_rank_is_tied_to_its_gpu(self, job):
        want = {(rank.pid, i, i) for i, rank in enumerate(job["ranks"])}
        got = wait_until(lambda: want <= set(query(job["db"], "SELECT pid, gpu, rank FROM gpu_processes "
                                                              "WHERE how = 'nvml'")))
        assert got
        rows = query(job["db"], "SELECT DISTINCT pid, uuid FROM gpu_processes WHERE pid IN (%s)"
                     % ",".join(str(r.pid) for r in job["ranks"]))
        assert sorted(uuid for _, uuid in rows) == sorted(g["uuid"] for g in job["gpus"])

    def test_throttling_gpu_1_lowers_its_clock_with_the_reason_and_slows_its_kernels(self, job):
        db, rank1 = job["db"], job["ranks"][1].pid
        assert wait_until(lambda: scalar(db, "SELECT count(*) FROM events WHERE pid = ? AND op = 'cuCtxSynchronize'",
                                         (rank1,)) >= 20)
        before_ts = scalar(db, "SELECT max(ts) FROM gpu_samples WHERE gpu = 1")
        Path(job["gpus"][1]["control"]).write_text("gpu_factor=3\nthrottle=thermal\n")
        try:
            hot = wait_until(lambda: samples(db, 1, f"ts > {before_ts} AND clock_events != 0"))
            assert hot, "no throttled sample of GPU 1"
            ts, clock, clock_max, events, names, temperature = hot[0][:6]
            assert (clock, clock_max, events, names, temperature) == (round(SM_MAX / 3), SM_MAX, 0x40,
                                                                      "hw_thermal_slowdown", 90)
            same = query(db, "SELECT gpu, sm_clock_mhz, clock_event_names FROM gpu_samples WHERE ts = ? AND gpu != 1 "
                             "ORDER BY gpu", (ts,))
            assert same == [(g, SM_MAX, "") for g in (0, 2, 3)]
            # and the stand-in libcuda's kernels are 3x slower: synchronize waits for them
            assert wait_until(lambda: scalar(db, "SELECT count(*) FROM events WHERE pid = ? AND op = 'cuCtxSynchronize' "
                                                 "AND ts > ?", (rank1, ts)) >= 20)
            def median(sql, params):
                values = sorted(v for (v,) in query(db, sql, params))
                return values[len(values) // 2]
            fast = median("SELECT duration FROM events WHERE pid = ? AND op = 'cuCtxSynchronize' AND ts < ?",
                          (rank1, before_ts))
            slow = median("SELECT duration FROM events WHERE pid = ? AND op = 'cuCtxSynchronize' AND ts > ?",
                          (rank1, ts))
            assert slow >= 2 * fast, (fast, slow)
        finally:
            os.unlink(job["gpus"][1]["control"])
        assert wait_until(lambda: samples(db, 1, f"ts > {ts} AND clock_events = 0 AND sm_clock_mhz = {SM_MAX}"))

    def test_an_xid_line_in_the_kernel_log_is_recorded_for_its_gpu(self, job):
        gpu, pid = job["gpus"][2], job["ranks"][2].pid
        bus = gpu["pci"][:-2]
        line = f"NVRM: Xid (PCI:{bus}): 79, pid={pid}, name=python, GPU has fallen off the bus."
        kmsg_write(f"<3>{line}\n")
        rows = wait_until(lambda: query(job["db"], "SELECT gpu, uuid, xid, meaning, pid, process, origin, message "
                                                   "FROM gpu_errors WHERE pci_bus_id = ?", (bus,)))
        assert rows == [(2, gpu["uuid"], 79, XID_MEANINGS[79], pid, "python", "user", line)]

    def test_odd_lines_are_skipped(self, job):
        bus = job["gpus"][3]["pci"][:-2]
        kmsg_write(f"<3>NVRM: Xid (PCI:{bus}): 79\n", f"<3>NVRM: Xid (PCI:{bus}): , pid=1\n",
                   f"<3>NVRM: Xid (PCI:{bus}) 31, pid=1\n", f"<3>NVRM: Xid (PCI:{bus}): 31{'9' * 30}, pid=1\n",
                   f"<3>NVRM: Xid (PCI:{bus}): 31, pid=1, name=after-the-odd-ones, x\n")
        rows = wait_until(lambda: query(job["db"], "SELECT xid, process FROM gpu_errors WHERE pci_bus_id = ?", (bus,)))
        assert rows == [(31, "after-the-odd-ones")]
        assert scalar(job["db"], "SELECT count(*) FROM meta WHERE key = 'devices_error'") == 0

    def test_a_burst_of_10k_kernel_log_lines_does_not_stall_the_agent(self, job):
        db = job["db"]
        tag = f"straggler-burst-{random.getrandbits(32):08x}"
        kmsg_write(*[f"<7>{tag} line {i} of a flood of kernel messages\n" for i in range(10_000)])
        after = time.monotonic_ns()
        bus = job["gpus"][0]["pci"][:-2]
        kmsg_write(f"<3>NVRM: Xid (PCI:{bus}): 74, pid='<unknown>', name=<unknown>, NVLink: {tag}\n")
        # the summaries, the samples and the Xid after the flood all keep coming
        assert wait_until(lambda: scalar(db, "SELECT count(*) FROM thread_time WHERE ts > ?", (after,)) > 0)
        assert wait_until(lambda: scalar(db, "SELECT count(*) FROM gpu_samples WHERE ts > ?", (after,)) >= 2 * GPUS)
        assert wait_until(lambda: query(db, "SELECT xid FROM gpu_errors WHERE pci_bus_id = ?", (bus,))) == [(74,)]
        assert job["agent"].proc.poll() is None

    def test_status_counts_the_gpus(self, job):
        out = subprocess.run([sys.executable, "-m", "straggler.cli", "status", "--db", job["db"]], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert "4 read through NVML every 1 s (driver stand-in)" in out.stdout


# ---- without NVML ------------------------------------------------------------------------------------
@pytest.fixture(scope="class")
def plain_agent(libs, tmp_path_factory):
    work = tmp_path_factory.mktemp("devices-none")
    launcher = Launcher(work)
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "STRAGGLER_STANDIN_NVML_CONFIG")}
    agent = AgentRun(work / "trace.db", ["--node", "devices-b", "--pid", str(launcher.pid), "--interval", "1",
                                         "--rescan", "0.5", *standin_libs(libs)],
                     prefix=["env", "-i", *[f"{k}={v}" for k, v in env.items()]])
    agent.wait_ready()
    stop = work / "stop"
    rank = launcher.start([sys.executable, "-c", RANK_CODE, libs["libcuda"], stop],
                          env={"RANK": "0", "STRAGGLER_STANDIN_KERNEL_US": "500", "STRAGGLER_STANDIN_SYNC_US": "0"})
    yield {"agent": agent, "db": agent.db, "rank": rank}
    stop.write_text("")
    rank.wait(60)
    agent.stop(signal.SIGTERM)
    launcher.close()


class TestWithoutNvml:
    def test_it_says_once_that_no_gpu_is_read_and_traces_as_before(self, plain_agent):
        db, agent = plain_agent["db"], plain_agent["agent"]
        said = [line for line in agent.stderr_lines if "GPU" in line]
        assert len(said) == 1 and said[0].startswith("straggler: no GPU is read: NVML did not start"), said
        meta = dict(query(db, "SELECT key, value FROM meta WHERE key LIKE 'devices_%'"))
        assert meta["devices_state"] == "not read" and meta["devices_reason"].startswith("NVML did not start")
        assert wait_until(lambda: scalar(db, "SELECT count(*) FROM thread_time WHERE pid = ?",
                                         (plain_agent["rank"].pid,)) >= 2)
        assert scalar(db, "SELECT count(*) FROM gpu_samples") == 0 and scalar(db, "SELECT count(*) FROM gpus") == 0
        assert agent.stop(signal.SIGTERM) == 0
        assert [line for line in agent.stderr_lines if "GPU" in line] == said          # said once
