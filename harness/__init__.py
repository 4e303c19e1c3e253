"""The test harnesses: what exercises the runtime (services/, shared/) from outside it, never a
part of it. The nemesis (faults injected into real processes on private servers), the
deterministic simulation (the real processes on memory adapters under virtual time), the bench
(load, recovery and soak runs) and the stand-in of the remote service (harness/remote: its
ledger, accounts and fault knobs; the client the agents call it with is the runtime's own,
shared/remote). The `orderflow` commands that run them import them when they run; no runtime
module imports them (tests/unit/test_layering.py)."""
