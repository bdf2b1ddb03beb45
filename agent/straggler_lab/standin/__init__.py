"""The STAND-IN CUDA libraries, for machines without a GPU (tests, benchmarks, the demo).

`build_standin(out_dir)` compiles standin.c with gcc into three small shared libraries that
export the real symbol names and C signatures of libcuda.so.1 (driver API), libcudart.so.12
(runtime API) and libnccl.so.2 (NCCL collectives), with bodies of known, configurable
duration (see the top of standin.c: STRAGGLER_STANDIN_{LAUNCH,ALLOC,COPY,SYNC,NCCL}_US), and,
when asked (STRAGGLER_STANDIN_KERNEL_US, _CONTROL, _NCCL_ROOT, _NCCL_MODE), a per-process
"device" queue and a real cross-process NCCL collective over TCP (straggler_lab.demo.syncjob).
They are not NVIDIA code and touch no GPU; the agent traces them exactly as it would trace
the real libraries: by path and symbol name. `build_workload(out_dir)` compiles a small C
program that loads them and calls every traced function with known arguments.

Builds are cached: the outputs are rebuilt only when the C sources change (by hash), and
are replaced atomically, so concurrent builders do not see half-written files.
This module must not import BCC or anything else from straggler.
"""
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from straggler.errors import StragglerError

SOURCE_DIR = Path(__file__).resolve().parent
LIBRARY_SOURCE = SOURCE_DIR / "standin.c"
WORKLOAD_SOURCE = SOURCE_DIR / "workload.c"

# output name -> the -D switch that selects its part of standin.c
LIBRARIES = {
    "libcuda.so.1": "STANDIN_DRIVER",
    "libcudart.so.12": "STANDIN_RUNTIME",
    "libnccl.so.2": "STANDIN_NCCL",
}
WORKLOAD_NAME = "straggler-standin-workload"


def _gcc():
    gcc = shutil.which("gcc") or shutil.which("cc")
    if not gcc:
        raise StragglerError("gcc not found, needed to build the stand-in CUDA library: apt-get install gcc")
    return gcc


def _source_hash(*paths) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(Path(path).read_bytes())
    return digest.hexdigest()[:16]


def _compile(args, what):
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        first = (proc.stderr.strip().splitlines() or ["?"])[0]
        raise StragglerError(f"building the stand-in {what} failed: {first}; check gcc and {SOURCE_DIR}")


def _cached(out_dir: Path, stamp_name: str, want: str, outputs) -> bool:
    stamp = out_dir / stamp_name
    try:
        return stamp.read_text().strip() == want and all((out_dir / name).exists() for name in outputs)
    except OSError:
        return False


def build_standin(out_dir) -> str:
    """Build the stand-in libcuda.so.1, libcudart.so.12 and libnccl.so.2 into out_dir.

    Returns the path of libcuda.so.1 (the other two lie beside it). Cached by source hash."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    want = _source_hash(LIBRARY_SOURCE)
    if not _cached(out_dir, ".standin-libs.hash", want, LIBRARIES):
        gcc = _gcc()
        with tempfile.TemporaryDirectory(dir=out_dir, prefix=".build-") as tmp:
            for name, define in LIBRARIES.items():
                # -pthread -ldl: the device thread (libcuda) and the dlopen of it (libcudart, libnccl)
                _compile([gcc, "-O2", "-g", "-Wall", "-shared", "-fPIC", f"-D{define}", f"-Wl,-soname,{name}",
                          "-o", os.path.join(tmp, name), str(LIBRARY_SOURCE), "-pthread", "-ldl"], name)
            for name in LIBRARIES:
                os.replace(os.path.join(tmp, name), out_dir / name)
            (out_dir / ".standin-libs.hash").write_text(want + "\n")
    return str(out_dir / "libcuda.so.1")


def build_workload(out_dir) -> str:
    """Build the C workload that loads the stand-in libraries and calls them; returns its path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    want = _source_hash(WORKLOAD_SOURCE)
    if not _cached(out_dir, ".standin-workload.hash", want, [WORKLOAD_NAME]):
        gcc = _gcc()
        with tempfile.TemporaryDirectory(dir=out_dir, prefix=".build-") as tmp:
            _compile([gcc, "-O2", "-g", "-o", os.path.join(tmp, WORKLOAD_NAME), str(WORKLOAD_SOURCE), "-ldl"],
                     WORKLOAD_NAME)
            os.replace(os.path.join(tmp, WORKLOAD_NAME), out_dir / WORKLOAD_NAME)
            (out_dir / ".standin-workload.hash").write_text(want + "\n")
    return str(out_dir / WORKLOAD_NAME)
