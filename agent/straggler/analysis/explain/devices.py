"""Whose GPU: what each GPU said about itself over a time (the agent's NVML samples and the driver's Xid
errors), per rank. With collectives that only enqueue (NCCL on GPUs) every rank waits in synchronize
alike when one GPU is slow: the host's call timings cannot tell whose it is, the device can.

The kinds of evidence, each a cause class of its own:
  gpu-errors     Xid errors, new uncorrected ECC errors, a failed or pending row remap, a GPU that stopped
                 answering NVML ('GPU is lost')
  gpu-link       its PCIe link below the generation or width it can do while it works, NVLink errors growing
  gpu-throttled  clock-event (throttle) reasons that slow it — power cap, thermal, hardware slowdown — in
                 most of its samples, or its SM clock well below the other GPUs'
A GPU is named only when its evidence stands out: the devices must not all look alike (a fleet-wide
power cap names nobody). Only a GPU at work is evidence: one no rank of the job uses, or one idle in
most of its samples (a node's spare GPU idles at its lowest clock), is neither throttled nor the healthy
measure the others' clocks are compared with; its errors, too, are not the job's. Pure rules over rows,
with the SQL beside them; nothing here writes.
"""
import statistics
from dataclasses import dataclass, field

from ...devices.nvml import CLOCK_EVENTS, SLOWDOWN_EVENTS
from . import episodes as ep, evidence as evidence_rule
from .causes import DEVICE_KINDS as KINDS
from .sql import values_cte

THROTTLED_SHARE = 0.5          # a GPU is throttled when slowing reasons hold in this share of its samples ...
CLOCK_DROP = 0.85              # ... or its SM clock (share of its maximum) is below this x the other GPUs' median
BUSY_UTIL_PCT = 10             # a link is judged while the GPU works (an idle link may drop its generation)
ERROR_LEAD_BINS = 2            # an error this many bins before a job-slow run begins is its start (devices.within)
WORKING_SHARE = 0.5            # a GPU at work: busy (or its utilization not reported) in this share of its samples
LINK_SHARE = 0.5
MAX_ALIKE = 0.5                # more than this share of the GPUs with the same kind: they all look alike
SAMPLE_COLUMNS = """COUNT(*) AS samples,
       SUM((s.clock_events & {slow}) != 0 AND {working}) AS throttled,
       GROUP_CONCAT(DISTINCT NULLIF(s.clock_event_names, '')) AS reasons,
       SUM({working}) AS working,
       AVG(CASE WHEN {working} THEN s.sm_clock_mhz * 1.0 / NULLIF(s.sm_clock_max_mhz, 0) END) AS clock_ratio,
       AVG(CASE WHEN {working} THEN s.sm_clock_mhz END) AS sm_clock_mhz, MAX(s.sm_clock_max_mhz) AS sm_clock_max_mhz,
       MAX(s.temperature_c) AS temperature_c, AVG(s.power_mw * 1.0 / NULLIF(s.power_limit_mw, 0)) AS power_ratio,
       SUM(s.util_gpu_pct >= {busy}) AS busy,
       SUM(s.util_gpu_pct >= {busy} AND (s.pcie_gen < s.pcie_gen_max OR s.pcie_width < s.pcie_width_max)) AS link_low,
       MIN(s.pcie_gen) AS pcie_gen, MAX(s.pcie_gen_max) AS pcie_gen_max,
       MIN(s.pcie_width) AS pcie_width, MAX(s.pcie_width_max) AS pcie_width_max,
       MAX(s.nvlink_replay_errors) - MIN(s.nvlink_replay_errors) + MAX(s.nvlink_recovery_errors)
         - MIN(s.nvlink_recovery_errors) + MAX(s.nvlink_crc_errors) - MIN(s.nvlink_crc_errors) AS nvlink_errors,
       MAX(s.ecc_uncorrected) - MIN(s.ecc_uncorrected) AS ecc_uncorrected_new,
       MAX(s.remap_pending) AS remap_pending, MAX(s.remap_failure) AS remap_failure,
       SUM(s.read_error IS NOT NULL) AS read_errors, MAX(s.read_error) AS read_error"""


