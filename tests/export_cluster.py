"""The cluster both export tests read (tests/test_analysis_export.py: Chrome JSON,
tests/test_export_pftrace.py: Perfetto's format): four synthetic nodes, gpu-node-03's clock SHIFT_NS
ahead, every call a row, and on gpu-node-01's main thread a call nested in another and one that
overlaps it without nesting (seqs 90_000_001..3), merged with the known offsets."""
import shutil
import sqlite3

from straggler_lab import synth
from straggler.analysis.merge import merge

SHIFT_NS = 250_000_000        # gpu-node-03's realtime clock is 250 ms ahead of the reference


def build(base):
    spec = synth.SynthSpec(scenario="io_cpu", events=16_000, offsets_ns={0: 0, 1: -3_000_000, 2: SHIFT_NS, 3: 7_000_000},
                           record_all=True)   # every call a row: the tests pick events by seq
    facts = synth.write_nodes(str(base / "nodes"), spec)
    paths = [f["path"] for f in facts["files"]]
    odd = str(base / "odd.db")
    shutil.copy(paths[0], odd)
    conn = sqlite3.connect(odd)
    t0 = conn.execute("SELECT MIN(ts) FROM events WHERE op = 'cuMemAlloc'").fetchone()[0] + 19_000_000
    conn.executemany("INSERT INTO events (seq, node, rank, source, op, pid, tid, comm, ts, duration) "
                     "VALUES (?, 'gpu-node-01', 0, ?, ?, 4242, 4242, 'pt_main_thread', ?, ?)",
                     [(90_000_001, "cuda", "cudaLaunchKernel", t0, 300_000),
                      (90_000_002, "driver", "cuLaunchKernel", t0 + 50_000, 200_000),          # nested
                      (90_000_003, "cuda", "cudaMemcpyAsync", t0 + 250_000, 200_000)])        # partial overlap
    conn.commit()
    conn.close()
    cluster = str(base / "cluster.db")
    merge([odd] + paths[1:], cluster, offsets=facts["offsets"])
    return dict(base=base, facts=facts, paths=paths, cluster=cluster)
