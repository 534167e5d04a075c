"""A class behind one address, through gradio_client against `python app.py` (synthetic engine):
30 sessions from one address, n = 4 each, at once, all get their samples; with 32 runs streaming
from the address, a 33rd session's run gets the address's message, which names that session's own
runs (none) and not the others'; a run the full engine queues says it waits its turn."""

from __future__ import annotations

import concurrent.futures
import time
from types import SimpleNamespace
from typing import Any

import pytest
from gradio_client import Client

from backend.config.settings import Limits
from backend.engines.embedded.engine import EmbeddedEngine
from backend.engines.synthetic import synthetic_tokens
from tests.support.backends import RunningApp, serving
from ui.handlers import Handlers
from ui.view import WAITING_TURN
from ui.visitor_limits import RUNS_PER_ADDRESS

APP_RATE = 20.0
"""Tokens/s per sample: a 40-token run streams for about two seconds, so 30 of them overlap."""

SAMPLES, STATUS = 0, 1
CLASS = 30


def generate(client: Client, seed: int, max_tokens: int) -> Any:
    """A Generate of n = 4 from `client`'s session, submitted (a gradio_client job)."""
    return client.submit("Tell a story.", 4, max_tokens, 0.8, 0.95, seed, api_name="/generate")


def texts(output: Any) -> list[str]:
    return [sample["text"] for sample in output[SAMPLES]["samples"]]


def streaming(job: Any) -> bool:
    """Whether the job's run has its columns on the page (accepted, streaming)."""
    return any(o[SAMPLES]["samples"] and "streaming" in o[STATUS] for o in job.outputs())


@pytest.fixture(scope="module")
def clients(synthetic_app: RunningApp) -> list[Client]:
    """Sessions of one address (127.0.0.1): a gradio_client Client each."""
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda _: Client(synthetic_app.url, verbose=False), range(RUNS_PER_ADDRESS + 1)))


def test_thirty_sessions_from_one_address_each_get_their_samples(clients: list[Client]) -> None:
    jobs = [generate(client, 100 + i, 40) for i, client in enumerate(clients[:CLASS])]
    finals = [job.result(timeout=120) for job in jobs]
    for i, final in enumerate(finals):
        assert "Error" not in final[STATUS], (i, final[STATUS])
        assert "finished" in final[STATUS], (i, final[STATUS])
        expected = ["".join(synthetic_tokens(100 + i + k, 40, 0.8)[0]) for k in range(4)]
        assert texts(final) == expected, i


def test_a_run_past_the_address_share_gets_the_address_message(clients: list[Client]) -> None:
    """32 long runs streaming from the address; the 33rd session's Generate is refused with the
    address's message, which says none of them is that session's; once they are cancelled, it runs."""
    jobs = [generate(client, 300 + i, 2000) for i, client in enumerate(clients[:RUNS_PER_ADDRESS])]
    deadline = time.monotonic() + 60
    while not all(streaming(job) for job in jobs):
        assert time.monotonic() < deadline, "the 32 runs did not all start streaming"
        time.sleep(0.2)
    late = clients[RUNS_PER_ADDRESS]
    refused = generate(late, 999, 40).result(timeout=30)
    said = refused[STATUS]
    assert "Error" in said and f"{RUNS_PER_ADDRESS} runs are streaming from your network's address" in said
    assert "none is this session's" in said and "you already have" not in said
    with concurrent.futures.ThreadPoolExecutor(8) as pool:  # as a class would press Cancel: at once
        list(pool.map(lambda client: client.predict(api_name="/cancel"), clients[:RUNS_PER_ADDRESS]))
    for job in jobs:
        job.result(timeout=60)
    final = generate(late, 999, 12).result(timeout=60)
    assert "finished" in final[STATUS], final[STATUS]


async def test_a_run_the_full_engine_queues_says_it_waits_its_turn() -> None:
    """The embedded engine decoding two rows at most: a second session's run waits behind the
    first's two samples, and its status line says it waits its turn (no other run named); it then
    streams and finishes."""
    engine = EmbeddedEngine(max_rows=2, context=1024)
    async with serving(engine, Limits()) as backend:
        handlers = Handlers(backend.url)
        first_session = SimpleNamespace(session_hash="student-1", client=None, headers={})
        second_session = SimpleNamespace(session_hash="student-2", client=None, headers={})
        settings = {"prompt": "Write a long story about a lighthouse.", "n": 2, "temperature": 0.8}
        settings |= {"top_p": 0.95, "seed": 7, "format": "chat", "system": ""}
        first = handlers.generate(first_session, **settings, max_tokens=600)
        while "streaming 2 of 2" not in (await anext(first))[STATUS]:
            pass
        said = [
            outputs[STATUS] async for outputs in handlers.generate(second_session, **settings, max_tokens=8)
        ]
        await first.aclose()
    waiting = [line for line in said if WAITING_TURN in line]
    assert waiting, said
    assert "student-1" not in waiting[0] and "finished" in said[-1], said[-1]