# a sample of a GPU at work: busy, or its utilization not reported (then it cannot be told idle)
WORKING = f"(s.util_gpu_pct IS NULL OR s.util_gpu_pct >= {BUSY_UTIL_PCT})"


@dataclass
class GpuEvidence:
    node: str
    gpu: int
    kind: str = None               # one of KINDS, the gravest it shows; None: nothing
    detail: str = ""               # what it said, in words
    numbers: dict = field(default_factory=dict)

    @property
    def key(self):
        return (self.node, self.gpu)


def _ranges_cte(ranges):
    return values_cte("tw", ("node", "lo", "hi"), sorted(ranges))


def samples_sql(ranges):
    """Each GPU's samples over per-node time ranges [(node, lo, hi)] on its clock, summed."""
    return f"""
WITH {_ranges_cte(ranges)}
SELECT s.node, s.gpu, {SAMPLE_COLUMNS.format(slow=SLOWDOWN_EVENTS, busy=BUSY_UTIL_PCT, working=WORKING)}
FROM tw JOIN gpu_samples s ON s.node = tw.node AND s.ts >= tw.lo AND s.ts < tw.hi
GROUP BY s.node, s.gpu
ORDER BY s.node, s.gpu"""


def _origins(user_xids):
    return "e.origin IN ('kernel', 'user')" if user_xids else "e.origin = 'kernel'"


def errors_sql(ranges, user_xids=False):
    """The driver's Xid errors over the same ranges: the kernel's own lines (and those a program wrote,
    with user_xids)."""
    return f"""
WITH {_ranges_cte(ranges)}
SELECT e.node, e.gpu, e.pci_bus_id, e.xid, MIN(e.meaning) AS meaning, COUNT(*) AS count, MIN(e.ts) AS first_ts
FROM tw JOIN gpu_errors e ON e.node = tw.node AND e.ts >= tw.lo AND e.ts < tw.hi
WHERE {_origins(user_xids)}
GROUP BY e.node, e.gpu, e.pci_bus_id, e.xid
ORDER BY e.node, e.gpu, e.xid"""


GPU_OF_PROCESS = """
SELECT node, pid, gpu, MIN(rank) AS rank, MIN(how) AS how
FROM gpu_processes
GROUP BY node, pid, gpu
ORDER BY node, pid, gpu"""


DEVICE_TABLES = """
SELECT COUNT(*) AS tables FROM pragma_table_list WHERE name IN ('gpu_samples', 'gpu_errors', 'gpu_processes')"""


def has_device_tables(runner):
    """Whether every store has the device tables (schema 3; an older agent's has none: then device
    evidence is left out, never an error). A store without a GPU has them, empty."""
    rows = runner.rows(DEVICE_TABLES)
    return bool(rows) and all(int(r["tables"] or 0) == 3 for r in rows)


def gpus_of(process_rows, span_rows):
    """{(node, pid): [gpu, ...]} — what NVML or the device files say each process uses; a rank the agent
    saw no GPU of uses the GPU of its local rank, as torchrun sets them up, when that GPU exists."""
    out = {}
    for r in process_rows:
        out.setdefault((r["node"], int(r["pid"])), [])
        if r["gpu"] not in out[(r["node"], int(r["pid"]))]:
            out[(r["node"], int(r["pid"]))].append(int(r["gpu"]))
    for r in span_rows:
        key = (r["node"], int(r["pid"]))
        if key not in out and r.get("local_rank") is not None:
            out[key] = [int(r["local_rank"])]
    return out


def _reasons(text):
    names = {n for part in (text or "").split(",") for n in part.split(",") if n}
    slow = {name for bit, name in CLOCK_EVENTS if bit & SLOWDOWN_EVENTS}
    return sorted(names & slow)


def at_work(row):
    """Whether a GPU's summed samples (samples_sql) are those of a GPU at work (WORKING_SHARE of them)."""
    samples = int(row["samples"] or 0)
    return samples > 0 and int(row["working"] or 0) >= WORKING_SHARE * samples


