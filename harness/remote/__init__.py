"""The stand-in of the remote services (inventory, payment, shipping): an HTTP service with a
durable ledger, accounts and fault knobs, for tests, the simulation, the nemesis and compose. The
client the agents call it with, and what both sides share, are the runtime's: shared/remote."""
