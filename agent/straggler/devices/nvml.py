"""The GPUs through NVIDIA's management library (NVML), by the nvidia-ml-py package (`pynvml`).

`Nvml.open()` loads pynvml and NVML (libnvidia-ml.so.1, found by the dynamic loader) and lists the
GPUs; it raises NvmlUnavailable with a one-line reason when either is missing (a node without a GPU).
`sample(gpu)` reads one GPU's clocks, clock-event (throttle) reasons, temperature, power, utilization,
memory and PCIe link now; the counters and the values that rarely change (maximum clocks and link, power
limit, NVLink, ECC, remapped rows) are read when `counters=True` and carried in between. A call the
device does not support (NVML_ERROR_NOT_SUPPORTED, or a function this driver lacks) gives None and is
not made again for that GPU; any other failure (e.g. 'GPU is lost') gives None and is named in the
sample's read_error. Nothing here raises after open(): the sampler never stops on a device.

This module must not import BCC or the store, and prints nothing.
"""
from dataclasses import dataclass, field
from typing import Optional

from .xid import bus_key_of

# NVML's clock-event (formerly throttle) reasons: bit -> the name gpu_samples.clock_event_names uses
CLOCK_EVENTS = (
    (0x001, "gpu_idle"),
    (0x002, "applications_clocks_setting"),
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal_slowdown"),
    (0x040, "hw_thermal_slowdown"),
    (0x080, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)
# the reasons that slow a GPU down against its will (gpu_idle and the settings are not faults)
SLOWDOWN_EVENTS = 0x004 | 0x008 | 0x020 | 0x040 | 0x080

NVML_INVALID_ARGUMENT = 2
NVML_NOT_SUPPORTED = 3
NVML_FUNCTION_NOT_FOUND = 13
_NOT_THERE = (NVML_NOT_SUPPORTED, NVML_FUNCTION_NOT_FOUND)
NVLINK_MAX_LINKS = 18
# NVML's enum values (nvml.h), so that this module reads the same with any pynvml version
CLOCK_SM, CLOCK_MEM = 1, 2
TEMPERATURE_GPU = 0
PCIE_TX, PCIE_RX = 0, 1
NVLINK_REPLAY, NVLINK_RECOVERY, NVLINK_CRC_FLIT, NVLINK_CRC_DATA = 0, 1, 2, 3
ECC_CORRECTED, ECC_UNCORRECTED, ECC_VOLATILE = 0, 1, 0

# the columns sample() fills (gpu_samples less node, ts, gpu)
FAST = ("sm_clock_mhz", "mem_clock_mhz", "clock_events", "clock_event_names", "temperature_c", "power_mw",
        "util_gpu_pct", "util_mem_pct", "mem_used_bytes", "mem_total_bytes", "pcie_gen", "pcie_width",
        "pcie_tx_kb_s", "pcie_rx_kb_s")
CARRIED = ("sm_clock_max_mhz", "mem_clock_max_mhz", "power_limit_mw", "pcie_gen_max", "pcie_width_max",
           "nvlink_links", "nvlink_replay_errors", "nvlink_recovery_errors", "nvlink_crc_errors", "ecc_corrected",
           "ecc_uncorrected", "remapped_rows_corrected", "remapped_rows_uncorrected", "remap_pending",
           "remap_failure")


class NvmlUnavailable(Exception):
    """NVML cannot be read on this node; str() is the one-line reason."""


def clock_event_names(mask) -> Optional[str]:
    """'hw_thermal_slowdown,sw_power_cap' for a clock-event bitmask ('' for none; unknown bits as hex)."""
    if mask is None:
        return None
    names = [name for bit, name in CLOCK_EVENTS if mask & bit]
    unknown = mask & ~sum(bit for bit, _ in CLOCK_EVENTS)
    if unknown:
        names.append(hex(unknown))
    return ",".join(names)


def _text(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


@dataclass
class Gpu:
    """One GPU as NVML lists it."""
    index: int
    handle: object
    uuid: str
    name: Optional[str]
    pci_bus_id: Optional[str]        # 'dddd:bb:dd.f' lower case
    bus_key: Optional[str]           # 'dddd:bb:dd' (what Xid lines say)
    minor: Optional[int]             # /dev/nvidiaN
    first_seen: Optional[int] = None # ns monotonic (set by the monitor)
    unsupported: set = field(default_factory=set)
    carried: dict = field(default_factory=dict)


class Nvml:
    """NVML, opened once; the GPUs in `gpus`, the driver's version in `driver_version`."""

    def __init__(self):
        self.nv = None
        self.gpus = []
        self.driver_version = None

    def open(self):
        try:
            import pynvml
        except ImportError:
            raise NvmlUnavailable("the nvidia-ml-py package (pynvml) is not installed: pip install nvidia-ml-py") from None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML did not start ({exc}): no NVIDIA driver or GPU on this node") from None
        except OSError as exc:       # a broken library
            raise NvmlUnavailable(f"NVML could not be loaded ({exc})") from None
        self.nv = pynvml
        try:
            self.driver_version = _text(pynvml.nvmlSystemGetDriverVersion())
        except pynvml.NVMLError:
            self.driver_version = None
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            self.close()
            raise NvmlUnavailable(f"NVML cannot count the GPUs ({exc})") from None
        for index in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            except pynvml.NVMLError:
                continue                 # a GPU NVML cannot open (lost, or not ours): the others are read
            gpu = Gpu(index=index, handle=handle, uuid=uuid, name=None, pci_bus_id=None, bus_key=None, minor=None)
            gpu.name = _text(self._read(gpu, "name", pynvml.nvmlDeviceGetName, handle))
            pci = self._read(gpu, "pci", pynvml.nvmlDeviceGetPciInfo, handle)
            bus_id = _text(pci.busId) if pci is not None else ""
            gpu.bus_key = bus_key_of(bus_id)
            if gpu.bus_key is not None:
                function = bus_id.rsplit(".", 1)[1][:1] if "." in bus_id else "0"
                gpu.pci_bus_id = f"{gpu.bus_key}.{function}"
            gpu.minor = self._read(gpu, "minor", pynvml.nvmlDeviceGetMinorNumber, handle)
            self.gpus.append(gpu)

    def close(self):
        if self.nv is not None:
            try:
                self.nv.nvmlShutdown()
            except Exception:            # already gone: nothing to release
                pass
            self.nv = None

    # ---- reading ---------------------------------------------------------------------------------
    def _read(self, gpu, feature, fn, *args, errors=None):
        """fn(*args), or None: not supported (then never asked again for this GPU), or failed (named in errors)."""
        if feature in gpu.unsupported:
            return None
        try:
            return fn(*args)
        except self.nv.NVMLError as exc:
            if getattr(exc, "value", None) in _NOT_THERE:
                gpu.unsupported.add(feature)
            elif errors is not None and str(exc) not in errors:
                errors.append(str(exc))
            return None
        except (AttributeError, TypeError):  # a pynvml without this function
            gpu.unsupported.add(feature)
            return None

    def _clock_events(self, gpu, errors):
        nv = self.nv
        if "clock_events" not in gpu.unsupported:
            mask = self._read(gpu, "clock_events", nv.nvmlDeviceGetCurrentClocksEventReasons, gpu.handle, errors=errors)
            if mask is not None or "clock_events" not in gpu.unsupported:
                return mask
        # drivers before the 'event' name (R535) have the same call as 'throttle reasons'
        return self._read(gpu, "throttle_reasons", nv.nvmlDeviceGetCurrentClocksThrottleReasons, gpu.handle,
                          errors=errors)

    def sample(self, gpu: Gpu, counters=True) -> dict:
        """One GPU's values (keys FAST + CARRIED + read_error); counters=True re-reads the CARRIED ones."""
        nv, h, errors = self.nv, gpu.handle, []
        read = self._read
        out = {}
        out["sm_clock_mhz"] = read(gpu, "sm_clock", nv.nvmlDeviceGetClockInfo, h, CLOCK_SM, errors=errors)
        out["mem_clock_mhz"] = read(gpu, "mem_clock", nv.nvmlDeviceGetClockInfo, h, CLOCK_MEM, errors=errors)
        mask = self._clock_events(gpu, errors)
        out["clock_events"] = mask
        out["clock_event_names"] = clock_event_names(mask)
        out["temperature_c"] = read(gpu, "temperature", nv.nvmlDeviceGetTemperature, h, TEMPERATURE_GPU, errors=errors)
        out["power_mw"] = read(gpu, "power", nv.nvmlDeviceGetPowerUsage, h, errors=errors)
        util = read(gpu, "utilization", nv.nvmlDeviceGetUtilizationRates, h, errors=errors)
        out["util_gpu_pct"], out["util_mem_pct"] = (util.gpu, util.memory) if util is not None else (None, None)
        memory = read(gpu, "memory", nv.nvmlDeviceGetMemoryInfo, h, errors=errors)
        out["mem_used_bytes"], out["mem_total_bytes"] = (memory.used, memory.total) if memory is not None else (None, None)
        out["pcie_gen"] = read(gpu, "pcie_gen", nv.nvmlDeviceGetCurrPcieLinkGeneration, h, errors=errors)
        out["pcie_width"] = read(gpu, "pcie_width", nv.nvmlDeviceGetCurrPcieLinkWidth, h, errors=errors)
        out["pcie_tx_kb_s"] = read(gpu, "pcie_throughput", nv.nvmlDeviceGetPcieThroughput, h, PCIE_TX, errors=errors)
        out["pcie_rx_kb_s"] = read(gpu, "pcie_throughput", nv.nvmlDeviceGetPcieThroughput, h, PCIE_RX, errors=errors)
        if counters or not gpu.carried:
            gpu.carried = self._counters(gpu, errors)
        out.update(gpu.carried)
        out["read_error"] = "; ".join(errors) if errors else None
        return out

    def _counters(self, gpu, errors) -> dict:
        nv, h, read = self.nv, gpu.handle, self._read
        out = {}
        out["sm_clock_max_mhz"] = read(gpu, "sm_clock_max", nv.nvmlDeviceGetMaxClockInfo, h, CLOCK_SM, errors=errors)
        out["mem_clock_max_mhz"] = read(gpu, "mem_clock_max", nv.nvmlDeviceGetMaxClockInfo, h, CLOCK_MEM, errors=errors)
        out["power_limit_mw"] = read(gpu, "power_limit", nv.nvmlDeviceGetEnforcedPowerLimit, h, errors=errors)
        out["pcie_gen_max"] = read(gpu, "pcie_gen_max", nv.nvmlDeviceGetMaxPcieLinkGeneration, h, errors=errors)
        out["pcie_width_max"] = read(gpu, "pcie_width_max", nv.nvmlDeviceGetMaxPcieLinkWidth, h, errors=errors)
        links = self._nvlinks_up(gpu, errors)
        sums = {"nvlink_replay_errors": None, "nvlink_recovery_errors": None, "nvlink_crc_errors": None}
        if links is not None:
            for column, counter_ids in (("nvlink_replay_errors", (NVLINK_REPLAY,)),
                                        ("nvlink_recovery_errors", (NVLINK_RECOVERY,)),
                                        ("nvlink_crc_errors", (NVLINK_CRC_FLIT, NVLINK_CRC_DATA))):
                total = 0
                for link in links:
                    for counter in counter_ids:
                        value = read(gpu, f"nvlink_counter_{counter}", nv.nvmlDeviceGetNvLinkErrorCounter, h, link,
                                     counter, errors=errors)
                        total = total + value if value is not None and total is not None else None
                sums[column] = total if links else 0
        out["nvlink_links"] = len(links) if links is not None else None
        out.update(sums)
        out["ecc_corrected"] = read(gpu, "ecc", nv.nvmlDeviceGetTotalEccErrors, h, ECC_CORRECTED, ECC_VOLATILE,
                                    errors=errors)
        out["ecc_uncorrected"] = read(gpu, "ecc", nv.nvmlDeviceGetTotalEccErrors, h, ECC_UNCORRECTED, ECC_VOLATILE,
                                      errors=errors)
        rows = read(gpu, "remapped_rows", nv.nvmlDeviceGetRemappedRows, h, errors=errors)
        (out["remapped_rows_corrected"], out["remapped_rows_uncorrected"], out["remap_pending"],
         out["remap_failure"]) = rows if rows is not None else (None, None, None, None)
        return out

    def _nvlinks_up(self, gpu, errors):
        """The NVLinks that are up ([] when none is), or None when the GPU has no NVLink. A GPU with fewer
        links than NVML's maximum answers 'invalid argument' (or 'not supported') past its last one."""
        if "nvlink" in gpu.unsupported:
            return None
        links = []
        for link in range(NVLINK_MAX_LINKS):
            try:
                if self.nv.nvmlDeviceGetNvLinkState(gpu.handle, link):
                    links.append(link)
            except self.nv.NVMLError as exc:
                code = getattr(exc, "value", None)
                if link == 0 and code in _NOT_THERE:
                    gpu.unsupported.add("nvlink")
                    return None
                if code in _NOT_THERE or code == NVML_INVALID_ARGUMENT:
                    break                # past this GPU's last link
                if str(exc) not in errors:
                    errors.append(str(exc))
                return None              # not read (e.g. the GPU is lost): unknown, not 'no link up'

            except (AttributeError, TypeError):
                gpu.unsupported.add("nvlink")
                return None
        return links

    def compute_processes(self, gpu: Gpu):
        """[(pid, device memory bytes or None)] of NVML's running compute processes on one GPU."""
        procs = self._read(gpu, "processes", self.nv.nvmlDeviceGetComputeRunningProcesses, gpu.handle)
        if not procs:
            return []
        return [(int(p.pid), getattr(p, "usedGpuMemory", None)) for p in procs]
