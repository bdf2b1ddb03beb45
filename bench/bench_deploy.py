"""What a deployment's file transfers cost over real SSH to the four hosts of the test bed, the way
the roles do them now against the way they did before, measured in the same run (interleaved):

  tls    a host's four TLS files (ca.crt, crl.pem, node.crt, node.key 0600)
         now:      one straggler.fleet.tls_files run
         before:   ansible.builtin.copy of three files in a loop, and one more for the key
  bpf    the BPF sources the agent compiles (bpf/*.c, common.h)
         now:      nothing to run: the agent's wheel carries them, the wheel's pip install puts them in place
         before:   ansible.builtin.copy of the bpf/ directory (a stat and a write per file)

Each variant runs `--runs` times on a fresh destination (every file written) and on an unchanged one
(the repeat deployment: nothing to write, but every file compared). Wall time of ansible-playbook
with one task, minus the same playbook with a no-op task (the connection and fork start-up).

Writes bench/results/deploy.json and prints a table. `--quick`: 2 runs. Needs root (test bed).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "agent"))

from straggler import pki, render  # noqa: E402

TESTBED_ID = 88
DEST = "/tmp/straggler-bench-deploy"


def playbooks(work, pki_dir):
    """{variant: playbook path}: one task each, every host writing under DEST/<variant>."""
    ca, crl = pki_dir / "ca.crt", pki_dir / "crl.pem"
    cert, key = pki_dir / "bench-node.crt", pki_dir / "bench-node.key"
    tasks = {
        "noop": """\
            - name: nothing
              ansible.builtin.meta: noop
            """,
        "tls: tls_files": f"""\
            - name: the four files in one module run
              straggler.fleet.tls_files:
                dest: {DEST}/tls-module
                ca: "{{{{ lookup('ansible.builtin.file', '{ca}', rstrip=false) }}}}"
                crl: "{{{{ lookup('ansible.builtin.file', '{crl}', rstrip=false) }}}}"
                cert: "{{{{ lookup('ansible.builtin.file', '{cert}', rstrip=false) }}}}"
                key: "{{{{ lookup('ansible.builtin.file', '{key}', rstrip=false) }}}}"
                owner: root
                group: root
              no_log: true
            """,
        "tls: four copies": f"""\
            - name: three files in a loop
              ansible.builtin.copy:
                src: "{{{{ item.src }}}}"
                dest: "{DEST}/tls-copy/{{{{ item.dest }}}}"
                owner: root
                group: root
                mode: "0644"
              loop:
                - {{src: "{ca}", dest: ca.crt}}
                - {{src: "{crl}", dest: crl.pem}}
                - {{src: "{cert}", dest: node.crt}}
            - name: the key
              ansible.builtin.copy:
                src: "{key}"
                dest: "{DEST}/tls-copy/node.key"
                owner: root
                group: root
                mode: "0600"
              no_log: true
            """,
        "bpf: directory copy": f"""\
            - name: the BPF sources, file by file
              ansible.builtin.copy:
                src: "{REPO / 'bpf'}/"
                dest: "{DEST}/bpf/"
                owner: root
                group: root
                mode: "0644"
                directory_mode: "0755"
            """,
    }
    out = {}
    for name, body in tasks.items():
        path = work / (name.replace(": ", "-").replace(" ", "-") + ".yml")
        path.write_text("- name: bench\n  hosts: all\n  gather_facts: false\n  tasks:\n"
                        + textwrap.indent(textwrap.dedent(body), "    "))
        out[name] = path
    return out


def run(bed, path):
    env = bed.ansible_env()
    env["ANSIBLE_COLLECTIONS_PATH"] = str(REPO / "collections")
    started = time.monotonic()
    proc = subprocess.run([str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", str(bed.inventory), str(path)],
                          env=env, capture_output=True, text=True, timeout=600)
    elapsed = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"bench_deploy: {path.name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
    return elapsed


def clean(bed):
    for name in bed.hosts:
        subprocess.run(bed.ssh_argv(name, "rm", "-rf", DEST, "&&", "mkdir", "-p", f"{DEST}/tls-module",
                                    f"{DEST}/tls-copy"), check=True, timeout=60, capture_output=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_deploy: needs root (test bed): skipped", file=sys.stderr)
        return 0
    runs = 2 if args.quick else args.runs
    from straggler_lab import testbed
    lock = testbed.TestbedLock(TESTBED_ID)
    if not lock.try_acquire():
        print(f"bench_deploy: test bed {TESTBED_ID} is in use (pid {lock.holder()})", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="straggler-bench-deploy-"))
    samples = {}          # (variant, state) -> [seconds]
    bed = None
    started = time.monotonic()
    try:
        pki_dir = work / "pki"
        pki.init_ca(str(pki_dir))
        pki.issue(str(pki_dir), "bench-node", ["10.0.0.1"], kind="server")
        books = playbooks(work, pki_dir)
        bed = testbed.up(hosts=4, dead=0, testbed_id=TESTBED_ID, _lock_held=True)
        run(bed, books["noop"])                                  # the SSH master connections, once
        for _ in range(runs):
            for name, path in books.items():                     # interleaved: the machine's noise hits all alike
                if name == "noop":
                    samples.setdefault(("noop", "-"), []).append(run(bed, path))
                    continue
                clean(bed)
                samples.setdefault((name, "fresh"), []).append(run(bed, path))
                samples.setdefault((name, "unchanged"), []).append(run(bed, path))
    finally:
        if bed is not None:
            testbed.down(bed.id, bed.state_dir, _lock_held=True)
        lock.release()
        shutil.rmtree(work, ignore_errors=True)
    base = statistics.median(samples[("noop", "-")])
    rows = []
    for (name, state), values in sorted(samples.items()):
        if name == "noop":
            continue
        med = statistics.median(values)
        rows.append(dict(variant=name, state=state, runs=len(values), median_s=round(med, 2),
                         task_s=round(max(0.0, med - base), 2), all_s=[round(v, 2) for v in values]))
    results = dict(quick=args.quick, runs=runs, hosts=4, noop_playbook_s=round(base, 2),
                   seconds=round(time.monotonic() - started, 1), machine=dict(cpus=os.cpu_count()), rows=rows,
                   note="bpf now: no task (the wheel carries the sources); tls now: one tls_files run")
    res_dir = REPO / "bench" / "results"
    res_dir.mkdir(parents=True, exist_ok=True)
    (res_dir / "deploy.json").write_text(json.dumps(results, indent=2) + "\n")
    print(render.table_text(["variant", "destination", "runs", "playbook (median)", "the task(s) alone"],
                            [(r["variant"], r["state"], r["runs"], f"{r['median_s']:.2f} s", f"{r['task_s']:.2f} s")
                             for r in rows],
                            title=f"file transfers to 4 hosts over SSH (a no-op playbook: {base:.2f} s)"))
    print(f"results: {res_dir / 'deploy.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
