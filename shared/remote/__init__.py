"""The runtime's side of its protocol with the remote service: the client the agents call it
with (and the audit reads its ledger with), the fencing-token signature the schedulers issue, the
operator token the audit presents, and the test payment tokens the shop offers. The stand-in of
the remote service (harness/remote) imports these; the runtime never imports the stand-in."""
