"""The demo's training job: a real torch.distributed (gloo) data-parallel job, one rank per
host, launched per host with torchrun:

    GLOO_SOCKET_IFNAME=eth0 torchrun --nnodes=4 --node_rank=I --nproc_per_node=1 \\
        --master_addr=RANK0_ADDR --master_port=29500 -m straggler_lab.demo.trainer --seconds 60 --log-dir DIR

Each step does real work on the CPU (a small MLP, about 250k parameters, batch 32, forward,
backward, DDP all-reduce of the gradients over gloo, SGD) and its "GPU work" through a CUDA
library called with ctypes: cuMemAlloc, a few cuLaunchKernel, cuStreamSynchronize (the wait
for the GPU, about 10 ms) and cuMemFree. On this machine there is no GPU: the library is
the project's STAND-IN libcuda (straggler_lab.standin, built from C, calls of known duration),
so the agent's CUDA probes see realistic calls. `--real-cuda` uses the system's libcuda.so.1
instead (a GPU node): then a tiny spin kernel loaded from PTX stands for the work.

Step times go to DIR/steps-rank<R>.csv (one line per step, flushed), so the demo can show
that every rank slowed down. The run is bounded (--steps and/or --seconds); ranks agree on
when to stop with an all-reduce every few steps, so none is left waiting in a collective.
A SIGTERM/SIGINT or the file --stop-file also ends the run at the next agreement.

This module must not import anything from the agent or the analysis: it is the workload
they observe, nothing more.
"""
import argparse
import ctypes
import ctypes.util
import os
import signal
import sys
import time

# ---------------------------------------------------------------- the "GPU work" (CUDA driver API)

# PTX for a kernel that spins on the GPU's clock for `cycles` cycles: the stand-in for real
# work when --real-cuda runs on a GPU node (JIT-compiled by the driver for the device).
SPIN_PTX = b"""
.version 7.0
.target sm_70
.address_size 64
.visible .entry straggler_spin(.param .u64 cycles)
{
  .reg .pred p;
  .reg .u64 c, start, now, target;
  ld.param.u64 c, [cycles];
  mov.u64 start, %clock64;
  add.u64 target, start, c;
SPIN:
  mov.u64 now, %clock64;
  setp.lt.u64 p, now, target;
  @p bra SPIN;
  ret;
}
"""
CU_DEVICE_ATTRIBUTE_CLOCK_RATE = 13  # kHz


class CudaError(RuntimeError):
    pass


class GpuWork:
    """One rank's GPU work per step, through the CUDA driver API loaded with ctypes.

    With the STAND-IN library (no GPU) the calls take the durations the stand-in was
    configured with (its environment); with the real libcuda the spin kernel takes
    `gpu_wait_ms` on the device and cuStreamSynchronize waits for it."""

    def __init__(self, lib_path, launches_per_step=4, alloc_bytes=4 << 20, gpu_wait_ms=10.0, real=False):
        if not real:
            # the stand-in reads its call durations from the environment when it is loaded:
            # synchronisations sleep (the wait for the GPU), launches/allocs busy-wait briefly
            os.environ.setdefault("STRAGGLER_STANDIN_SYNC_US", str(int(gpu_wait_ms * 1000)))
            # host-side cost of a launch as a framework sees it (dispatch + cuLaunchKernel: ~20 µs);
            # allocations keep the stand-in's default (20 µs)
            os.environ.setdefault("STRAGGLER_STANDIN_LAUNCH_US", "20")
        self.lib = ctypes.CDLL(lib_path)
        self.lib_path = lib_path
        self.real = real
        self.launches_per_step = launches_per_step
        self.alloc_bytes = alloc_bytes
        self.gpu_wait_ms = gpu_wait_ms
        self._check("cuInit", self.lib.cuInit(0))
        self.device = ctypes.c_int(0)
        self.ctx = ctypes.c_void_p()
        if real:  # the stand-in has no devices or contexts to set up
            self._check("cuDeviceGet", self.lib.cuDeviceGet(ctypes.byref(self.device), 0))
            create = getattr(self.lib, "cuCtxCreate_v2", None) or self.lib.cuCtxCreate
            self._check("cuCtxCreate", create(ctypes.byref(self.ctx), 0, self.device))
        self.stream = ctypes.c_void_p(0)  # the default stream
        self.function = ctypes.c_void_p(0)
        self.spin_cycles = ctypes.c_uint64(0)
        if real:
            module = ctypes.c_void_p()
            self._check("cuModuleLoadData", self.lib.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(SPIN_PTX)))
            self._check("cuModuleGetFunction", self.lib.cuModuleGetFunction(ctypes.byref(self.function), module, b"straggler_spin"))
            khz = ctypes.c_int(0)
            self._check("cuDeviceGetAttribute", self.lib.cuDeviceGetAttribute(ctypes.byref(khz), CU_DEVICE_ATTRIBUTE_CLOCK_RATE, self.device))
            # the whole wait is split over the step's launches
            self.spin_cycles.value = int(khz.value * gpu_wait_ms / max(1, launches_per_step))
        self._alloc = getattr(self.lib, "cuMemAlloc_v2", None) or self.lib.cuMemAlloc
        self._free = getattr(self.lib, "cuMemFree_v2", None) or self.lib.cuMemFree
        self._launch = self.lib.cuLaunchKernel
        self._launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self._sync = self.lib.cuStreamSynchronize
        self._sync.argtypes = [ctypes.c_void_p]
        self._param_ptrs = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(self.spin_cycles), ctypes.c_void_p))

    @staticmethod
    def _check(what, rc):
        if rc != 0:
            raise CudaError(f"{what} returned CUDA error {rc}")

    def alloc(self):
        dptr = ctypes.c_uint64(0)
        self._check("cuMemAlloc", self._alloc(ctypes.byref(dptr), ctypes.c_size_t(self.alloc_bytes)))
        return dptr

    def launch(self):
        self._check("cuLaunchKernel", self._launch(self.function, 64, 1, 1, 256, 1, 1, 0, self.stream,
                                                   self._param_ptrs if self.real else None, None))

    def sync(self):
        self._check("cuStreamSynchronize", self._sync(self.stream))

    def free(self, dptr):
        self._check("cuMemFree", self._free(dptr))

    def step(self):
        """A step's GPU calls in one go: cuMemAlloc, the launches, the wait for the GPU, cuMemFree."""
        dptr = self.alloc()
        for _ in range(self.launches_per_step):
            self.launch()
        self.sync()
        self.free(dptr)


