"""The lab: what serves the product's development and never ships in it.

  demo/     the field case `make demo` runs: a real synchronous training job on the test bed,
            its faults, and the orchestration (straggler_lab.demo.run)
  standin/  the STAND-IN CUDA/NCCL libraries (C), for machines without a GPU
  synth.py  synthetic node and cluster databases (tests and benchmarks)
  testbed.py  real SSH hosts out of network namespaces (`python -m straggler_lab.testbed up`)

The product (the `straggler` package) never imports this package; a node's wheel does not carry it.
"""
