"""Which CUDA/NCCL functions are traced, under which symbol names, and where the libraries are.

The table below is the single source of truth for the traced functions: their base op name
(what `events.op` holds), source (`cuda` runtime, `driver`, `nccl`), which arguments are kept,
the symbol names to look for, and the function's CALL CLASS -- what the time a thread spends in
it means for a step of a training job:
  work        the host side of GPU work: launches, allocations, copies (on-CPU, short)
  sync        waits for the device: *Synchronize (with NCCL on a GPU, also the wait for peers,
              since collectives only enqueue)
  collective  NCCL collectives (a blocking collective is where a rank waits for its peers)
The kernel (bpf/cuda.c, bpf/sched.c) gets the class per op id from here; explain, export and
synth read OP_CLASS. Nothing else decides what a function is. Each function lists groups of alternatives: from each group
the FIRST symbol the library exports is attached (`cuMemAlloc_v2` before plain `cuMemAlloc`),
and every group is tried (so `cuLaunchKernel` and `cuLaunchKernel_ptsz` are both attached).
Two names at the same address (aliases) are attached once.

Libraries are found by name (libcuda.so*, libcudart.so*, libcudart-<hash>.so*, libnccl.so*) in
/proc/PID/maps of running processes, in the usual install paths, or given by the user; they
are attached by path and symbol name, the real ones exactly like the stand-in. A target's own
executable is looked at too: one built with the runtime linked in statically (nvcc's default)
has the runtime's functions in its symbol table and is attached the same way. What a library of
a kind lacks (missing_functions) is recorded too, so that silence is never mistaken for no calls.

This module must not import BCC (the loader does); it only describes and finds.
"""
import glob
import os
import re

# arg kinds: keep in sync with bpf/cuda.c
(ARG_NONE, ARG_BYTES2, ARG_BYTES3, ARG_BYTES5, ARG_CU_LAUNCH, ARG_CUDA_LAUNCH, ARG_NCCL, ARG_NCCL_ROOT,
 ARG_NCCL_GATHER, ARG_NCCL_REDUCE, ARG_NCCL_P2P, ARG_NCCL_INIT, ARG_NCCL_SPLIT) = range(13)
ARG_NCCL_COLL_KINDS = {ARG_NCCL, ARG_NCCL_ROOT, ARG_NCCL_GATHER, ARG_NCCL_REDUCE, ARG_NCCL_P2P}
ARG_NCCL_SETUP_KINDS = {ARG_NCCL_INIT, ARG_NCCL_SPLIT}      # communicator set-up: always a row
ARG_NCCL_KINDS = ARG_NCCL_COLL_KINDS | ARG_NCCL_SETUP_KINDS
ARG_HAS_BYTES = {ARG_BYTES2, ARG_BYTES3, ARG_BYTES5} | ARG_NCCL_COLL_KINDS
ARG_HAS_DIMS = {ARG_CU_LAUNCH, ARG_CUDA_LAUNCH}
# ncclDataType_t and ncclRedOp_t (nccl.h), for events.detail
# ncclDataType_t in its enum's order, with each type's size in bytes
NCCL_DATATYPE_BYTES = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8, "float16": 2,
                       "float32": 4, "float64": 8, "bfloat16": 2, "float8e4m3": 1, "float8e5m2": 1}
NCCL_DATATYPES = tuple(NCCL_DATATYPE_BYTES)
NCCL_OPS = ("sum", "prod", "max", "min", "avg")


def _v2(name, extra_suffix=None):
    """[name_v2, name] (first found) and, when the variant exists, name_v2 + suffix."""
    groups = [[name + "_v2", name]]
    if extra_suffix:
        groups.append([name + "_v2" + extra_suffix])
    return groups


CALL_CLASSES = ("work", "sync", "collective")          # ids 1, 2, 3 in the kernel; 0 = no call
CLASS_ID = {name: i + 1 for i, name in enumerate(CALL_CLASSES)}

