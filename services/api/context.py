"""What every request of the API shares: the process's store, broker connection and publisher,
the bridge from its status queue to the live streams and their places, the shop's catalogue,
the operator's running bulk actions and the count of unknown tokens."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from services.api.limits import FailedAuth, Streams
from services.api.models import Catalogue, CatalogueItem
from services.operator.operations import Operations
from shared.broker.envelope import user_of
from shared.broker.port import Connection, Incoming
from shared.broker.publisher import Publishing
from shared.broker.senders import STATUS_SENDERS, Senders
from shared.broker.topology import Names
from shared.config import ApiSettings
from shared.domain.messages import Contract, OrderStatusUpdate
from shared.domain.models import scoped
from shared.errors import ConfigurationError
from shared.remote.payments import DECLINED_TEST_TOKEN
from shared.store.port import StateStore

BUILT_IN_CATALOGUE = [
    CatalogueItem(sku="mug-blue", name="Blue enamel mug", unit_price_cents=1250),
    CatalogueItem(sku="tea-earl-grey", name="Earl Grey, 250 g", unit_price_cents=890),
    CatalogueItem(sku="kettle-steel", name="Steel kettle, 1.5 l", unit_price_cents=4900),
    CatalogueItem(sku="cups-set-4", name="Four porcelain cups", unit_price_cents=3200),
    CatalogueItem(sku="spoon-silver", name="Silver tea spoon", unit_price_cents=650),
]
TEST_TOKENS = {
    "tok_visa": "a card that pays",
    DECLINED_TEST_TOKEN: "a card that is declined (the order is compensated)",
}


def load_catalogue(settings: ApiSettings) -> Catalogue:
    """The shop's catalogue: `ORDERFLOW_API_CATALOGUE_PATH`, or the built-in one."""
    items = BUILT_IN_CATALOGUE
    if settings.api_catalogue_path:
        path = Path(settings.api_catalogue_path)
        try:
            loaded = json.loads(path.read_text())
            items = [CatalogueItem.model_validate(item) for item in loaded]
        except (OSError, ValueError, TypeError) as exc:
            raise ConfigurationError(f"ORDERFLOW_API_CATALOGUE_PATH {path}: {exc}") from None
    return Catalogue(currency="EUR", items=items, test_payment_tokens=TEST_TOKENS)


class StatusBridge:
    """The API's status queue, told on to the streams that watch each order (by the id the
    status message carries: the application's own, `<shop>.<id>`)."""

    def __init__(self, senders: Senders) -> None:
        self._senders = senders
        self._watchers: dict[str, set[asyncio.Event]] = {}

    def on_status(self, contract: Contract, message: Incoming) -> None:
        if not isinstance(contract, OrderStatusUpdate):
            return
        if self._senders.refusal(user_of(message), STATUS_SENDERS) is not None:
            return  # only orderflow's processes report an order's status
        self.notify(contract.order_id)

    def notify(self, app_order_id: str) -> None:
        for woken in self._watchers.get(app_order_id, ()):
            woken.set()

    @contextlib.contextmanager
    def watch(self, app_order_id: str) -> Iterator[asyncio.Event]:
        """An event set whenever a status of the order arrives (clear it after each)."""
        woken = asyncio.Event()
        self._watchers.setdefault(app_order_id, set()).add(woken)
        try:
            yield woken
        finally:
            watchers = self._watchers[app_order_id]
            watchers.discard(woken)
            if not watchers:
                del self._watchers[app_order_id]

    @property
    def watched(self) -> int:
        return sum(len(w) for w in self._watchers.values())


@dataclass
class BulkJob:
    """A bulk resubmission the console follows: its progress and, once done, its outcomes."""

    job_id: str
    by: str
    total: int = 0
    done: int = 0
    outcomes: list[tuple[str, str]] = field(default_factory=list)
    finished: bool = False
    error: str | None = None
    task: asyncio.Task[None] | None = None


@dataclass
class ApiContext:
    settings: ApiSettings
    max_message_bytes: int
    """The broker's bound on a message, which bounds a request's body too."""
    store: StateStore
    connection: Connection
    publisher: Publishing
    names: Names
    app: str
    """The API's application name (its broker user): what prefixes its status queue."""
    status_queue: str
    bridge: StatusBridge
    catalogue: Catalogue
    ops: Operations
    """The operator's actions (services/operator/operations.py), built once at the start: over
    the store, a connection as the API's own broker user (`api_rabbitmq_url`, `<hub>-api`; or
    else `connection`) for dead letters and queue depths, and a publisher on it for the API's
    own statuses (a cancellation's `Cancelled`), whose user may send statuses."""
    jobs: dict[str, BulkJob] = field(default_factory=dict)
    _numbers: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    streams: Streams = field(init=False)
    """The live status streams' places (`api_streams_max`, `api_streams_per_token`)."""
    failed_auth: FailedAuth = field(default_factory=FailedAuth)
    """Unknown tokens by client address (services/api/auth.py)."""

    def __post_init__(self) -> None:
        s = self.settings
        self.streams = Streams(s.api_streams_max, s.api_streams_per_token, s.api_stream_max_s)

    def app_order_id(self, shop: str, shop_order_id: str) -> str:
        """The id the API submits a shop's order under: the shop's name, then its own id."""
        return f"{shop}.{shop_order_id}"

    def stored_ids(self, app_order_id: str) -> list[str]:
        """Where the store may hold an order the API submitted: under the API's name (where
        submission tells applications apart) or as it is (where it does not)."""
        return [scoped(self.app, app_order_id), app_order_id]

    def next_job_id(self) -> str:
        return f"job-{next(self._numbers)}"
