"""The shop and the operator console in a real browser: Debian's headless Chromium driven by
Playwright, against the whole topology and `serve api` on PostgreSQL and RabbitMQ.

Each test saves a screenshot of every page it reaches (ORDERFLOW_TEST_ARTIFACTS, default
`test-artifacts/browser/`), to be looked at."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, async_playwright

from shared.domain.states import ProcessState
from tests.conftest import service_missing
from tests.support.api import ApiClient, start_api, token
from tests.support.factories import order_data
from tests.support.topology import Topology, running_topology
from tests.support.waiting import eventually

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

CHROMIUM = os.environ.get("ORDERFLOW_TEST_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(
    os.environ.get(
        "ORDERFLOW_TEST_ARTIFACTS",
        Path(__file__).resolve().parents[2] / "test-artifacts" / "browser",
    )
)
WAIT_MS = 90_000
FOUR = re.compile(r"^4$")


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    if shutil.which(CHROMIUM) is None:
        service_missing("Chromium (Debian's `chromium` package)", CHROMIUM)
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture
async def topo(hub: str, tmp_path: Path) -> AsyncIterator[Topology]:
    async with running_topology(hub, tmp_path) as t:
        yield t


async def _api(topo: Topology, **remote: str) -> ApiClient:
    await topo.start_all(**remote)
    return await start_api(topo)


ARTIFACTS.mkdir(parents=True, exist_ok=True)


async def shot(page: Page, name: str) -> Path:
    path = ARTIFACTS / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path


async def visit(page: Page, click: str, ready: str, name: str) -> None:
    """Click `click`, wait until `ready` is shown, and save the page as `name`."""
    await page.click(click)
    await page.wait_for_selector(ready, timeout=WAIT_MS)
    await shot(page, name)


FOREIGN: dict[Page, list[str]] = {}
"""Per page: what it fetched from another origin and what its CSP refused (issue 33: none)."""


def watch_origins(page: Page, base: str) -> list[str]:
    seen = FOREIGN.setdefault(page, [])
    page.on("request", lambda r: None if r.url.startswith(base + "/") else seen.append(r.url))
    page.on(
        "console",
        lambda m: seen.append(m.text) if "Content Security Policy" in m.text else None,
    )
    return seen


async def signed_in(browser: Browser, base: str, path: str, secret: str) -> Page:
    page = await browser.new_page(viewport={"width": 1280, "height": 900})
    watch_origins(page, base)
    await page.goto(base + path)
    await page.fill("#token", secret)
    await page.click("#token-form button")
    return page


async def shop_checkout(page: Page, payment: str) -> str:
    """Add two products, check out with `payment`; the order id the shop shows."""
    await page.click('button[data-sku="mug-blue"]')
    await page.click('button[data-sku="tea-earl-grey"]')
    await page.click('button[data-sku="mug-blue"]')
    assert await page.text_content("#total") == "33.90 EUR"
    await page.select_option("#payment", payment)
    await page.click("#place")
    await page.wait_for_selector("#order:not(.hidden)", timeout=WAIT_MS)
    order_id = await page.text_content("#order-id")
    assert order_id
    return order_id


async def test_an_order_placed_in_the_shop_is_seen_completed(
    topo: Topology, browser: Browser
) -> None:
    api = await _api(topo)
    try:
        page = await signed_in(browser, api.base, "/", token(topo, "shop", "acme"))
        await page.wait_for_selector("#catalogue tbody tr", timeout=WAIT_MS)
        await shot(page, "shop-catalogue")
        order_id = await shop_checkout(page, "tok_visa")
        await page.wait_for_selector('#order-status [data-status="Completed"]', timeout=WAIT_MS)
        assert await page.is_hidden("#cancel"), "a Completed order cannot be cancelled"
        steps = await page.locator("#order-steps li").all_text_contents()
        assert len(steps) == 3 and all("Completed" in s for s in steps), steps
        await shot(page, "shop-completed")
        state = await topo.store.get_state(f"acme.{order_id}")
        assert state is not None and state.process_state is ProcessState.PROCESSED
        docs = await page.goto(api.base + "/docs")
        assert docs is not None and docs.status == 404, "no Swagger UI from a CDN"
        assert not FOREIGN[page], FOREIGN[page]
    finally:
        await api.close()


async def test_a_declined_payment_shows_compensated(topo: Topology, browser: Browser) -> None:
    api = await _api(topo)
    try:
        page = await signed_in(browser, api.base, "/", token(topo, "shop", "acme"))
        await page.wait_for_selector("#catalogue tbody tr", timeout=WAIT_MS)
        await shop_checkout(page, "tok_declined")
        await page.wait_for_selector('#order-status [data-status="Compensated"]', timeout=WAIT_MS)
        assert "declined" in (await page.text_content("#order-error") or "")
        await shot(page, "shop-declined-compensated")
    finally:
        await api.close()


async def test_cancel_an_order_while_a_step_hangs_and_see_it_compensated(
    topo: Topology, browser: Browser
) -> None:
    api = await _api(topo, ORDERFLOW_REMOTE_HANG_RATE="1", ORDERFLOW_REMOTE_HANG_S="8")
    try:
        page = await signed_in(browser, api.base, "/", token(topo, "shop", "acme"))
        await page.wait_for_selector("#catalogue tbody tr", timeout=WAIT_MS)
        order_id = await shop_checkout(page, "tok_visa")

        async def step_running() -> bool:
            state = await topo.store.get_state(f"acme.{order_id}")
            return state is not None and any(s.attempts for s in state.steps.values())

        await eventually(step_running, timeout=60, what="a step of the order sent")
        await page.wait_for_selector("#cancel:not(.hidden)", timeout=WAIT_MS)
        await shot(page, "shop-step-hanging")
        await page.click("#cancel")
        await page.wait_for_selector("#order-message .notice", timeout=WAIT_MS)
        await topo.remote.set_faults(hang_rate=0.0)  # the undos go through
        await page.wait_for_selector('#order-status [data-status="Compensated"]', timeout=WAIT_MS)
        assert "cancelled by acme" in (await page.text_content("#order-error") or "")
        await shot(page, "shop-cancelled-compensated")
        audit = await topo.audit()
        assert audit["ok"], audit["violations"]
    finally:
        await api.close()


async def test_an_operator_resubmits_a_failure_group_after_an_outage(
    topo: Topology, browser: Browser
) -> None:
    # Every order parked alike, so all four make one failure group: a circuit breaker opening
    # midway let the agent stay silent for some (parked by the supervisor: "last: no reply")
    # and answer for others ("last: circuit open"), two groups (failed once in CI).
    topo.env = topo.env | {
        "ORDERFLOW_FAILURE_THRESHOLD": "2",
        "ORDERFLOW_BREAKER_FAIL_MAX": "1000",
    }
    api = await _api(topo, ORDERFLOW_REMOTE_OUTAGE="true")
    try:
        shop = token(topo, "shop", "acme")
        for n in range(4):
            body = order_data(f"o-{n}").model_dump(mode="json")
            assert (await api.call("POST", "/orders", shop, body)).status in (201, 202)

        await topo.wait_count(ProcessState.ERROR, 4, timeout=120)  # parked by the outage
        page = await signed_in(browser, api.base, "/console", token(topo, "operator", "otto"))
        await page.wait_for_selector('#counts [data-state="Error"]', timeout=WAIT_MS)
        assert await page.text_content('#counts [data-state="Error"] b') == "4"
        await shot(page, "console-overview")
        orders = 'nav a[data-view="orders"]'
        await visit(page, orders, '#orders tr[data-order="acme.o-0"]', "console-orders")
        timeline = "#d-timeline tbody tr"
        await visit(page, '#orders tr[data-order="acme.o-0"] a', timeline, "console-order-timeline")
        await page.click('nav a[data-view="failures"]')
        await page.wait_for_selector("#groups tbody tr button", timeout=WAIT_MS)
        await page.click("#groups tbody tr button")
        await page.wait_for_selector("#bulk-outcomes tr", timeout=WAIT_MS)
        dry = await page.text_content("#bulk-dry")
        groups = (await api.call("GET", "/ops/failures", token(topo, "viewer", "vic"))).body
        assert dry is not None and "4 would be resubmitted" in dry, (dry, groups)
        await shot(page, "console-failures-dry-run")
        assert (await topo.counts())[ProcessState.ERROR] == 4, "a dry run changes nothing"
        await topo.remote.set_faults(outage=False)
        await page.click("#bulk-confirm")
        # (The pages' CSP forbids eval, so no wait_for_function: locators wait on text.)
        await page.locator("#bulk-status", has_text="finished").wait_for(timeout=WAIT_MS)
        assert "4 resubmitted" in (await page.text_content("#bulk-status") or "")
        await shot(page, "console-bulk-progress")
        await topo.wait_count(ProcessState.PROCESSED, 4)
        await page.click('nav a[data-view="overview"]')
        processed_count = page.locator('#counts [data-state="Processed"] b', has_text=FOUR)
        await processed_count.wait_for(timeout=WAIT_MS)
        await shot(page, "console-overview-after")
        await visit(page, 'nav a[data-view="dead-letters"]', "#letters", "console-dead-letters")
        await visit(page, 'nav a[data-view="alerts"]', "#alerts tbody tr", "console-alerts")
        assert not FOREIGN[page], FOREIGN[page]
        audit = await topo.audit()
        assert audit["ok"], audit["violations"]
    finally:
        await api.close()