# (op, source, arg kind, symbol groups); the class: see _class_of below
FUNCTIONS = [
    # driver API (libcuda)
    ("cuLaunchKernel", "driver", ARG_CU_LAUNCH, [["cuLaunchKernel"], ["cuLaunchKernel_ptsz"]]),
    ("cuMemAlloc", "driver", ARG_BYTES2, _v2("cuMemAlloc")),
    ("cuMemFree", "driver", ARG_NONE, _v2("cuMemFree")),
    ("cuMemcpy", "driver", ARG_BYTES3, [["cuMemcpy"], ["cuMemcpy_ptds"]]),
    ("cuMemcpyAsync", "driver", ARG_BYTES3, [["cuMemcpyAsync"], ["cuMemcpyAsync_ptsz"]]),
    ("cuMemcpyHtoD", "driver", ARG_BYTES3, _v2("cuMemcpyHtoD", "_ptds")),
    ("cuMemcpyDtoH", "driver", ARG_BYTES3, _v2("cuMemcpyDtoH", "_ptds")),
    ("cuMemcpyDtoD", "driver", ARG_BYTES3, _v2("cuMemcpyDtoD", "_ptds")),
    ("cuMemcpyHtoDAsync", "driver", ARG_BYTES3, _v2("cuMemcpyHtoDAsync", "_ptsz")),
    ("cuMemcpyDtoHAsync", "driver", ARG_BYTES3, _v2("cuMemcpyDtoHAsync", "_ptsz")),
    ("cuMemcpyDtoDAsync", "driver", ARG_BYTES3, _v2("cuMemcpyDtoDAsync", "_ptsz")),
    ("cuMemcpyPeer", "driver", ARG_BYTES5, [["cuMemcpyPeer"], ["cuMemcpyPeer_ptds"]]),
    ("cuMemcpyPeerAsync", "driver", ARG_BYTES5, [["cuMemcpyPeerAsync"], ["cuMemcpyPeerAsync_ptsz"]]),
    ("cuCtxSynchronize", "driver", ARG_NONE, [["cuCtxSynchronize"]]),
    ("cuStreamSynchronize", "driver", ARG_NONE, [["cuStreamSynchronize"], ["cuStreamSynchronize_ptsz"]]),
    # runtime API (libcudart)
    ("cudaLaunchKernel", "cuda", ARG_CUDA_LAUNCH, [["cudaLaunchKernel"], ["cudaLaunchKernel_ptsz"]]),
    ("cudaMalloc", "cuda", ARG_BYTES2, [["cudaMalloc"]]),
    ("cudaFree", "cuda", ARG_NONE, [["cudaFree"]]),
    ("cudaMemcpy", "cuda", ARG_BYTES3, [["cudaMemcpy"], ["cudaMemcpy_ptds"]]),
    ("cudaMemcpyAsync", "cuda", ARG_BYTES3, [["cudaMemcpyAsync"], ["cudaMemcpyAsync_ptsz"]]),
    ("cudaStreamSynchronize", "cuda", ARG_NONE, [["cudaStreamSynchronize"], ["cudaStreamSynchronize_ptsz"]]),
    ("cudaDeviceSynchronize", "cuda", ARG_NONE, [["cudaDeviceSynchronize"]]),
    # NCCL collectives, point-to-point and groups (libnccl): count, datatype, op, root/peer and the
    # communicator go to events.detail (nccl_detail below)
    ("ncclAllReduce", "nccl", ARG_NCCL, [["ncclAllReduce"]]),
    ("ncclBroadcast", "nccl", ARG_NCCL_ROOT, [["ncclBroadcast"]]),
    ("ncclAllGather", "nccl", ARG_NCCL_GATHER, [["ncclAllGather"]]),
    ("ncclReduceScatter", "nccl", ARG_NCCL, [["ncclReduceScatter"]]),
    ("ncclReduce", "nccl", ARG_NCCL_REDUCE, [["ncclReduce"]]),
    ("ncclSend", "nccl", ARG_NCCL_P2P, [["ncclSend"]]),
    ("ncclRecv", "nccl", ARG_NCCL_P2P, [["ncclRecv"]]),
    ("ncclGroupStart", "nccl", ARG_NONE, [["ncclGroupStart"]]),
    ("ncclGroupEnd", "nccl", ARG_NONE, [["ncclGroupEnd"]]),
    # communicator set-up (a rendezvous of its ranks, so a collective): always a row, with nranks, rank and
    # the unique id's magic (the same on every rank of one communicator), or the parent, color and key; and
    # the new communicator, read at return. explain groups the collectives per communicator with them.
    ("ncclCommInitRank", "nccl", ARG_NCCL_INIT, [["ncclCommInitRank"], ["ncclCommInitRankConfig"]]),
    ("ncclCommSplit", "nccl", ARG_NCCL_SPLIT, [["ncclCommSplit"]]),
]
SETUP_OPS = ("ncclCommInitRank", "ncclCommSplit")     # the ops whose rows define communicators


