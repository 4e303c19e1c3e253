"""The operator's application layer as one object: every operator action, one method each.

`Operations` is built from what the actions use: the store, a broker connection, the hub's
names, the settings, who its side publishes as and what its statuses go out on. The API builds
it once at its start, over its long-lived connections (services/api/app.py); each `orderflow`
command builds it for its run with `open_operations`, which opens what the command needs and
closes it after. Both call the same methods, which answer typed values
(services/operator/results.py) and raise `NotFound` or `BadInput`, mapped once by each edge
(404 or 400; exit 1).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

from services.operator import actions
from services.operator.alerts import Feed, alert_letters, follow_alerts
from services.operator.cancellation import CancelOutcome, cancel_order, status_teller
from services.operator.explain import FailureGroup, Undo, group_failures, undo_plan
from services.operator.results import (
    DeadLetter,
    OrderView,
    Processes,
    ReplayResult,
    ShownDeadLetter,
    Stats,
    TimelineEvent,
    UndeliveredAlert,
)
from services.operator.stats import hub_stats, process_stats
from services.operator.views import OrderPage, matching, order_page, order_timeline, order_view
from services.operator.workflows import VersionReport, version_reports
from shared.bootstrap import connect_store, open_broker, open_publisher
from shared.broker import dead_letters
from shared.broker.port import Connection
from shared.broker.publisher import Publishing
from shared.broker.senders import Senders
from shared.broker.topology import Names, queue_depths
from shared.broker.urls import login_user
from shared.config import Settings
from shared.domain.journal import Alert, AlertAction, AlertState
from shared.domain.redaction import shown_body
from shared.domain.timing import utcnow
from shared.errors import ConfigurationError, NotFound
from shared.reporting import Reporter
from shared.store.port import ListCursor, StateQuery, StateStore


@dataclass(frozen=True)
class Operations:
    """What an operator can read and do on one hub, over connections its builder owns."""

    settings: Settings
    names: Names
    senders: Senders
    """Who this side publishes as (a replay's sender): the operator's user, or the API's."""
    opened_store: StateStore | None = None
    connection: Connection | None = None
    publisher: Publishing | None = None
    """What a cancellation's `Cancelled` status goes out on."""

    @property
    def store(self) -> StateStore:
        if self.opened_store is None:  # pragma: no cover - a builder's mistake
            raise ConfigurationError("this operation needs the store, which was not opened")
        return self.opened_store

    @property
    def broker(self) -> Connection:
        if self.connection is None:  # pragma: no cover - a builder's mistake
            raise ConfigurationError("this operation needs the broker, which was not opened")
        return self.connection

    # -- orders

    async def orders(
        self, query: StateQuery, step: str | None, after: ListCursor | None, limit: int
    ) -> OrderPage:
        """The orders matching, most recently changed first, `limit` at most."""
        return await order_page(self.store, query, step, after, limit)

    async def failures(
        self, query: StateQuery, step: str | None, after: ListCursor | None = None
    ) -> list[FailureGroup]:
        """Every matching order's failure, grouped by error kind and message fingerprint."""
        return group_failures([r async for r in matching(self.store, query, step, after)])

    async def order(self, order_id: str) -> OrderView:
        s = self.settings
        return await order_view(
            self.store, order_id, hub=s.hub, supervisor=s.supervisor, retention=s.retention
        )

    async def timeline(self, order_id: str) -> list[TimelineEvent]:
        return await order_timeline(
            self.store, order_id, hub=self.settings.hub, retention=self.settings.retention
        )

    async def select(self, choose: actions.Chooser) -> actions.Selection:
        return await choose(self.store)

    async def act(
        self,
        selection: actions.Selection,
        action: actions.Action,
        by: str,
        *,
        dry_run: bool,
        rate: float | None,
        progress: actions.Progress | None = None,
    ) -> list[actions.Outcome]:
        """The action on each selected order, as selected (services/operator/actions.py)."""
        return await actions.act(
            self.store, selection, action, by, dry_run=dry_run, rate=rate, progress=progress
        )

    async def undo_plans(self, order_ids: Sequence[str]) -> dict[str, list[Undo]]:
        """Each order's undo plan (what `compensate` would run), newest step first."""
        return {o: undo_plan(await self.store.read_compensation(o)) for o in order_ids}

    async def cancel(self, order_id: str, *, by: str) -> CancelOutcome:
        """Cancel an order for its customer; its application told when cancelled at once."""
        if self.publisher is None:  # pragma: no cover - a builder's mistake
            raise ConfigurationError("cancelling needs a publisher, which was not opened")
        tell = status_teller(Reporter(self.store, self.publisher, self.names, by))
        return await cancel_order(self.store, order_id, by=by, tell=tell)

    # -- the hub

    async def stats(self) -> Stats:
        return await hub_stats(
            self.store,
            self.broker,
            self.names,
            stuck_after=timedelta(seconds=self.settings.supervisor.stuck_pending_s),
            overdue_after=self.settings.workflow.step_timeout,
        )

    async def processes(self) -> Processes:
        return await process_stats(self.store, now=utcnow())

    async def queue_depths(self) -> dict[str, int | None]:
        return await queue_depths(self.broker, self.names.watched_queues())

    async def workflows(self) -> list[VersionReport]:
        """The versions, with the orders on each as the store counts them now."""
        usage = await self.store.workflow_usage()
        return version_reports(usage, self.settings.workflow.workflow_version)

    # -- alerts

    async def alerts(self, since: datetime | None, limit: int) -> list[tuple[Alert, AlertState]]:
        """Stored alerts, newest first, each with who acknowledged and resolved it."""
        found = await self.store.list_alerts(since=since, limit=limit)
        states = await self.store.alert_states([a.alert_id for a in found])
        return [(a, states.get(a.alert_id) or AlertState(alert_id=a.alert_id)) for a in found]

    async def mark_alert(
        self, alert_id: str, action: AlertAction, *, by: str, at: datetime | None = None
    ) -> AlertState:
        """Record that `by` took `action` on the alert at `at` (default: now); the first
        record stands."""
        state = await self.store.mark_alert(alert_id, action, by=by, at=at or utcnow())
        if state is None:
            raise NotFound(f"no alert {alert_id!r}")
        return state

    async def follow_alerts(
        self, feed: Feed, *, burst: bool, stop: asyncio.Event | None = None
    ) -> int:
        """Hand each alert notification of `<hub>.alerts.feed` to `feed` (services/operator/
        alerts.py); with `burst`, until the queue is empty, else until `stop`."""
        return await follow_alerts(
            self.broker,
            self.names,
            self.senders,
            self.settings.broker,
            feed,
            burst=burst,
            stop=stop,
        )

    async def undelivered_alerts(self) -> list[UndeliveredAlert]:
        """The notifier's dead letters, oldest first (they stay where they are)."""
        rows = await alert_letters(self.broker, self.names)
        return [UndeliveredAlert.model_validate(row) for row in rows]

    # -- dead letters

    async def dead_letters(self, queue: str | None) -> list[DeadLetter]:
        """Every dead letter of one input queue (`orders`, `payment`, …; None: all)."""
        rows = await dead_letters.dead_letters(self.broker, self._sources(queue))
        return [DeadLetter.model_validate(row) for row in rows]

    async def dead_letter(self, message_id: str, queue: str | None) -> list[ShownDeadLetter]:
        """The dead letters with this id, with headers and body (payment tokens shortened)."""
        found = await dead_letters.find(self.broker, self._sources(queue), message_id)
        if not found:
            raise NotFound(f"no dead-lettered message {message_id!r} in hub {self.names.hub}")
        return [
            ShownDeadLetter.model_validate(letter.row | {"body": shown_body(letter.body)})
            for letter in found
        ]

    async def replay(
        self, message_ids: Collection[str] | None, queue: str | None, *, by: str
    ) -> ReplayResult:
        """Replay these dead letters (None: every one), `by` recorded in a header."""
        done = await dead_letters.replay(
            self.broker,
            self.names,
            self._sources(queue),
            message_ids,
            by=by,
            senders=self.senders,
            publish_timeout_s=self.settings.broker.publish_timeout_s,
        )
        return ReplayResult(
            replayed=done.replayed, unsealed=done.unsealed, not_found=done.not_found
        )

    async def purge(self, queue: str | None) -> dict[str, int]:
        return await dead_letters.purge(self.broker, self._sources(queue))

    def _sources(self, queue: str | None) -> list[str]:
        return dead_letters.source_queues(self.names, queue)


def operator_senders(settings: Settings) -> Senders:
    """Who the operator's commands publish as: the user of ORDERFLOW_RABBITMQ_URL."""
    user = login_user(settings.broker.rabbitmq_url)
    return Senders.of(settings.hub, settings.broker.broker_user_prefix, user, "operator")


@asynccontextmanager
async def open_operations(
    settings: Settings,
    *,
    name: str,
    store: bool = True,
    broker: bool = False,
    publisher: bool = False,
) -> AsyncIterator[Operations]:
    """The operations for one command's run, over the connections it needs (`broker`, and a
    `publisher` on it), opened in that order and closed after."""
    async with AsyncExitStack() as stack:
        opened = None
        if store:
            opened = await connect_store(settings)
            stack.push_async_callback(opened.close)
        connection = None
        if broker or publisher:
            connection = await open_broker(settings, name=name)
            stack.push_async_callback(connection.close)
        sends = await open_publisher(settings, connection) if connection and publisher else None
        yield Operations(
            settings, Names(settings.hub), operator_senders(settings), opened, connection, sends
        )
