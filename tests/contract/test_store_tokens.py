"""Contract: API tokens (`ApiTokens`), for every store adapter: found by digest while active,
one active token per name (also under concurrent creates), revoked ones kept and listed."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from shared.domain.timing import utcnow
from shared.domain.tokens import ApiToken, Role, digest_of, issue
from shared.store.port import StateStore


def _token(name: str, role: Role, at: datetime) -> tuple[ApiToken, str]:
    return issue(name, role, now=at)


async def test_a_created_token_is_found_by_its_digest_and_only_by_it(store: StateStore) -> None:
    now = utcnow()
    token, secret = _token("acme", Role.SHOP, now)
    assert await store.token_create(token)
    assert await store.token_find(digest_of(secret)) == token
    assert await store.token_find(digest_of(secret + "x")) is None
    assert await store.token_find(secret) is None, "the secret itself is no key"
    assert (await store.record_counts())["api_tokens"] == 1


async def test_an_active_name_is_refused_and_nothing_is_written(store: StateStore) -> None:
    now = utcnow()
    first, _ = _token("vera", Role.VIEWER, now)
    second, second_secret = _token("vera", Role.OPERATOR, now + timedelta(seconds=1))
    assert await store.token_create(first)
    assert not await store.token_create(second)
    assert await store.token_find(digest_of(second_secret)) is None
    assert await store.token_list() == [first]


async def test_a_digest_is_stored_once(store: StateStore) -> None:
    token, _ = _token("otto", Role.OPERATOR, utcnow())
    assert await store.token_create(token)
    same_secret = token.model_copy(update={"name": "otto-2"})
    assert not await store.token_create(same_secret)
    assert await store.token_list() == [token]


async def test_a_revoked_token_is_not_found_and_its_name_may_be_reused(store: StateStore) -> None:
    now = utcnow()
    old, old_secret = _token("acme", Role.SHOP, now)
    assert await store.token_create(old)
    revoked_at = now + timedelta(minutes=1)
    assert await store.token_revoke("acme", at=revoked_at)
    assert await store.token_find(digest_of(old_secret)) is None
    assert not await store.token_revoke("acme", at=revoked_at), "revoked already"

    new, new_secret = _token("acme", Role.SHOP, now + timedelta(minutes=2))
    assert await store.token_create(new)
    assert await store.token_find(digest_of(new_secret)) == new
    assert await store.token_find(digest_of(old_secret)) is None
    # Revoking the name again revokes the new token, and leaves the old one as it was.
    assert await store.token_revoke("acme", at=now + timedelta(minutes=3))
    assert [(t.digest, t.revoked_at) for t in await store.token_list()] == [
        (new.digest, now + timedelta(minutes=3)),
        (old.digest, revoked_at),
    ]


async def test_revoking_an_unknown_name_changes_nothing(store: StateStore) -> None:
    token, secret = _token("acme", Role.SHOP, utcnow())
    assert await store.token_create(token)
    assert not await store.token_revoke("nobody", at=utcnow())
    assert not await store.token_revoke("ACME", at=utcnow()), "names are case-sensitive"
    assert await store.token_find(digest_of(secret)) == token


async def test_the_list_holds_revoked_tokens_newest_first(store: StateStore) -> None:
    assert await store.token_list() == []
    t = utcnow()
    made = [
        _token("b-shop", Role.SHOP, t)[0],
        _token("a-view", Role.VIEWER, t)[0],  # same time: by name
        _token("ops", Role.OPERATOR, t + timedelta(seconds=5))[0],
        _token("old", Role.VIEWER, t - timedelta(days=3))[0],
    ]
    for token in made:
        assert await store.token_create(token)
    assert await store.token_revoke("ops", at=t + timedelta(seconds=6))

    listed = await store.token_list()
    assert [(x.name, x.role, x.created_at) for x in listed] == [
        ("ops", Role.OPERATOR, t + timedelta(seconds=5)),
        ("a-view", Role.VIEWER, t),
        ("b-shop", Role.SHOP, t),
        ("old", Role.VIEWER, t - timedelta(days=3)),
    ]
    assert [x.revoked_at for x in listed] == [t + timedelta(seconds=6), None, None, None]
    assert all(x.created_at.utcoffset() == timedelta(0) for x in listed), "aware, in UTC"


async def test_concurrent_creates_of_one_name_let_exactly_one_win(store: StateStore) -> None:
    now = utcnow()
    tokens = [_token("racer", Role.OPERATOR, now) for _ in range(8)]
    results = await asyncio.gather(*(store.token_create(token) for token, _ in tokens))
    assert results.count(True) == 1
    [(winner, secret)] = [pair for pair, won in zip(tokens, results, strict=True) if won]
    assert await store.token_list() == [winner]
    assert await store.token_find(digest_of(secret)) == winner
    losers = [secret for (_, secret), won in zip(tokens, results, strict=True) if not won]
    assert [await store.token_find(digest_of(s)) for s in losers] == [None] * 7


async def test_concurrent_revokes_of_one_name_let_exactly_one_win(store: StateStore) -> None:
    token, _ = _token("racer", Role.SHOP, utcnow())
    assert await store.token_create(token)
    results = await asyncio.gather(
        *(store.token_revoke("racer", at=utcnow() + timedelta(seconds=i)) for i in range(8))
    )
    assert results.count(True) == 1