def nccl_detail(arg_kind, dims):
    """events.detail of an NCCL call from the kernel's dims: count, datatype, op, root or peer, and the
    communicator (its address in the process: the same value on every call of one communicator).
    Set-up calls: nranks, rank and the unique id's magic (ncclCommInitRank*), or color, key and the
    parent (ncclCommSplit), and the new communicator ("0x0" when the call failed)."""
    d0, d1, d2, d3, d4, d5 = dims
    if arg_kind == ARG_NCCL_INIT:
        return {"nranks": _s32(d0), "rank": _s32(d1), "id": f"0x{d2 | (d3 << 32):016x}", "comm": f"0x{d4 | (d5 << 32):x}"}
    if arg_kind == ARG_NCCL_SPLIT:
        return {"color": _s32(d0), "key": _s32(d1), "parent": f"0x{d2 | (d3 << 32):x}", "comm": f"0x{d4 | (d5 << 32):x}"}
    out = {"count": d0 | (d1 << 32),
           "datatype": NCCL_DATATYPES[d2] if d2 < len(NCCL_DATATYPES) else d2}
    op, who = d3 & 0xffff, d3 >> 16
    if op != 0xffff:
        out["op"] = NCCL_OPS[op] if op < len(NCCL_OPS) else op
    if who != 0xffff:
        out["peer" if arg_kind == ARG_NCCL_P2P else "root"] = who
    out["comm"] = f"0x{d4 | (d5 << 32):x}"
    return out


def _s32(v):
    return v - (1 << 32) if v >= 1 << 31 else v


def _class_of(op, source):
    if source == "nccl":
        return "collective"
    if "Synchronize" in op:
        return "sync"
    return "work"


class Symbol:
    """One symbol name the agent can attach to: its id in the BPF program and its function."""
    __slots__ = ("sym_id", "name", "op_id", "op", "source", "arg_kind", "fn_name")

    def __init__(self, sym_id, name, op_id, op, source, arg_kind):
        self.sym_id, self.name, self.op_id, self.op = sym_id, name, op_id, op
        self.source, self.arg_kind = source, arg_kind
        self.fn_name = "entry_" + name


