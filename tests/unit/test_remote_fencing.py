"""The remote's accounts and signed fencing tokens (issue 33, item 11), at the unit level: a search
(hypothesis) over forged tokens and signatures, which the remote must never accept, whatever the
attempt they name, nor let them move an order's fence; the table of accounts; and the keys
`orderflow up` gives its processes."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import SecretStr

from harness.remote.accounts import FORGED, Account, Accounts
from harness.remote.app import Faults, RemoteCall, RemoteService
from harness.remote.ledger import Ledger
from services.cli.up import account_env
from shared.config import Settings
from shared.domain.identity import parse_instance_id
from shared.errors import ConfigurationError
from shared.remote.fencing import fence_signature, signature_checks

HUB = "shop_hub"
KEY, FENCE_KEY = "k" * 32, "f" * 32
ACCOUNTS = Accounts(
    {HUB: Account(KEY.encode(), FENCE_KEY.encode()), "other": Account(b"o" * 32, b"p" * 32)}
)


def signed(token: str, *, key: str = FENCE_KEY, account: str = HUB) -> str:
    return fence_signature(key.encode(), account, token)


def service() -> RemoteService:
    return RemoteService(
        Ledger(":memory:"), Faults(), random.Random(0), admin_token=None, accounts=ACCOUNTS
    )


def ask(
    remote: RemoteService,
    operation: str,
    token: str,
    signature: str | None,
    order_id: str = "o-1",
) -> int:
    body = RemoteCall(
        order_id=order_id,
        idempotency_key=f"{order_id}:{operation}:{token}",
        fencing_token=token,
        fencing_signature=signature,
    )
    _, status = asyncio.run(remote.answer(HUB, operation, body))
    return status


tokens = st.one_of(
    st.integers(min_value=0, max_value=10**30).map(lambda n: f"o-1:{n}"),
    st.text(min_size=1, max_size=100),
)
"""A fencing token an attacker sends: the order's with any attempt, or anything at all."""


def forgeries(token: str) -> st.SearchStrategy[str | None]:
    """Signatures an attacker can make for `token`: none, noise, hex of the right shape, the
    right scheme under the wrong key or account, another token's real signature, the real one
    with a digit changed or in capitals."""
    real = signed(token)
    near = st.integers(0, 63).map(
        lambda i: real[:i] + ("0" if real[i] != "0" else "1") + real[i + 1 :]
    )
    return st.one_of(
        st.none(),
        st.text(max_size=200),
        st.text("0123456789abcdef", min_size=64, max_size=64),
        st.just(signed(token, key=KEY)),  # the account's key, which the agents hold
        st.just(signed(token, key="p" * 32, account="other")),  # another account's
        st.just(signed(token, account="other")),
        tokens.filter(lambda t: t != token).map(signed),
        near,
        st.just(real.upper()),
    ).filter(lambda s: s != real)


OPERATIONS = st.sampled_from(["inventory.reserve", "payment.charge", "shipping.cancel"])


@given(st.data(), tokens, OPERATIONS)
def test_a_token_whose_signature_does_not_check_is_never_accepted(
    data: st.DataObject, token: str, operation: str
) -> None:
    forged = data.draw(forgeries(token), label="signature")
    remote = service()
    try:
        assert ask(remote, operation, token, forged) == 403
        # Nothing counted, nothing applied, no fence moved: the order's own attempt 1 passes.
        assert remote.ledger.attempts_of(None, "o-1") == []
        assert remote.ledger.effects_of(None, "o-1") == []
        assert ask(remote, "payment.charge", "o-1:1", signed("o-1:1")) == 200
    finally:
        remote.ledger.close()


@given(tokens)
def test_the_schedulers_own_signature_checks(token: str) -> None:
    assert signature_checks(FENCE_KEY.encode(), HUB, token, signed(token))
    try:
        order_id = parse_instance_id(token)[0]
    except ValueError:  # no attempt of any order: refused, signed or not
        assert not ACCOUNTS.fence_checks(HUB, token, token, signed(token))
        return
    assert ACCOUNTS.fence_checks(HUB, order_id, token, signed(token))
    assert not ACCOUNTS.fence_checks("other", order_id, token, signed(token))
    assert not ACCOUNTS.fence_checks("nobody", order_id, token, signed(token))


order_ids = st.from_regex(r"[a-z0-9][a-z0-9./:-]{0,20}", fullmatch=True)


