"""The kernel log reader (straggler.devices.xid.KmsgReader) and the device monitor's Xid records, on the
REAL /dev/kmsg (root): the test writes lines into the kernel log as a program may (facility 'user'),
each with a marker or a PCI bus id unique to the test, so lines of other runs never match. The GPUs are
the stand-in NVML's (test_devices_nvml's fixtures), so an Xid on a stand-in GPU's bus names its index.

(The kernel rate-limits writers of /dev/kmsg per open file, 10 lines per 5 s: each line is written
through its own open.)"""
import os
import uuid as uuidlib

import pytest

from straggler.devices.monitor import DeviceMonitor
from straggler.devices.xid import XID_MEANINGS, KmsgReader

from test_devices_nvml import SECOND, Store, gpus, libs  # noqa: F401  (fixtures)

pytestmark = pytest.mark.usefixtures("root_required")


def kmsg_write(*lines):
    for line in lines:
        fd = os.open("/dev/kmsg", os.O_WRONLY)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


def marker():
    return f"straggler-test-{uuidlib.uuid4().hex[:12]}"


def test_the_reader_starts_at_the_end_and_keeps_only_its_lines():
    mark = marker()
    kmsg_write(f"<6>{mark} written before the reader opened\n")
    reader = KmsgReader(keep=mark.encode())
    reader.open()
    try:
        kmsg_write(f"<6>unrelated {uuidlib.uuid4().hex}\n", f"<3>{mark} after: one\n", f"<4>{mark} after: two\n")
        records, more = reader.read_new()
        assert not more
        assert [(r.facility, r.level, r.message) for r in records] == [(1, 3, f"{mark} after: one"),
                                                                       (1, 4, f"{mark} after: two")]
        assert records[1].seq > records[0].seq and records[1].ts_ns >= records[0].ts_ns
        assert reader.records_read >= 3        # the unrelated line was read, and dropped undecoded
        assert reader.read_new() == ([], False)  # nothing new: returns at once (non-blocking)
    finally:
        reader.close()


def test_each_call_reads_a_bounded_number_of_records():
    mark = marker()
    reader = KmsgReader(keep=mark.encode(), max_records=10)
    reader.open()
    try:
        kmsg_write(*[f"<7>{mark} {i}\n" for i in range(35)])
        batches = []
        for _ in range(10):
            records, more = reader.read_new()
            batches.append(len(records))
            if not more:
                break
        assert batches[:3] == [10, 10, 10] and sum(batches) == 35   # never more than 10 at a time, none lost
        assert reader.records_lost == 0
    finally:
        reader.close()


@pytest.fixture
def xid_monitor(gpus):  # noqa: F811
    store = Store()
    mon = DeviceMonitor("n1", store.submit, store.set_meta, interval_ns=SECOND, counters_ns=5 * SECOND)
    assert mon.start(now_ns=0, thread=False) == []
    assert store.meta["xid_state"] == "read"
    mon.store = store
    yield mon
    mon.stop()


def test_an_xid_on_a_gpus_bus_is_recorded_with_its_index_meaning_and_process(xid_monitor, gpus):  # noqa: F811
    bus = gpus["spec"][1]["pci"][:-2]                    # '0000:c2:00'
    witness = KmsgReader(keep=bus.encode())
    witness.open()
    try:
        line = f"NVRM: Xid (PCI:{bus}): 79, pid=1234, name=python, GPU has fallen off the bus."
        kmsg_write(f"<3>{line}\n")
        xid_monitor.poll(0)
        (seen,), _ = witness.read_new()
    finally:
        witness.close()
    (row,) = xid_monitor.store.rows["gpu_errors"]
    assert row == ("n1", seen.ts_ns, 1, bus, gpus["spec"][1]["uuid"], 79, XID_MEANINGS[79], 1234, "python", None,
                   None, "user", seen.seq, line)


def test_an_unknown_bus_gets_its_uuid_from_the_drivers_line_and_odd_lines_are_skipped(xid_monitor):
    bus = f"{0x1000 + int(uuidlib.uuid4().hex[:3], 16):04x}:3b:00"     # no stand-in GPU there
    gpu_uuid = f"GPU-{uuidlib.uuid4()}"
    kmsg_write(f"<3>NVRM: Xid (PCI:{bus}): 79\n",                       # odd: no comma after the code
               f"<3>NVRM: Xid (PCI:{bus}): x1, pid=2\n",                # odd: no number
               f"<3>NVRM: Xid (PCI:{bus}) 48, pid=2\n",
               f"<4>NVRM: GPU at PCI:{bus}: {gpu_uuid}\n",
               f"<3>NVRM: Xid (PCI:{bus}): 48, pid='<unknown>', name=<unknown>, DBE (0x1)\n")
    xid_monitor.poll(0)
    rows = [r for r in xid_monitor.store.rows["gpu_errors"] if r[3] == bus]
    assert [(r[2], r[4], r[5], r[7], r[8]) for r in rows] == [(None, gpu_uuid, 48, None, None)]
    assert xid_monitor.failures == {}