def judge(sample_rows, error_rows, job=None):
    """{(node, gpu): GpuEvidence} for every GPU of the job (`job`: {(node, gpu)} of its ranks' GPUs; None or
    empty: every GPU) that was at work or had errors: its gravest kind (or None). An idle GPU is left out:
    neither throttled (it idles at its lowest clock) nor the measure of the others' clocks."""
    xids = {}
    for r in error_rows:
        if r["gpu"] is None:
            continue
        xids.setdefault((r["node"], int(r["gpu"])), []).append(r)
    kept = []
    for r in sample_rows:
        key = (r["node"], int(r["gpu"]))
        if job and key not in job:
            continue
        errors = key in xids or (r["ecc_uncorrected_new"] or 0) > 0 or r["remap_failure"] or r["remap_pending"]
        if at_work(r) or errors or int(r["read_errors"] or 0):
            kept.append(r)
    sample_rows = kept
    out = {}
    for r in sample_rows:
        out[(r["node"], int(r["gpu"]))] = GpuEvidence(r["node"], int(r["gpu"]))
    ratios = {(r["node"], int(r["gpu"])): r["clock_ratio"] for r in sample_rows
              if r["clock_ratio"] is not None and at_work(r)}
    for key, ev in out.items():
        r = next(x for x in sample_rows if (x["node"], int(x["gpu"])) == key)
        samples = int(r["samples"] or 0)
        found = []
        errs = xids.get(key, [])
        lost = int(r["read_errors"] or 0) and "lost" in (r["read_error"] or "").lower()
        if errs or (r["ecc_uncorrected_new"] or 0) > 0 or r["remap_failure"] or r["remap_pending"] or lost:
            words = [f"Xid {x['xid']} ×{x['count']} ({x['meaning'] or 'see the driver docs'})" for x in errs]
            if (r["ecc_uncorrected_new"] or 0) > 0:
                words.append(f"{r['ecc_uncorrected_new']} new uncorrected ECC errors")
            if r["remap_failure"]:
                words.append("a row remap failed")
            elif r["remap_pending"]:
                words.append("a row remap waits for a reset")
            if lost:
                words.append(f"NVML: {r['read_error']}")
            found.append(("gpu-errors", "; ".join(words)))
            ev.numbers.update(xids=sorted({int(x["xid"]) for x in errs}),
                              ecc_uncorrected_new=int(r["ecc_uncorrected_new"] or 0))
        busy = int(r["busy"] or 0)
        if (busy and (r["link_low"] or 0) >= LINK_SHARE * busy) or (r["nvlink_errors"] or 0) > 0:
            words = []
            if busy and (r["link_low"] or 0) >= LINK_SHARE * busy:
                words.append(f"PCIe at gen {r['pcie_gen']} x{r['pcie_width']} of gen {r['pcie_gen_max']} "
                             f"x{r['pcie_width_max']} in {r['link_low'] / busy:.0%} of its busy samples")
            if (r["nvlink_errors"] or 0) > 0:
                words.append(f"{r['nvlink_errors']} NVLink errors (replays, recoveries, CRC)")
            found.append(("gpu-link", "; ".join(words)))
            ev.numbers.update(pcie_gen=r["pcie_gen"], pcie_width=r["pcie_width"], nvlink_errors=r["nvlink_errors"])
        others = [v for k, v in ratios.items() if k != key]
        ratio = ratios.get(key)
        share = (r["throttled"] or 0) / samples if samples else 0.0
        dropped = key in ratios and others and ratio < CLOCK_DROP * statistics.median(others)
        if share >= THROTTLED_SHARE or dropped:
            reasons = _reasons(r["reasons"])
            words = [f"clock-event reasons {', '.join(reasons) or 'none'} in {share:.0%} of {samples} samples"]
            if ratio is not None:
                words.append(f"SM clock {r['sm_clock_mhz']:.0f} of {r['sm_clock_max_mhz']} MHz ({ratio:.0%}"
                             + (f" vs {statistics.median(others):.0%} on the other GPUs)" if others else ")"))
            if r["temperature_c"] is not None:
                words.append(f"up to {r['temperature_c']} °C")
            found.append(("gpu-throttled", "; ".join(words)))
            ev.numbers.update(throttled_share=round(share, 3), reasons=reasons,
                              clock_ratio=None if ratio is None else round(ratio, 3),
                              others_clock_ratio=round(statistics.median(others), 3) if others else None)
        ev.numbers["samples"] = samples
        if found:
            ev.kind = min(found, key=lambda kd: KINDS.index(kd[0]))[0]
            ev.detail = "; ".join(words for _, words in sorted(found, key=lambda kd: KINDS.index(kd[0])))
    return out


