"""The operator's application layer: what the `orderflow` commands do, as functions that take
settings or ports and values and return values (no click, no printing).

- `actions.py`: resubmit (by id, or in bulk by query, paced, with a dry run) and compensate;
- `views.py`, `explain.py`: the order views (listings, an order in full, its timeline) and what
  they say of an order (where it stands, what happens next, which failures share a cause);
- `invariants.py`, `audit.py`: the audit of DESIGN §8 and the hub's sources it reads;
- `stats.py`, `alerts.py`, `workflows.py`, `dead_letters.py`, `initialise.py`: the other reads
  and actions of the operator's commands.
"""
