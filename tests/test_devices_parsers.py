"""Pure parts of straggler.devices: the Xid line parser (the driver's formats, and odd or hostile lines
that must yield nothing), /dev/kmsg records, PCI bus ids, clock-event names, and the /dev/nvidiaN fd
scan on a /proc the test builds. No GPU, no root."""
import os

import pytest

from straggler.devices.nvml import clock_event_names
from straggler.devices.procmap import nvidia_minors_open
from straggler.devices.xid import (XID_MEANINGS, bus_key_of, parse_gpu_at, parse_kmsg_record, parse_xid)

COMMON_CODES = (13, 31, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 119, 120, 121)


# ---- Xid lines ------------------------------------------------------------------------------------
def test_the_drivers_xid_line_gives_bus_code_meaning_pid_and_name():
    xid = parse_xid("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.")
    assert (xid.pci_bus_id, xid.xid, xid.pid, xid.process) == ("0000:3b:00", 79, 1234, "python")
    assert xid.meaning.startswith("GPU has fallen off the bus")
    assert xid.gpu_instance is None and xid.compute_instance is None


def test_an_unknown_process_and_a_mig_instance():
    xid = parse_xid("NVRM: Xid (PCI:0000:CB:00 GPU-I:01 GPU-CI:02): 13, pid='<unknown>', name=<unknown>, "
                    "Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter")
    assert (xid.pci_bus_id, xid.xid, xid.pid, xid.process) == ("0000:cb:00", 13, None, None)
    assert (xid.gpu_instance, xid.compute_instance) == (1, 2)


@pytest.mark.parametrize("line, bus, code, pid", [
    ("NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.", "0000:01:00", 79, None),   # no pid, no name
    ("NVRM: Xid (PCI:0000:01:00): 62, 023f0f30 00000000 00000000 202c0ffe", "0000:01:00", 62, None),
    ("NVRM: Xid (0000:03:00): 14, Channel 00000001", "0000:03:00", 14, None),                  # older drivers
    ("NVRM: Xid (PCI:0002:00:00): 119, pid=1582259 Recommended Action=COMPONENT_RESET", "0002:00:00", 119, 1582259),
    ("NVRM: Xid (PCI:0000:b3:00.0): 48, pid=77, name=pt_main_thread, DBE", "0000:b3:00", 48, 77),
])
def test_other_formats_of_the_driver(line, bus, code, pid):
    xid = parse_xid(line)
    assert (xid.pci_bus_id, xid.xid, xid.pid) == (bus, code, pid)
    assert xid.message == line


def test_every_common_code_has_a_meaning_and_a_rare_one_none():
    for code in COMMON_CODES:
        assert XID_MEANINGS.get(code), code
        assert parse_xid(f"NVRM: Xid (PCI:0000:c1:00): {code}, pid=1, name=x, y").meaning == XID_MEANINGS[code]
    assert parse_xid("NVRM: Xid (PCI:0000:c1:00): 9999, pid=1, name=x, y").meaning is None


@pytest.mark.parametrize("line", [
    "",
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15",
    "NVRM: Xid",
    "NVRM: Xid (PCI:0000:c1:00): , pid=1",                        # no code
    "NVRM: Xid (PCI:0000:c1:00): 79",                             # no comma after the code
    "NVRM: Xid (PCI:zzzz:c1:00): 79, x",                          # not hex
    "NVRM: Xid (PCI:0000:c1:00): 12345678901234567890, x",         # a number too long
    "NVRM: Xid (PCI:0000:c1): 79, x",                             # a short bus id
    "NVRM: Xid (PCI:0000:c1:00)) 79, x",
    "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal",  # NVSwitch, not a GPU
    "\x00\x01NVRM: Xid (\xff\xfe",
    "NVRM: Xid (PCI:" + "0" * 100000 + ":c1:00): 79, x",
])
def test_an_odd_or_hostile_line_yields_nothing(line):
    assert parse_xid(line) is None


