"""Payment tokens the remote payment service treats specially, as payment providers' test cards."""

from __future__ import annotations

DECLINED_TEST_TOKEN = "tok_declined"
"""A test payment token whose card is always declined (as payment providers' test cards are):
the shop's checkout offers it, to see a declined payment compensated."""