def attach_gpu_calls(model, gpu, per_op=3):
    """Make the model's CPU work issue its GPU calls where a GPU job issues them: `per_op`
    cuLaunchKernel after each Linear's forward (GEMM, bias, activation) and for each
    parameter's gradient (backward), the step's cuMemAlloc with the first gradient. On a GPU
    node the trainer's CPU time is mostly this: dispatching and launching kernels. The calls
    are spread over the step's CPU time, so a trainer that loses its CPU in the middle of a
    step loses it inside them too. Returns the step's state (the allocation to free) and the
    number of launches per step (without the optimizer's)."""
    state = {"dptr": None}

    def launch_op():
        for _ in range(per_op):
            gpu.launch()

    def after_forward(_module, _inputs, _output):
        launch_op()

    def on_grad(_grad):
        if state["dptr"] is None:
            state["dptr"] = gpu.alloc()
        launch_op()

    launches = 0
    for module in model.modules():
        if module.__class__.__name__ == "Linear":
            module.register_forward_hook(after_forward)
            launches += per_op
    for param in model.parameters():
        param.register_hook(on_grad)
        launches += per_op
    return state, launches


def find_cuda_library(args):
    """The library this rank calls: --cuda-lib, else the real libcuda with --real-cuda, else
    the stand-in built into --standin-dir (built now if missing)."""
    if args.cuda_lib:
        return args.cuda_lib
    if args.real_cuda:
        return ctypes.util.find_library("cuda") or "libcuda.so.1"
    from straggler_lab.standin import build_standin  # builds once, reuses the file afterwards
    return build_standin(args.standin_dir)


# ---------------------------------------------------------------- the job

def build_arg_parser():
    p = argparse.ArgumentParser(prog="straggler_lab.demo.trainer", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: no step limit)")
    p.add_argument("--seconds", type=float, default=60.0, help="stop after this many seconds of training (always bounded)")
    p.add_argument("--log-dir", required=True, help="directory for steps-rank<R>.csv")
    p.add_argument("--stop-file", help="end the run (all ranks, at the next agreement) when this file exists")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--hidden", type=int, default=512, help="MLP width (512: about 250k parameters)")
    p.add_argument("--check-every", type=int, default=10, help="steps between the ranks' all-reduce on whether to stop")
    p.add_argument("--pin-cpu", type=int, default=None, help="pin this rank (all its threads) to one CPU")
    p.add_argument("--cuda-lib", help="path of the CUDA library to call (default: the stand-in)")
    p.add_argument("--standin-dir", default=os.environ.get("STRAGGLER_STANDIN_DIR", "/tmp/straggler-standin"),
                   help="where the stand-in libcuda is built")
    p.add_argument("--real-cuda", action="store_true", help="call the system's real libcuda (GPU node) instead of the stand-in")
    p.add_argument("--no-cuda", action="store_true", help="no CUDA calls at all; sleep --gpu-wait-ms instead (debugging)")
    p.add_argument("--gpu-wait-ms", type=float, default=10.0, help="the wait for the GPU per step (real GPU / --no-cuda)")
    p.add_argument("--launches-per-op", type=int, default=3,
                   help="cuLaunchKernel calls per layer forward and per gradient (a GPU job launches several kernels per op)")
    p.add_argument("--timeout-s", type=float, default=60.0, help="gloo timeout: a rank left alone gives up after this")
    return p


