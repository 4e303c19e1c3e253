"""The operator's application layer: what the `orderflow` commands and the API's `/ops/…`
endpoints do, as one object and the functions behind it (no click, no HTTP, no printing).

- `operations.py`: `Operations`, one method per operator action over the store, a broker
  connection, the hub's names and the settings; the API builds it once at its start, each
  command for its run (`open_operations`); `results.py`: the typed values it answers;
- `actions.py`: resubmit (by id, or in bulk by query, paced, with a dry run) and compensate;
- `views.py`, `explain.py`: the order views (listings, an order in full, its timeline) and what
  they say of an order (where it stands, what happens next, which failures share a cause);
- `invariants.py`, `audit.py`: the audit of DESIGN §8 and the hub's sources it reads;
- `stats.py`, `alerts.py`, `workflows.py`, `cancellation.py`, `initialise.py`: the other reads
  and actions of the operator's commands.
"""
