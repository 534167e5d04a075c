"""The guard of every test module that drives chromium: skip where it is not installed, except in CI."""

from __future__ import annotations

import os

import pytest

from devkit.local import chromium_path


def require_chromium() -> None:
    """Skip the calling test module where Debian's chromium is missing; in CI (`CI` set) fail instead,
    since CI must run the browser tests (see .ci/run)."""
    if chromium_path() is not None:
        return
    if os.environ.get("CI"):
        raise RuntimeError("chromium is not installed; CI must run the browser tests (see .ci/run)")
    pytest.skip("chromium is not installed (apt-get install chromium)", allow_module_level=True)
