"""The benchmark (`orderflow bench`): how fast orders go from publish to Processed, end to end.

It starts a whole topology with `orderflow up` in a task hub of its own (or, with `--attach`,
uses the one the settings name; `topology.py`), publishes generated orders at a steady rate or
as fast as admission control allows (`load.py`), waits until every one is terminal, and reports
throughput, latency percentiles (publish to Processed, and per step), CPU seconds per order and
peak memory of each process kind (read from /proc, so the processes must run on this machine:
`procfs.py`), store transactions per order (`database.py`) and supervisor recoveries
(`report.py`; the run: `run.py`). `recovery.py` measures instead how long a step orphaned by a
scheduler killed with SIGKILL waits before another attempt completes it; `soak.py` is a long
run with retention purging as it goes.
"""