def standing_out(evidence):
    """The GPUs whose evidence stands out: its kind is on at most MAX_ALIKE of all the GPUs seen (a
    fleet-wide condition — every GPU capped, or every link at gen 3 — names nobody)."""
    return evidence_rule.standing_out(evidence, MAX_ALIKE, lambda ev: (KINDS.index(ev.kind), ev.node, ev.gpu))


def alike(evidence):
    """The kinds every (more than MAX_ALIKE of the) GPU(s) show alike: {kind: [GpuEvidence]}."""
    return evidence_rule.alike(evidence, MAX_ALIKE)


PROCESS_RANKS = """
SELECT node, pid, MIN(rank) AS rank, MIN(local_rank) AS local_rank
FROM processes
WHERE rank IS NOT NULL
GROUP BY node, pid
ORDER BY node, pid"""


def over(runner, series, lo_bin, hi_bin, user_xids=False, job=None):
    """Every GPU's evidence over bins [lo_bin, hi_bin) of the series (each node's clock), of the job's GPUs
    (`job`, as judge takes it) -> ({(node, gpu): GpuEvidence}, {"gpu_samples": sql, "gpu_errors": sql})."""
    ranges = [(node, series.to_node(node, series.bin_start(lo_bin)), series.to_node(node, series.bin_start(hi_bin)))
              for node in sorted(series.clocks)]
    texts = {"gpu_samples": samples_sql(ranges), "gpu_errors": errors_sql(ranges, user_xids)}
    return judge(runner.rows(texts["gpu_samples"]), runner.rows(texts["gpu_errors"]), job), texts


def over_run(runner, series, run, user_xids=False, job=None):
    """over() for a job-slow run (episodes.Run): from ERROR_LEAD_BINS before it begins (an Xid logged as
    the fault began, a bin or two before the job's step rate fell, is read with it: the rule within()
    keeps for a GPU's own runs of errors) to its end."""
    return over(runner, series, max(0, run.start - ERROR_LEAD_BINS), run.end, user_xids, job)


def _until(series, alias):
    """The span's end (--until), where one was given: a GPU's word after it is no evidence of the span."""
    return "" if series.until_ns is None else f" AND {alias}.ts + clk.off < {int(series.until_ns)}"


def device_series_sql(series):
    """Every GPU's samples and errors per bin of the series (fleet time, like the ranks' series)."""
    rows = sorted((node, c.offset_ns) for node, c in series.clocks.items())
    at = f"(s.ts + clk.off - {int(series.t0_ns)}) / {int(series.bin_ns)}"
    return f"""
WITH {values_cte("clk", ("node", "off"), rows)}
SELECT s.node, s.gpu, {at} AS bin, COUNT(*) AS samples,
       SUM((s.clock_events & {SLOWDOWN_EVENTS}) != 0 AND {WORKING}) AS throttled,
       SUM(s.util_gpu_pct >= {BUSY_UTIL_PCT}) AS busy,
       SUM(s.util_gpu_pct >= {BUSY_UTIL_PCT} AND (s.pcie_gen < s.pcie_gen_max OR s.pcie_width < s.pcie_width_max))
         AS link_low,
       SUM(s.read_error IS NOT NULL AND s.read_error LIKE '%lost%') AS lost
FROM gpu_samples s JOIN clk ON clk.node = s.node
WHERE s.ts + clk.off >= {int(series.t0_ns)}{_until(series, "s")}
GROUP BY s.node, s.gpu, bin
ORDER BY s.node, s.gpu, bin"""