def main(argv=None):
    args = build_arg_parser().parse_args(argv)
    if args.pin_cpu is not None:
        # before torch starts its threads, so that every thread of the rank inherits it
        os.sched_setaffinity(0, {args.pin_cpu})

    stop_requested = {"signal": None}

    def on_signal(signum, _frame):
        stop_requested["signal"] = signum
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    import datetime
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    node = os.uname().nodename
    t0 = time.monotonic()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout_s))
    t_init = time.monotonic() - t0

    torch.manual_seed(1234)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, args.hidden), torch.nn.ReLU(),
        torch.nn.Linear(args.hidden, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 10))
    n_params = sum(p.numel() for p in model.parameters())
    if args.no_cuda:
        gpu, gpu_state = None, None
        lib_desc = "none (--no-cuda: sleep)"
    else:
        lib_path = find_cuda_library(args)
        launches = (3 + 6) * args.launches_per_op + 1  # what attach_gpu_calls sets up, + the optimizer's
        gpu = GpuWork(lib_path, launches_per_step=launches, gpu_wait_ms=args.gpu_wait_ms, real=args.real_cuda)
        gpu_state, launches = attach_gpu_calls(model, gpu, per_op=args.launches_per_op)
        launches += 1
        lib_desc = lib_path + ("" if args.real_cuda else " (STAND-IN, no GPU)") + f", {launches} launches/step"
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(rank)
    inputs = torch.randn(args.batch, 256, generator=gen)
    labels = torch.randint(0, 10, (args.batch,), generator=gen)

    os.makedirs(args.log_dir, exist_ok=True)
    log_path = os.path.join(args.log_dir, f"steps-rank{rank}.csv")
    log = open(log_path, "w", buffering=1)
    log.write("rank,node,step,t_end_unix,step_ms\n")
    print(f"[rank {rank}/{world} on {node}] gloo up in {t_init:.2f}s; MLP {n_params} params; cuda: {lib_desc}; "
          f"pinned: {sorted(os.sched_getaffinity(0)) if args.pin_cpu is not None else 'no'}", flush=True)

    stop_flag = torch.zeros(1)
    step = 0
    t_start = time.monotonic()
    t_prev = t_start
    try:
        while True:
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(ddp(inputs), labels)  # a cuLaunchKernel per layer (forward hooks)
            loss.backward()  # cuMemAlloc + a launch per gradient; DDP all-reduces the gradients over gloo here
            opt.step()
            if gpu is not None:
                gpu.launch()  # the optimizer's kernel
                gpu.sync()    # the wait for the GPU (the stand-in sleeps; a real GPU runs the spin kernels)
                gpu.free(gpu_state["dptr"])
                gpu_state["dptr"] = None
            else:
                time.sleep(args.gpu_wait_ms / 1000)
            step += 1
            now = time.monotonic()
            log.write(f"{rank},{node},{step},{time.time():.6f},{(now - t_prev) * 1000:.3f}\n")
            t_prev = now
            if step % args.check_every == 0:
                want_stop = (stop_requested["signal"] is not None
                             or (args.steps and step >= args.steps)
                             or (now - t_start) >= args.seconds
                             or (args.stop_file and os.path.exists(args.stop_file)))
                stop_flag.fill_(1.0 if want_stop else 0.0)
                dist.all_reduce(stop_flag, op=dist.ReduceOp.MAX)
                if stop_flag.item() > 0:
                    break
            if step % 250 == 0:
                print(f"[rank {rank}] step {step} loss {loss.item():.4f}", flush=True)
    finally:
        log.close()
    elapsed = time.monotonic() - t_start
    print(f"[rank {rank}] done: {step} steps in {elapsed:.1f}s ({elapsed / max(step, 1) * 1000:.1f} ms/step) "
          f"at {time.strftime('%H:%M:%S')}", flush=True)
    dist.destroy_process_group()
    print(f"[rank {rank}] left the process group at {time.strftime('%H:%M:%S')}", flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip the interpreter's slow teardown of torch (seconds): the log is closed, nothing is pending
