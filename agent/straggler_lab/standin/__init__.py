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

`build_standin_nvml(out_dir)` compiles nvml.c into a stand-in libnvidia-ml.so.1 (NVML's calls
that the agent makes through nvidia-ml-py), whose GPUs are listed in a small file
(STRAGGLER_STANDIN_NVML_CONFIG, written by `write_nvml_config`): each GPU follows its rank's
control file (throttle=, gpu_factor=, pcie_gen=, ecc_*=, ...: standin_control.h), and lists as
its running processes those that loaded the stand-in libcuda with that control file.

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
CONTROL_HEADER = SOURCE_DIR / "standin_control.h"   # the control file and the GPUs file, read by both C parts
NVML_SOURCE = SOURCE_DIR / "nvml.c"
WORKLOAD_SOURCE = SOURCE_DIR / "workload.c"
NVML_NAME = "libnvidia-ml.so.1"
NVML_SUBDIR = "nvml"      # its own directory: LD_LIBRARY_PATH=<it> brings in NVML and nothing else

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
    want = _source_hash(LIBRARY_SOURCE, CONTROL_HEADER)
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


def build_standin_nvml(out_dir) -> str:
    """Build the stand-in NVML, libnvidia-ml.so.1, into out_dir/nvml/ (alone there, so that
    LD_LIBRARY_PATH=out_dir/nvml makes nvidia-ml-py load it and changes nothing else). Returns its path.
    Its GPUs: the file named by STRAGGLER_STANDIN_NVML_CONFIG (standin_control.h). Cached by source hash."""
    out_dir = Path(out_dir) / NVML_SUBDIR
    out_dir.mkdir(parents=True, exist_ok=True)
    want = _source_hash(NVML_SOURCE, CONTROL_HEADER)
    if not _cached(out_dir, ".standin-nvml.hash", want, [NVML_NAME]):
        gcc = _gcc()
        with tempfile.TemporaryDirectory(dir=out_dir, prefix=".build-") as tmp:
            _compile([gcc, "-O2", "-g", "-Wall", "-shared", "-fPIC", f"-Wl,-soname,{NVML_NAME}",
                      "-o", os.path.join(tmp, NVML_NAME), str(NVML_SOURCE), "-pthread"], NVML_NAME)
            os.replace(os.path.join(tmp, NVML_NAME), out_dir / NVML_NAME)
            (out_dir / ".standin-nvml.hash").write_text(want + "\n")
    return str(out_dir / NVML_NAME)


def write_nvml_config(path, gpus, registry=None):
    """Write the stand-in NVML's GPUs file: one dict per GPU with index, uuid, pci ('0000:c1:00.0') and
    control (its rank's control file), and any other key of standin_control.h (nvlinks, unsupported, ...)."""
    lines = [f"registry={registry}"] if registry else []
    for gpu in gpus:
        words = []
        for key, value in gpu.items():
            text = ",".join(value) if isinstance(value, (list, tuple)) else str(value)
            if not text:
                continue
            if any(c.isspace() for c in text):
                raise StragglerError(f"stand-in NVML config: {key}={text!r} must be one word")
            words.append(f"{key}={text}")
        lines.append(" ".join(words))
    tmp = Path(f"{path}.tmp")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, path)
    return str(path)


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