@given(order_ids, order_ids, st.integers(min_value=2, max_value=10**9), OPERATIONS)
def test_another_orders_signed_token_moves_no_fence(
    holder: str, victim: str, attempt: int, operation: str
) -> None:
    """A real token, signed by the scheduler for one order's attempt (which every agent sees),
    sent with another order's id: refused, and the other order's own attempt 1 still passes
    (found by review: the remote read the attempt off the token and fenced the body's order)."""
    if holder == victim:
        return
    token = f"{holder}:{attempt}"
    remote = service()
    try:
        assert ask(remote, operation, token, signed(token), order_id=victim) == 403
        assert remote.ledger.attempts_of(None, victim) == []
        assert ask(remote, "payment.charge", f"{victim}:1", signed(f"{victim}:1"), victim) == 200
    finally:
        remote.ledger.close()


def test_a_forged_answer_says_what_was_refused() -> None:
    remote = service()
    try:
        body = RemoteCall(order_id="o-1", idempotency_key="k", fencing_token="o-1:999999")
        payload, status = asyncio.run(remote.answer(HUB, "payment.charge", body))
    finally:
        remote.ledger.close()
    assert status == 403 and payload["outcome"] == FORGED
    assert "not signed" in payload["error"] and "ORDERFLOW_REMOTE_FENCE_KEY" in payload["error"]


def test_the_key_authenticates_its_account_only() -> None:
    assert ACCOUNTS.authenticates(HUB, f"Bearer {KEY}")
    assert not ACCOUNTS.authenticates(HUB, f"bearer {KEY}")
    assert not ACCOUNTS.authenticates(HUB, KEY)
    assert not ACCOUNTS.authenticates(HUB, f"Bearer {FENCE_KEY}")
    assert not ACCOUNTS.authenticates(HUB, f"Bearer {'o' * 32}")  # another account's key
    assert not ACCOUNTS.authenticates("nobody", f"Bearer {KEY}")
    assert not ACCOUNTS.authenticates(HUB, None)
    assert not Accounts().authenticates("", "Bearer ")
    assert not ACCOUNTS.authenticates(HUB, "Bearer \udcff")  # what a header may hold


def test_the_table_of_accounts_is_read_and_checked() -> None:
    table = Accounts.parse(f"{HUB}:{KEY}:{FENCE_KEY}, :{'a' * 16}:{'b' * 16}")
    assert len(table) == 2 and table.authenticates("", f"Bearer {'a' * 16}")
    bad = {
        f"{HUB}:{KEY}": "not <account>:<key>:<fence key>",
        f"Shop:{KEY}:{FENCE_KEY}": "a task hub's name",
        f"{HUB}:short:{FENCE_KEY}": "each key must be",
        f"{HUB}:{KEY}:{KEY}": "must differ",
        f"{HUB}:{KEY}:{FENCE_KEY},{HUB}:{'x' * 16}:{'y' * 16}": "named twice",
    }
    for text, why in bad.items():
        with pytest.raises(ConfigurationError, match=why) as refused:
            Accounts.parse(text)
        assert KEY not in str(refused.value)


def test_up_makes_keys_for_its_remote_and_keeps_those_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ORDERFLOW_REMOTE_ACCOUNTS", raising=False)
    settings = Settings(_env_prefix="ORDERFLOW_TESTS_READ_NO_ENVIRONMENT_", hub=HUB)
    made = account_env(settings, True)
    key, fence_key = made["ORDERFLOW_REMOTE_ACCOUNT_KEY"], made["ORDERFLOW_REMOTE_FENCE_KEY"]
    assert key != fence_key and len(key) == 64
    assert made["ORDERFLOW_REMOTE_ACCOUNTS"] == f"{HUB}:{key}:{fence_key}"
    Accounts.parse(made["ORDERFLOW_REMOTE_ACCOUNTS"])  # what the stand-in accepts
    assert account_env(settings, True) != made, "made up for each run"
    given = settings.replace(
        remote_account_key=SecretStr(KEY), remote_fence_key=SecretStr(FENCE_KEY)
    )
    assert account_env(given, True)["ORDERFLOW_REMOTE_ACCOUNTS"] == f"{HUB}:{KEY}:{FENCE_KEY}"
    # Against a remote service of the user's own: only the keys set, none made up.
    assert account_env(settings, False) == {}
    assert set(account_env(given, False)) == {
        "ORDERFLOW_REMOTE_ACCOUNT_KEY",
        "ORDERFLOW_REMOTE_FENCE_KEY",
    }
    monkeypatch.setenv("ORDERFLOW_REMOTE_ACCOUNTS", "set-by-the-user")
    assert "ORDERFLOW_REMOTE_ACCOUNTS" not in account_env(settings, True)
