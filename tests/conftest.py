"""Fixtures several test modules share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, sync_playwright

from devkit.local import CHROMIUM_ARGS, chromium_path


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's chromium, headless, driven by Playwright (modules using it skip where it is missing)."""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


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