def test_a_hostile_pid_and_a_huge_line_are_contained():
    xid = parse_xid("NVRM: Xid (PCI:0000:c1:00): 79, pid=99999999, name=" + "n" * 500 + ", " + "x" * 100000)
    assert xid.xid == 79 and xid.pid is None          # beyond any pid: unknown, not a wrong number
    assert len(xid.message) == 2048 and len(xid.process) <= 64


def test_the_gpu_at_line_ties_a_bus_to_its_uuid():
    assert parse_gpu_at("NVRM: GPU at PCI:0000:01:00: GPU-299fe279-1c52-2255-d4ba-07d7bd2861d9") == (
        "0000:01:00", "GPU-299fe279-1c52-2255-d4ba-07d7bd2861d9")
    assert parse_gpu_at("NVRM: GPU at PCI:0000:01:00: not-a-uuid") is None
    assert parse_gpu_at("NVRM: GPU Board Serial Number: 1234") is None


# ---- kmsg records, bus ids, clock events --------------------------------------------------------------
def test_a_kmsg_record_gives_facility_level_seq_time_and_its_first_line():
    record = parse_kmsg_record(b"11,4567,123456789,-;NVRM: Xid (PCI:0000:c1:00): 79, x\n SUBSYSTEM=pci\n DEVICE=+pci:0\n")
    assert (record.facility, record.level, record.seq, record.ts_ns) == (1, 3, 4567, 123_456_789_000)
    assert record.message == "NVRM: Xid (PCI:0000:c1:00): 79, x"
    kernel = parse_kmsg_record(b"4,1,2,-;NVRM: x")
    assert (kernel.facility, kernel.level) == (0, 4)


@pytest.mark.parametrize("data", [b"", b"no separator", b"6,1;x", b"a,b,c,-;x", b"6,-1,5,-;x", b"6,1,-5,-;x",
                                  b"6,1,99999999999999999999999,-;x"])
def test_a_broken_kmsg_record_yields_nothing(data):
    assert parse_kmsg_record(data) is None


def test_bus_ids_of_nvml_and_of_xid_lines_meet_in_one_spelling():
    assert bus_key_of("00000000:C1:00.0") == bus_key_of("0000:c1:00") == bus_key_of("c1:00.0") == "0000:c1:00"
    assert bus_key_of("00000001:3B:1F.0") == "0001:3b:1f"
    for bad in (None, "", "garbage", "0000:c1", "0000:c1:00:00", "0000:gg:00.0"):
        assert bus_key_of(bad) is None


def test_clock_event_names():
    assert clock_event_names(None) is None
    assert clock_event_names(0) == ""
    assert clock_event_names(0x40) == "hw_thermal_slowdown"
    assert clock_event_names(0x4 | 0x8) == "sw_power_cap,hw_slowdown"
    assert clock_event_names(0x1 | 0x10000) == "gpu_idle,0x10000"


# ---- /dev/nvidiaN among a process's fds -------------------------------------------------------------
def fake_proc(root, pid, targets):
    fd_dir = root / str(pid) / "fd"
    fd_dir.mkdir(parents=True)
    for number, target in enumerate(targets):
        os.symlink(target, fd_dir / str(number))


def test_the_nvidia_device_files_a_process_holds_open(tmp_path):
    fake_proc(tmp_path, 100, ["/dev/null", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia3", "socket:[123]",
                              "/dev/nvidia1", "/dev/nvidia3", "/dev/nvidia-uvm-tools", "/dev/nvidia12",
                              "/dev/nvidia-caps/nvidia-cap1", "/tmp/dev/nvidia5", "/dev/nvidia7 (deleted)"])
    fake_proc(tmp_path, 200, ["/dev/null", "pipe:[9]"])
    assert nvidia_minors_open(100, proc_root=str(tmp_path)) == {1, 3, 12}
    assert nvidia_minors_open(200, proc_root=str(tmp_path)) == set()
    assert nvidia_minors_open(300, proc_root=str(tmp_path)) == set()          # gone


def test_the_scan_is_bounded_per_process(tmp_path):
    fake_proc(tmp_path, 100, [f"/dev/nvidia{i}" for i in range(50)])
    assert len(nvidia_minors_open(100, proc_root=str(tmp_path), max_fds=10)) == 10