OPS = [op for op, _, _, _ in FUNCTIONS]
LAUNCH_OPS = tuple(op for op, _, kind, _ in FUNCTIONS if kind in ARG_HAS_DIMS)           # a kernel launched
COLLECTIVE_OPS = tuple(op for op, _, kind, _ in FUNCTIONS if kind in ARG_NCCL_COLL_KINDS)   # a step's collectives
OP_SOURCE = {op: source for op, source, _, _ in FUNCTIONS}
OP_CLASS = {op: _class_of(op, source) for op, source, _, _ in FUNCTIONS}
SYNC_OPS = tuple(op for op in OPS if OP_CLASS[op] == "sync")      # where a rank waits for its device (and peers)
# a step's sync points: its collectives, and, behind collectives that only enqueue, the synchronize after them
# (explain's steps.py; the live answer carries the same calls to the watch)
STEP_OPS = COLLECTIVE_OPS + SYNC_OPS
SYMBOLS = []          # by sym_id
GROUPS = []           # (op_id, [Symbol, ...] alternatives in order)
for _op_id, (_op, _source, _kind, _groups) in enumerate(FUNCTIONS):
    for _group in _groups:
        alternatives = []
        for _name in _group:
            sym = Symbol(len(SYMBOLS), _name, _op_id, _op, _source, _kind)
            SYMBOLS.append(sym)
            alternatives.append(sym)
        GROUPS.append((_op_id, alternatives))
SYMBOL_BY_NAME = {s.name: s for s in SYMBOLS}
SYMBOL_REGEX = "^(" + "|".join(re.escape(s.name) for s in SYMBOLS) + ")$"

# Library file names we recognise (the real ones and the stand-in).
LIBRARY_NAME = re.compile(r"(^|/)lib(cuda|cudart|nccl)(-[0-9a-f]{8})?\.so(\.[0-9.]+)?$")

# Where the libraries usually are when no process maps them yet.
INSTALL_GLOBS = [
    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    "/usr/lib64/libcuda.so.1",
    "/usr/lib/wsl/lib/libcuda.so.1",
    "/usr/local/cuda/lib64/libcudart.so.*",
    "/usr/local/cuda/targets/x86_64-linux/lib/libcudart.so.*",
    "/usr/local/cuda-*/targets/x86_64-linux/lib/libcudart.so.*",
    "/usr/lib/x86_64-linux-gnu/libcudart.so.*",
    "/usr/lib/x86_64-linux-gnu/libnccl.so.2",
    "/usr/lib64/libnccl.so.2",
]


def bpf_entry_lines():
    """The CALL_ENTRY(...) lines appended to bpf/cuda.c: one BPF function per symbol."""
    return "\n".join(f"CALL_ENTRY({s.fn_name}, {s.sym_id}, {s.op_id}, {s.arg_kind})" for s in SYMBOLS)


def choose_symbols(exported):
    """From {name: address} exported by one library, the symbols to attach: [(Symbol, address)].

    First existing alternative of each group; an address already taken (an alias) is skipped."""
    chosen, taken = [], set()
    for _op_id, alternatives in GROUPS:
        for sym in alternatives:
            addr = exported.get(sym.name)
            if addr is None:
                continue
            if addr not in taken:
                chosen.append((sym, addr))
                taken.add(addr)
            break
    return chosen


# What the traced functions' return codes mean (cudaError_t, CUresult, ncclResult_t: 0 is success).
# The common ones, for people; explain prints the number beside the name, and any code not here as a number.
ERROR_NAMES = {
    "cuda": {1: "cudaErrorInvalidValue", 2: "cudaErrorMemoryAllocation", 3: "cudaErrorInitializationError",
             4: "cudaErrorCudartUnloading", 35: "cudaErrorInsufficientDriver", 46: "cudaErrorDevicesUnavailable",
             98: "cudaErrorInvalidDeviceFunction", 100: "cudaErrorNoDevice", 101: "cudaErrorInvalidDevice",
             209: "cudaErrorNoKernelImageForDevice", 214: "cudaErrorECCUncorrectable",
             400: "cudaErrorInvalidResourceHandle", 700: "cudaErrorIllegalAddress", 719: "cudaErrorLaunchFailure",
             999: "cudaErrorUnknown"},
    "driver": {1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY", 3: "CUDA_ERROR_NOT_INITIALIZED",
               4: "CUDA_ERROR_DEINITIALIZED", 100: "CUDA_ERROR_NO_DEVICE", 101: "CUDA_ERROR_INVALID_DEVICE",
               214: "CUDA_ERROR_ECC_UNCORRECTABLE", 400: "CUDA_ERROR_INVALID_HANDLE", 700: "CUDA_ERROR_ILLEGAL_ADDRESS",
               719: "CUDA_ERROR_LAUNCH_FAILED", 999: "CUDA_ERROR_UNKNOWN"},
    "nccl": {1: "ncclUnhandledCudaError", 2: "ncclSystemError", 3: "ncclInternalError", 4: "ncclInvalidArgument",
             5: "ncclInvalidUsage", 6: "ncclRemoteError", 7: "ncclInProgress"},
}


