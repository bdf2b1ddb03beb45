#!/usr/bin/env bash
# make setup: everything the project needs on a Debian/Ubuntu node, idempotent.
# A second run changes nothing and takes seconds. Fails with one line and the fix.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
say()  { printf 'setup: %s\n' "$*"; }
die()  { printf 'setup: error: %s\n' "$*" >&2; exit 1; }
warn() { printf 'setup: WARNING: %s\n' "$*" >&2; }

[ "$(id -u)" = 0 ] || die "must run as root (eBPF, namespaces and packages need it): run 'sudo make setup'"
[ -r /etc/debian_version ] || die "only Debian/Ubuntu are automated here; on RHEL/Fedora install bcc python3-bcc kernel-devel by hand"

# --- distribution packages -------------------------------------------------
PKGS=(python3-bpfcc python3-prometheus-client python3-venv python3-dev openssh-server nftables sqlite3 bpftrace iproute2
      gcc make procps util-linux bridge-utils openssl zstd kmod debootstrap systemd-container)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null || die "apt-get update failed: check the package mirror in /etc/apt"
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || die "apt-get install ${missing[*]} failed: run it by hand to see why"
fi

# --- kernel headers for BCC ------------------------------------------------
KREL=$(uname -r)
if [ ! -e "/lib/modules/$KREL/build/include/linux/kconfig.h" ] && [ ! -e "/lib/modules/$KREL/source/include/linux/kconfig.h" ]; then
  if apt-cache show "linux-headers-$KREL" >/dev/null 2>&1; then
    say "installing linux-headers-$KREL"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "linux-headers-$KREL" >/dev/null \
      || die "apt-get install linux-headers-$KREL failed"
  else
    dpkg-query -W -f='${Status}' linux-headers-amd64 2>/dev/null | grep -q 'install ok installed' || {
      say "no linux-headers-$KREL in the distribution: installing generic linux-headers-amd64"
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq linux-headers-amd64 >/dev/null \
        || die "no kernel headers for $KREL and linux-headers-amd64 failed: install headers matching $(uname -r)"
    }
    ARCHDIR=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -1)
    [ -n "$ARCHDIR" ] || die "generic headers not found under /usr/src: install linux-headers-amd64"
    COMMONDIR=${ARCHDIR%-amd64}-common
    [ -d "$COMMONDIR" ] || die "$COMMONDIR missing: reinstall linux-headers-amd64"
    mkdir -p "/lib/modules/$KREL"
    for pair in "build:$ARCHDIR" "source:$COMMONDIR"; do
      name=${pair%%:*}; target=${pair#*:}
      if [ -e "/lib/modules/$KREL/$name" ] && [ ! -L "/lib/modules/$KREL/$name" ]; then
        warn "/lib/modules/$KREL/$name exists and is not ours: left as is"
      else
        ln -sfn "$target" "/lib/modules/$KREL/$name"
      fi
    done
    warn "kernel $KREL has no headers package: BCC uses $(basename "$ARCHDIR") headers (tracepoints, uprobes and helpers only; no kernel struct reads)"
  fi
fi

# --- tracefs ---------------------------------------------------------------
if [ ! -e /sys/kernel/tracing/events ]; then
  mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || die "cannot mount tracefs at /sys/kernel/tracing: the kernel needs CONFIG_TRACING"
fi
[ -e /sys/kernel/btf/vmlinux ] || [ -e /sys/kernel/tracing/events/sched/sched_switch ] || die "no BPF tracing support in this kernel (CONFIG_BPF_EVENTS)"

# --- virtual environment ---------------------------------------------------
SYSPY=/usr/bin/python3
[ -x "$SYSPY" ] || die "$SYSPY not found: install python3"
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import bcc' 2>/dev/null; then
  say "creating .venv from $SYSPY with system site packages"
  rm -rf .venv
  "$SYSPY" -m venv --system-site-packages .venv || die "python3 -m venv failed: install python3-venv"
fi
STAMP=.venv/.straggler-reqs
WANT=$(cat pyproject.toml requirements-dev.txt 2>/dev/null | sha256sum | cut -c1-16)
if [ "$(cat $STAMP 2>/dev/null)" != "$WANT" ] || [ ! -x .venv/bin/straggler ]; then
  say "installing Python packages into .venv"
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  .venv/bin/python -m pip install -q -r requirements-dev.txt || die "pip install -r requirements-dev.txt failed"
  .venv/bin/python -m pip install -q --no-deps --no-build-isolation -e . 2>/dev/null \
    || .venv/bin/python -m pip install -q --no-deps -e . || die "pip install -e . failed"
  echo "$WANT" > $STAMP
fi
# The lab (agent/straggler_lab: the demo, the stand-in libraries, the generators, the test bed) serves
# `make demo`, the tests and bench/ and is no part of the product's distribution: it goes on this
# development venv's path by a .pth file, as an editable install would put it.
LAB_PTH=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/straggler_lab.pth
[ "$(cat "$LAB_PTH" 2>/dev/null)" = "$ROOT/agent" ] || echo "$ROOT/agent" > "$LAB_PTH"
# The demo's real distributed job (torch.distributed, gloo, CPU). Exactly 2.13.0: its CPU
# build lies on this machine's disk; any other version would download a CUDA build.
if [ "${STRAGGLER_SKIP_TORCH:-0}" != 1 ] && ! .venv/bin/python -c 'import torch' 2>/dev/null; then
  say "installing torch==2.13.0 (CPU) for the demo's training job"
  .venv/bin/python -m pip install -q torch==2.13.0 || die "pip install torch==2.13.0 failed (set STRAGGLER_SKIP_TORCH=1 to skip the demo job)"
fi
# NVIDIA's real CUDA 12 runtime and NCCL (wheels from the package registry) for the tests that trace
# real binaries (tests/test_nvidia_binaries.py), in a test-only virtual environment outside the
# repository, kept between runs. Without a registry the tests are skipped, with the reason.
NVIDIA_VENV=${STRAGGLER_NVIDIA_VENV:-$HOME/.cache/straggler/nvidia-venv}
NVIDIA_WHEELS="nvidia-cuda-runtime-cu12==12.9.79 nvidia-nccl-cu12==2.32.3"
if [ "${STRAGGLER_SKIP_NVIDIA:-0}" != 1 ] && [ "$(cat "$NVIDIA_VENV/.straggler-wheels" 2>/dev/null)" != "$NVIDIA_WHEELS" ]; then
  say "installing NVIDIA's CUDA runtime and NCCL wheels (test-only) into $NVIDIA_VENV"
  rm -rf "$NVIDIA_VENV"
  mkdir -p "$(dirname "$NVIDIA_VENV")"
  if "$SYSPY" -m venv "$NVIDIA_VENV" \
      && "$NVIDIA_VENV/bin/python" -m pip install -q --no-deps $NVIDIA_WHEELS >"$NVIDIA_VENV.log" 2>&1; then
    echo "$NVIDIA_WHEELS" > "$NVIDIA_VENV/.straggler-wheels"
  else
    say "warning: could not install $NVIDIA_WHEELS (see $NVIDIA_VENV.log): the tests that trace NVIDIA's real libraries will be skipped"
    rm -rf "$NVIDIA_VENV"
  fi
fi
# The collection users' controller venv is made by the tests themselves, fresh each session, from ansible-core
# alone plus the collection's own `pip install -r requirements.txt` (tests/galaxy_helpers.py).
.venv/bin/python -c 'import bcc, ansible, straggler, straggler_lab' || die ".venv cannot import bcc/ansible/straggler: rm -rf .venv and run make setup again"
say "ok ($(.venv/bin/python -c 'import ansible.release as a, bcc; print("ansible-core", a.__version__, "| bcc", getattr(bcc, "__version__", "?"))'))"