def device_errors_sql(series, user_xids=False):
    rows = sorted((node, c.offset_ns) for node, c in series.clocks.items())
    return f"""
WITH {values_cte("clk", ("node", "off"), rows)}
SELECT e.node, e.gpu, (e.ts + clk.off - {int(series.t0_ns)}) / {int(series.bin_ns)} AS bin, COUNT(*) AS errors
FROM gpu_errors e JOIN clk ON clk.node = e.node
WHERE {_origins(user_xids)} AND e.gpu IS NOT NULL AND e.ts + clk.off >= {int(series.t0_ns)}{_until(series, "e")}
GROUP BY e.node, e.gpu, bin
ORDER BY e.node, e.gpu, bin"""


def device_runs(sample_rows, error_rows, min_bins=2, job=None):
    """Where each of the job's GPUs (`job`, as judge takes it) said something, bin by bin: {(node, gpu):
    [(start, end, kind)]} — runs of bins in which it was throttled at work or its link low for most of its
    samples (min_bins or more, one-bin gaps bridged), or it had an error (a run of its own, however short)."""
    flags = {}
    if job:
        sample_rows = [r for r in sample_rows if (r["node"], int(r["gpu"])) in job]
        error_rows = [r for r in error_rows if (r["node"], int(r["gpu"])) in job]
    for r in sample_rows:
        n = int(r["samples"] or 0)
        kind = None
        if r["lost"]:
            kind = "gpu-errors"
        elif r["busy"] and (r["link_low"] or 0) >= LINK_SHARE * r["busy"]:
            kind = "gpu-link"
        elif n and (r["throttled"] or 0) >= THROTTLED_SHARE * n:
            kind = "gpu-throttled"
        if kind:
            flags.setdefault((r["node"], int(r["gpu"])), {})[int(r["bin"])] = kind
    for r in error_rows:
        flags.setdefault((r["node"], int(r["gpu"])), {})[int(r["bin"])] = "gpu-errors"
    out = {}
    for key, bins in flags.items():
        runs = []
        for b in sorted(bins):
            kind = bins[b]
            if runs and runs[-1][2] == kind and b <= runs[-1][1] + 1:
                runs[-1] = (runs[-1][0], b + 1, kind)
            else:
                runs.append((b, b + 1, kind))
        out[key] = [r for r in runs if r[2] == "gpu-errors" or r[1] - r[0] >= min_bins]
    return out


def alike_runs(per_gpu, slow_run, total):
    """The kinds more than MAX_ALIKE of all `total` GPUs showed during a job-slow run, each by its own runs
    of evidence (device_runs): {kind: [(node, gpu)]}."""
    by_kind = {}
    for key, runs in per_gpu.items():
        for kind in {k for s, e, k in runs if s < slow_run.end and e > slow_run.start}:
            by_kind.setdefault(kind, []).append(key)
    return {k: sorted(v) for k, v in by_kind.items() if total and len(v) / total > MAX_ALIKE}


def within(gpu_runs, slow_run):
    """The part of a job-slow run (episodes.Run) in which the GPU itself said something: from its first
    run of evidence inside it (an error: from the error on) to the slow run's end, or to where that
    stretch of evidence ends when it stopped before — an episodes.Run, or None when it said nothing
    there. A stretch is the GPU's runs of evidence at most episodes.MERGE_BINS apart (as a node's ranks are
    joined): a job-slow run can bridge two slowdowns a few seconds apart, and the GPU's word in the first
    says nothing of the second (every GPU throttled alike there, say). An error logged up to
    ERROR_LEAD_BINS before the run begins is its start: the driver logs an Xid as the fault begins, the
    job's step rate falls over the next bin."""
    inside = sorted((s, e, k) for s, e, k in gpu_runs
                    if s < slow_run.end and e + (ERROR_LEAD_BINS if k == "gpu-errors" else 0) > slow_run.start)
    if not inside:
        return None
    first, last, kinds = inside[0][0], inside[0][1], {inside[0][2]}
    for s, e, k in inside[1:]:
        if s - last > ep.MERGE_BINS:
            break
        last, kinds = max(last, e), kinds | {k}
    start = max(slow_run.start, first)
    end = slow_run.end if "gpu-errors" in kinds else min(slow_run.end, last)
    if end <= start:
        return None
    return ep.Run(start=start, end=end, bins=end - start, mean_gap=slow_run.mean_gap, on_runs=[(start, end)])