# A return code that is not a failure although it is not 0: ncclInProgress, from a non-blocking NCCL
# communicator (its operation goes on; a set-up's new communicator is valid at once). The kernel mirrors
# it (bpf/cuda.c NCCL_IN_PROGRESS: such a call gets no "error" row); explain's SQL reads NOT_FAILURES.
NCCL_IN_PROGRESS = 7
NOT_FAILURES = {"nccl": (NCCL_IN_PROGRESS,)}
SETUP_OK = (0, NCCL_IN_PROGRESS)        # a communicator set-up that made its communicator


def error_name(source, code):
    """'35 cudaErrorInsufficientDriver', or the number alone when the code is not a common one."""
    name = ERROR_NAMES.get(source, {}).get(code)
    return f"{code} {name}" if name else str(code)


def missing_functions(chosen):
    """What a library (or an executable that carries the runtime) should have but lacks: for each
    source it provides (runtime, driver, NCCL: judged by what it does export), the traced functions of
    that source none of whose symbols it exports. [op, ...] in the table's order."""
    sources = {sym.source for sym, _ in chosen}
    have = {sym.op for sym, _ in chosen}
    return [op for op, source, _, _ in FUNCTIONS if source in sources and op not in have]


def executable_of(pid):
    """The executable of a process, as a path this process can open (None if it is gone or hidden).
    A program built with the CUDA runtime linked in statically (nvcc's default) carries the
    runtime's functions itself: it is attached like a library."""
    try:
        path = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None
    if path.endswith(" (deleted)") or not path.startswith("/"):
        return None
    return reachable_path(pid, path)


def is_cuda_library(path: str) -> bool:
    return bool(LIBRARY_NAME.search(path))


def libraries_in_maps(pid) -> list:
    """Paths of CUDA/NCCL libraries mapped by a process, as the agent can open them.

    A path seen in another mount namespace is reached through /proc/PID/root."""
    found = []
    try:
        with open(f"/proc/{pid}/maps", "rb") as maps:
            data = maps.read()
    except OSError:
        return found
    if b"libcu" not in data and b"libnccl" not in data:
        return found
    seen = set()
    for line in data.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6:
            continue
        path = parts[5].decode("utf-8", "replace").strip()
        if path in seen or not path.startswith("/") or not is_cuda_library(path):
            continue
        seen.add(path)
        found.append(reachable_path(pid, path))
    return found


def reachable_path(pid, path):
    """`path` as mapped by process `pid`, as a path this process can open (same file)."""
    via_root = f"/proc/{pid}/root{path}"
    try:
        theirs = os.stat(via_root)
    except OSError:
        return path
    try:
        ours = os.stat(path)
        if (ours.st_dev, ours.st_ino) == (theirs.st_dev, theirs.st_ino):
            return path
    except OSError:
        pass
    return via_root


def libraries_in_install_paths() -> list:
    found = []
    for pattern in INSTALL_GLOBS:
        for path in sorted(glob.glob(pattern)):
            if os.path.isfile(path) and is_cuda_library(path):
                found.append(path)
    return found


def file_identity(path):
    """(st_dev, st_ino) of a file, so one library reached by two paths is attached once."""
    st = os.stat(path)
    return (st.st_dev, st.st_ino)
