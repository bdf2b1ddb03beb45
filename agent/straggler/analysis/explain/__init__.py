"""`straggler explain`: name the straggler rank (and node) of a synchronous training job, and why.

  engine.py    the options, each rank's window and time, the verdict, the findings -> Report
  windows.py   each rank's window (its own baseline and the recent part)
  span.py      the span judged (--since/--until on the fleet timeline, cut through each node's own clock)
  model.py     the rules that name the straggler and its causes (pure functions over rows)
  comms.py     NCCL communicators matched across nodes by their set-up, collectives grouped by them
  findings.py  what each finding says, with its numbers, SQL and recommendation
  causes.py    the cause classes, the GPU's kinds of evidence and each class's words and recommendation (a leaf)
  sql.py       the queries (over thread_time, the agent's per-thread summaries; GROUP BY node)
  runners.py   where the SQL runs: one database, the live fleet, an open connection
  report.py    the report as data (rendered by straggler.render.report)

Which rank: the one that waits least for its peers, materially and consistently (model.py).
Why: its components of step time above the other ranks' median, each mapped to a cause class
(cpu-contention, self-contention, host-compute, gpu-slow, cuda-calls, io-self, io-other, more-work,
and unknown for the rest), with the share of its excess each explains, the evidence, the SQL.
Where: the NCCL communicator of the straggler's in which its peers wait for it (comms.py).

This package reads only (store.query.run_query or the fleet client); it never writes a database,
parses arguments or prints.
"""
from .engine import ExplainOptions, explain_connection, explain_db, explain_fleet, top_cause
from .causes import CAUSE_CLASSES
from .report import Finding, Report

__all__ = ["CAUSE_CLASSES", "ExplainOptions", "Finding", "Report", "explain_connection", "explain_db", "explain_fleet",
           "top_cause"]
