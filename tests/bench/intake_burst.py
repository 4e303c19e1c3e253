"""How long a valid order waits behind a burst of bad ones: a benchmark that prints figures.

    python -m tests.bench.intake_burst --bad 1000 [--rounds 3] [--seed 12]

It starts the whole topology on the local RabbitMQ and PostgreSQL in a hub of its own (as the
system tests do), draws `--bad` messages that submission must refuse from the generator of
tests/support/bodies.py (deterministic for a seed: every class of hostile input, only those
`decode` or submission refuses), publishes them on `<hub>.submit` as a hostile client would,
then one valid order — all while submission is frozen (SIGSTOP), so the order is queued behind
the whole burst — and reports, per round:

- the valid order's time from submission's thaw to Processed (and, first, that of an order with
  nothing queued before it, as the baseline on this machine at this minute);
- how long the burst took to be dead-lettered, the reasons, and that every bad message was
  dead-lettered at its first delivery (`x-orderflow-deliveries` = 1), none set aside, none left.

The target (issue 12) is under 5 s behind 1,000 bad messages on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import aio_pika
import hypothesis
from hypothesis import HealthCheck, given, settings

from shared.broker.port import Outgoing
from shared.broker.publisher import Publisher
from shared.broker.rabbitmq import connect as connect_port
from shared.broker.rabbitmq.connection import connect
from shared.broker.topology import Names
from shared.domain.states import ProcessState
from tests.conftest import RABBITMQ_URL
from tests.support.bodies import expected_outcome, hostile_messages, sample_contracts, type_property
from tests.support.topology import Topology, running_topology
from tests.support.waiting import eventually


def draw_bad(n: int, seed: int) -> list[tuple[str | None, bytes, str]]:
    """`n` generated messages that must be refused, with the reason, the same for a seed."""
    drawn: list[tuple[str | None, bytes, str]] = []

    def batch(batch_seed: int) -> None:
        @hypothesis.seed(batch_seed)
        @settings(
            max_examples=max(100, n - len(drawn)),
            database=None,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(hostile_messages())
        def collect(message: tuple[str | None, bytes]) -> None:
            kind = type_property(message[0])
            outcome = expected_outcome(kind, message[1])
            if outcome != "handled" and len(drawn) < n:
                drawn.append((kind, message[1], outcome))

        collect()

    for batch_seed in range(seed, seed + 100):
        if len(drawn) >= n:
            break
        batch(batch_seed)
    return drawn


async def processed_after(topo: Topology, publisher: Publisher, names: Names) -> float:
    order_id = f"good-{uuid.uuid4().hex[:12]}"
    started = time.monotonic()
    await publisher.publish(
        sample_contracts(order_id)[0], exchange=names.submit, routing_key="", message_id=order_id
    )

    async def processed() -> bool:
        state = await topo.store.get_state(order_id)
        return state is not None and state.process_state is ProcessState.PROCESSED

    await eventually(processed, timeout=120, interval=0.02, what=f"order {order_id}")
    return time.monotonic() - started


async def dead_lettered(
    names: Names, ids: set[str]
) -> dict[str, aio_pika.abc.AbstractIncomingMessage]:
    connection = await connect(RABBITMQ_URL, timeout=5, name="bench")
    got: dict[str, aio_pika.abc.AbstractIncomingMessage] = {}
    try:
        channel = await connection.channel()
        dlq = await channel.get_queue(names.dlq(names.orders))
        while (message := await dlq.get(no_ack=True, fail=False)) is not None:
            if str(message.message_id) in ids:
                got[str(message.message_id)] = message
        return got
    finally:
        await connection.close()


async def one_round(topo: Topology, bad: list[tuple[str | None, bytes, str]]) -> None:
    """The burst and the valid order are queued while submission is frozen (SIGSTOP), so that
    the order really waits behind all of them; the clock starts when submission thaws."""
    names = Names(topo.hub)
    connection = await connect_port(RABBITMQ_URL, timeout=5, name="hostile-client")
    publisher = await Publisher.open(connection, timeout=10)
    ids: dict[str, str] = {}
    order_id = f"behind-{uuid.uuid4().hex[:12]}"
    try:
        baseline = await processed_after(topo, publisher, names)
        topo.signal("submission", signal.SIGSTOP)
        try:
            for kind, body, reason in bad:
                message_id = f"bad-{uuid.uuid4().hex}"
                ids[message_id] = reason
                await publisher.publish_raw(
                    Outgoing(body, message_id=message_id, type=kind),
                    exchange=names.submit,
                    routing_key="",
                )
            await publisher.publish(
                sample_contracts(order_id)[0],
                exchange=names.submit,
                routing_key="",
                message_id=order_id,
            )
        finally:
            thawed = time.monotonic()
            topo.signal("submission", signal.SIGCONT)
    finally:
        await connection.close()

    async def processed() -> bool:
        state = await topo.store.get_state(order_id)
        return state is not None and state.process_state is ProcessState.PROCESSED

    await eventually(processed, timeout=120, interval=0.02, what=f"order {order_id}")
    behind = time.monotonic() - thawed
    seen: dict[str, aio_pika.abc.AbstractIncomingMessage] = {}
    give_up = time.monotonic() + 120
    while len(seen) < len(ids) and time.monotonic() < give_up:
        seen |= await dead_lettered(names, set(ids) - set(seen))
        await asyncio.sleep(0.05)
    drained = time.monotonic() - thawed
    wrong = [m for m, msg in seen.items() if msg.headers.get("x-orderflow-reason") != ids[m]]
    again = [m for m, msg in seen.items() if msg.headers.get("x-orderflow-deliveries") != 1]
    reasons = Counter(ids.values())
    print(
        f"  baseline order (nothing queued before it): {baseline:.3f} s to Processed\n"
        f"  behind {len(bad)} bad messages queued first: Processed {behind:.3f} s after "
        f"submission resumed\n"
        f"  dead-lettered {len(seen)}/{len(ids)} within {drained:.2f} s; wrong reason: "
        f"{len(wrong)}; not at the first delivery: {len(again)}\n"
        f"  reasons: {dict(reasons.most_common())}"
    )


async def main(bad_count: int, rounds: int, seed: int) -> None:
    bad = draw_bad(bad_count, seed)
    with tempfile.TemporaryDirectory() as workdir:
        hub = f"b{uuid.uuid4().hex[:12]}"
        async with running_topology(hub, Path(workdir)) as topo:
            await topo.start_all()
            for n in range(1, rounds + 1):
                print(f"round {n} (hub {hub}):")
                await one_round(topo, bad)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bad", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=12)
    args = parser.parse_args()
    asyncio.run(main(args.bad, args.rounds, args.seed))
