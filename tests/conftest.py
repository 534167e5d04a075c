"""Fixtures several test modules share."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from backend.serving.server import BackendServer
from devkit.local import CHROMIUM_ARGS, chromium_path, free_port, start_app
from tests.support.backends import RunningApp, synthetic_serving


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's chromium, headless, driven by Playwright (modules using it skip where it is missing)."""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def synthetic_app(request: pytest.FixtureRequest) -> Iterator[RunningApp]:
    """`python app.py` on the synthetic engine at the module's `APP_RATE` tokens/s per sample (25
    where it sets none), one for the module's tests, stopped after them."""
    port, backend_port = free_port(), free_port()
    process = start_app(port, rate=getattr(request.module, "APP_RATE", 25.0), backend_port=backend_port)
    try:
        yield RunningApp(f"http://127.0.0.1:{port}/", f"http://127.0.0.1:{backend_port}/health")
    finally:
        process.terminate()
        process.wait(15)


@pytest.fixture
async def server(request: pytest.FixtureRequest) -> AsyncIterator[BackendServer]:
    """A backend in the test's loop on the synthetic engine at the module's `SERVER_RATE` tokens/s
    per sample (100 where it sets none) and `SERVER_JITTER` (0.2), with its `SERVER_LIMITS` (the
    defaults) and `SERVER_OPTIONS` (`ServerOptions` fields); one for each test."""
    module = request.module
    async with synthetic_serving(
        getattr(module, "SERVER_RATE", 100.0),
        getattr(module, "SERVER_JITTER", 0.2),
        getattr(module, "SERVER_LIMITS", None),
        **getattr(module, "SERVER_OPTIONS", {}),
    ) as backend:
        yield backend


@pytest.fixture
def page(browser: Browser, synthetic_app: RunningApp) -> Iterator[Page]:
    """A chromium tab on the module's app, once its Generate button shows."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(synthetic_app.url)
    expect(page.locator("#generate")).to_be_visible(timeout=30_000)
    yield page
    page.close()


ENGINE_GROUPS = ("server_sglang", "server_vllm", "app_serving", "app_failing")
"""The real-engine tests' groups (markers): each group's tests share the servers or the kind of
app.py start they need, and `make test-engines` (scripts/test-engines.sh) runs the groups at once,
each in a pytest of its own."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test against a real engine server (the `real_server` fixture's `sglang` or `vllm`) is in
    that server's group; every test of tests/test_engines_real.py must be in a group, or the group
    runs would leave it out."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        server = callspec.params.get("real_server") if callspec is not None else None
        if server is not None:
            item.add_marker(getattr(pytest.mark, f"server_{server}"))
        if item.path.name == "test_engines_real.py" and not any(
            item.get_closest_marker(g) for g in ENGINE_GROUPS
        ):
            raise pytest.UsageError(f"{item.nodeid} is in none of the engine test groups {ENGINE_GROUPS}")
