#!/usr/bin/env bash
# make demo (after make setup): the field case end to end on this machine's test bed.
# Four hosts gpu-node-01..04, agents deployed with Ansible, a real 4-rank training job, a
# checkpoint writer on gpu-node-01, then fleet_query / explain / collect into demo-output/.
# Everything it starts is stopped at the end (also on Ctrl-C). Options go to the Python
# orchestration: DEMO_ARGS="--warmup-s 30 --straggle-s 40" make demo; see --help.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "demo: must run as root (network namespaces, eBPF): run 'sudo make demo'" >&2; exit 1; }
[ -x .venv/bin/python ] || { echo "demo: .venv missing: run 'make setup' first" >&2; exit 1; }
# shellcheck disable=SC2086
exec .venv/bin/python -m straggler_lab.demo.run ${DEMO_ARGS:-} "$@"
