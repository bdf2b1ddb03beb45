"""A workload for tests/test_nvidia_binaries.py: NVIDIA's real CUDA runtime or NCCL library, loaded
through ctypes by the Python that runs this (a virtual environment's, where the wheels put them), and
called a known number of times. Without a GPU every call fails at once with its real error code;
it prints what each call returned, so the test compares the agent's rows with the program's own count.

    python nvidia_workload.py cudart /path/libcudart.so.12 GO_FILE
    python nvidia_workload.py nccl /path/libnccl.so.2 GO_FILE
    python nvidia_workload.py malloc /path/libcudart.so.99 GO_FILE      (a library with cudaMalloc only)

It loads the library, then waits (at most 120 s) for GO_FILE to exist before it calls anything: a
running job's libraries are attached when the agent sees them mapped, and the test lets it see them.
"""
import ctypes
import json
import os
import sys
import time


class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


def cudart(lib):
    rets = {}
    ptr = ctypes.c_void_p()
    for _ in range(20):
        rets.setdefault("cudaMalloc", []).append(lib.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(1 << 20)))
    launch = lib.cudaLaunchKernel
    launch.argtypes = [ctypes.c_void_p, Dim3, Dim3, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    for i in range(30):
        rets.setdefault("cudaLaunchKernel", []).append(
            launch(ctypes.c_void_p(0x1000), Dim3(7 + i, 2, 1), Dim3(128, 1, 1), None, 0, None))
    for _ in range(10):
        rets.setdefault("cudaStreamSynchronize", []).append(lib.cudaStreamSynchronize(None))
    for _ in range(5):
        rets.setdefault("cudaDeviceSynchronize", []).append(lib.cudaDeviceSynchronize())
    return rets


NCCL_CALLS = {   # op: (times, arguments as the agent should record them, besides the communicator)
    "ncclAllReduce": (30, {"count": 1000, "datatype": "float32", "op": "sum"}),
    "ncclBroadcast": (10, {"count": 100, "datatype": "float64", "root": 2}),
    "ncclAllGather": (5, {"count": 50, "datatype": "int32"}),
    "ncclReduceScatter": (5, {"count": 10, "datatype": "bfloat16", "op": "avg"}),
    "ncclReduce": (4, {"count": 64, "datatype": "float16", "op": "max", "root": 3}),
    "ncclSend": (3, {"count": 8, "datatype": "int64", "peer": 5}),
    "ncclRecv": (3, {"count": 8, "datatype": "int64", "peer": 6}),
}


# the set-up calls' arguments: ncclCommInitRank(nranks, rank) and ncclCommInitRankConfig(nranks, rank + 1) with an
# id whose magic is `id`; ncclCommSplit(the communicator above, color, key)
SETUP = {"id": 0x1122334455667788, "nranks": 4, "rank": 2, "color": 1, "key": 7}


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]      # NCCL_UNIQUE_ID_BYTES, passed by value


def nccl(lib):
    rets = {}
    f32, f64, i32, i64, f16, bf16 = 7, 8, 2, 4, 6, 9           # ncclDataType_t
    total, avg, maximum = 0, 4, 2                               # ncclRedOp_t
    buf = ctypes.create_string_buffer(1 << 16)
    # a communicator NCCL did not make: zeroed memory, larger than ncclComm, so NCCL reads its magic
    # numbers, finds them wrong and returns ncclInvalidArgument; its address is what the agent must
    # record (a NULL one would not tell the communicator from the stream after it)
    comm = ctypes.create_string_buffer(64 << 20)
    stream = ctypes.c_void_p(0x5eed)
    size = ctypes.c_size_t
    calls = {
        "ncclAllReduce": lambda: lib.ncclAllReduce(buf, buf, size(1000), f32, total, comm, stream),
        "ncclBroadcast": lambda: lib.ncclBroadcast(buf, buf, size(100), f64, 2, comm, stream),
        "ncclAllGather": lambda: lib.ncclAllGather(buf, buf, size(50), i32, comm, stream),
        "ncclReduceScatter": lambda: lib.ncclReduceScatter(buf, buf, size(10), bf16, avg, comm, stream),
        "ncclReduce": lambda: lib.ncclReduce(buf, buf, size(64), f16, maximum, 3, comm, stream),
        "ncclSend": lambda: lib.ncclSend(buf, size(8), i64, 5, comm, stream),
        "ncclRecv": lambda: lib.ncclRecv(buf, size(8), i64, 6, comm, stream),
    }

    rets["ncclGroupStart"] = [lib.ncclGroupStart()]
    for op, (times, _) in NCCL_CALLS.items():
        rets[op] = [calls[op]() for _ in range(times)]
    rets["ncclGroupEnd"] = [lib.ncclGroupEnd()]
    # communicator set-up: without a GPU each fails at once (ncclUnhandledCudaError) and makes no communicator
    uid = UniqueId()
    ctypes.memmove(ctypes.addressof(uid), SETUP["id"].to_bytes(8, "little"), 8)     # NCCL's id begins with its magic
    new = ctypes.c_void_p(0)
    lib.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId, ctypes.c_int]
    lib.ncclCommInitRankConfig.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId, ctypes.c_int,
                                           ctypes.c_void_p]
    lib.ncclCommSplit.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
                                  ctypes.c_void_p]
    rets["ncclCommInitRank"] = [lib.ncclCommInitRank(ctypes.byref(new), SETUP["nranks"], uid, SETUP["rank"]),
                                lib.ncclCommInitRankConfig(ctypes.byref(new), SETUP["nranks"], uid, SETUP["rank"] + 1,
                                                           None)]
    rets["ncclCommSplit"] = [lib.ncclCommSplit(comm, SETUP["color"], SETUP["key"], ctypes.byref(new), None)]
    return rets, f"0x{ctypes.addressof(comm):x}"


def malloc_only(lib):
    ptr = ctypes.c_void_p()
    return {"cudaMalloc": [lib.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(4096)) for _ in range(7)]}


def main():
    which, path, go = sys.argv[1], sys.argv[2], sys.argv[3]
    lib = ctypes.CDLL(path)
    deadline = time.monotonic() + 120
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            sys.exit(f"{go} did not appear within 120 s")
        time.sleep(0.05)
    if which == "nccl":
        rets, comm = nccl(lib)
        print(json.dumps({"library": path, "calls": rets, "comm": comm}))
    else:
        rets = {"cudart": cudart, "malloc": malloc_only}[which](lib)
        print(json.dumps({"library": path, "calls": rets}))


if __name__ == "__main__":
    main()
