"""The sglang and openai engines through the backend websocket, against real SGLang and vLLM servers.

The servers run on this CPU from the environments `scripts/prepare-engine-envs.sh` caches outside
the repo (SGLang 0.5.23 with import-only stand-ins for its CUDA packages, vLLM's CPU build), both on
SmolLM2-135M-Instruct converted from the GGUF. `make test-engines` prepares them and runs this file
with DASHBOARD_REAL_ENGINES=1; without it (plain `make test`) these tests skip, saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect

from backend.config.settings import Limits
from backend.engines.http.base import HTTPEngine
from backend.engines.http.openai import OpenAIEngine
from backend.engines.http.sglang import SGLangEngine
from backend.engines.http.sglang_launch import SGLangServerProcess, compile_cache, free_port
from backend.frames import cancel_frame
from backend.serving.server import BackendServer
from devkit.frames import recv_frame
from devkit.local import (
    CONVERTED_MODEL,
    ENGINE_CACHE,
    ROOT,
    SERVED_NAME,
    SERVER_START_S,
    stop_process_group,
    wait_for_http,
)
from devkit.vllm import VLLM_PYTHON, start_vllm
from tests.support.answers import COLOUR_PROMPT, LONG_PROMPT, answers_colours
from tests.support.backends import serving
from tests.support.gpu_space import entry_command, image_env
from tests.support.stop_one import MAX_TOKENS, MAX_TOKENS_ON_GPU, StopOneSample
from tests.support.wire import finishes_of, generate, of_request, texts_of, until_done
from ui.engine_info import engine_line_now
from ui.examples import WEEK

pytestmark = pytest.mark.skipif(
    os.environ.get("DASHBOARD_REAL_ENGINES") != "1",
    reason="real SGLang/vLLM servers: run `make test-engines` (prepares them, sets DASHBOARD_REAL_ENGINES=1)",
)

CACHE = ENGINE_CACHE
MODEL = CONVERTED_MODEL
API_KEY = "test-key-5f2c"
"""Both servers run with --api-key: every test goes through the key, one test without it."""
FRAME_TIMEOUT_S = 120.0
"""Longest wait for one websocket frame while a CPU server generates."""
METRICS_SETTLE_S = 15.0
"""How long the server may take to count an abort in /metrics."""
TALLY_QUIET_S = 3.0
"""How long SGLang's count of generated tokens must hold still before it is read as settled: it
tallies each aborted sample's tokens when the finish reaches its tokenizer manager (in CI runs on 2
cores with the four engine test groups at once, a Cancel's 4 samples' 4 tokens came after its
scheduler's count read 0, once after the count had held still for 1 s)."""

ON_GPU = os.environ.get("DASHBOARD_ENGINES_ON_GPU") == "1"
"""Set by scripts/gpu-check.sh: SGLang is the one installed beside this Python (the GPU install) and
runs on the machine's GPU, instead of the CPU environment with its CPU flags and stand-ins."""

LONG = MAX_TOKENS_ON_GPU if ON_GPU else MAX_TOKENS
"""max_tokens of samples that must still be running when they are stopped: on a GPU SmolLM2-135M
writes 400 tokens in about a second, so there they may run to nearly the 2048-token context (and to
the page's own max_tokens limit, 2048)."""

STOPPED_WITHIN_S = 1.0
"""How soon after a Cancel SGLang's own count of the requests it runs or queues must be 0."""

IN_PASS_STOPPED_WITHIN_S = 5.0
"""The same for a Cancel sent once SGLang counts the request (on a server, through the router and
in-process): its scheduler takes the abort after the forward pass it is in (a pass is not
interrupted), and with the four engine test groups at once on this machine's two cores a pass takes
many times what it takes alone. Read 0 after 0.20 s alone (0.38-0.44 s through the router); with
the four groups, 1.0 request still running at 1.01 s and at 2.04 s in two CI runs, 4 through the
router at 2.01 s. This is a bound on the engine's liveness under that load, not its latency: the
Cancel's effect is checked by events (every sample ends `abort` short of max_tokens, and SGLang
generates nothing after), and a Cancel SGLang ignored would run its 4 samples to LONG tokens, a
pass each (400 passes: 80 s alone)."""

ROUTER_STOPPED_WITHIN_S = 2.0
"""STOPPED_WITHIN_S through the router, for a Cancel sent right after Generate: SGLang's count is
read from the two workers through the router, which share this machine's two cores with the other
engine test groups (read 0 after 0.02-0.03 s)."""

SGLANG_PYTHON = Path(sys.executable) if ON_GPU else CACHE / "envs" / "sglang" / "bin" / "python"
"""The Python that runs SGLang (and app.py beside it)."""

SGLANG_DEVICE_FLAGS = [] if ON_GPU else ["--device", "cpu", "--attention-backend", "torch_native"]
"""launch_server's flags for where SGLang runs: nothing on a GPU (its defaults), these on this CPU."""

KV_TOKENS = 16384
"""SGLang's KV cache, in tokens, on every test server and engine: twice what a test's samples can
hold at once (4 samples, each within the 2048-token context). SGLang fills the cache as it starts:
65536 tokens took 12.6 s of a start on this machine's two loaded cores."""

SGLANG_CPU_PATHS = [] if ON_GPU else [str(ROOT / "tests" / "support")]
"""The import-only stand-ins of CUDA packages SGLang's CPU server needs (tests/support/stand_in.py);
never on a GPU, where the real ones are installed."""


def sglang_device_env() -> dict[str, str]:
    """What SGLang's processes need in their environment for where they run."""
    return {} if ON_GPU else {"SGLANG_USE_CPU_ENGINE": "1"}


def cpu_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def metrics(url: str, path: str = "/metrics") -> dict[str, float]:
    """The server's Prometheus text at `path`, summed per metric name over labels."""
    request = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
    totals: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+([-+0-9.eE]+|NaN)$", line)
        if match and match.group(3) != "NaN":
            name = match.group(1)
            if 'finished_reason="abort"' in (match.group(2) or ""):
                name += ":abort"
            totals[name] = totals.get(name, 0.0) + float(match.group(3))
    return totals


@dataclass
class RealServer:
    """A running server and how to read its load from /metrics."""

    kind: str
    url: str
    running_path: str
    running_metrics: tuple[str, ...]
    aborted_metric: str | None
    """SGLang counts aborted requests; vLLM has no such counter (its running count and tokens tell)."""
    generated_metric: str

    def make_engine(self, url: str | None = None, api_key: str = API_KEY) -> HTTPEngine:
        """The dashboard's engine for this server (or for `url`), with `api_key`."""
        if self.kind == "sglang":
            return SGLangEngine(url or self.url, api_key=api_key)
        return OpenAIEngine(url or self.url, SERVED_NAME, api_key)

    def running(self) -> float:
        """Requests the server is running or has queued, read live from the server."""
        found = metrics(self.url, self.running_path)
        return sum(found.get(name, 0.0) for name in self.running_metrics)

    def aborted(self) -> float:
        return metrics(self.url).get(self.aborted_metric, 0.0) if self.aborted_metric else 0.0

    def generated(self) -> float:
        return metrics(self.url).get(self.generated_metric, 0.0)


SGLANG_SERVER_FLAGS = [
    *SGLANG_DEVICE_FLAGS, "--max-total-tokens", str(KV_TOKENS),
    "--served-model-name", SERVED_NAME, "--enable-metrics", "--context-length", "2048",
    "--api-key", API_KEY, "--sleep-on-idle",
]  # fmt: skip
"""How the test SGLang servers run on this CPU (each worker behind the router too). Without
--sleep-on-idle an idle CPU scheduler polls for work nonstop, taking most of a core from the rest."""


def sglang_test_server(log_name: str) -> SGLangServerProcess:
    python = SGLANG_PYTHON
    assert python.exists() and MODEL.exists(), "run scripts/prepare-engine-envs.sh first"
    return SGLangServerProcess(
        str(MODEL),
        python=str(python),
        extra_args=SGLANG_SERVER_FLAGS,
        env={**sglang_device_env(), "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(SGLANG_CPU_PATHS)},
        log_path=CACHE / log_name,
        start_timeout=SERVER_START_S,
    )


def sglang_real_server(url: str) -> RealServer:
    # /metrics's running gauge is refreshed only every few decode steps; /v1/loads asks the
    # scheduler now.
    loads = ("sglang_num_running_reqs", "sglang_num_waiting_reqs")
    return RealServer(
        "sglang",
        url,
        "/v1/loads?format=prometheus",
        loads,
        "sglang:num_aborted_requests_total",
        "sglang:generation_tokens_total",
    )


@pytest.fixture(scope="module")
def sglang_workers() -> Iterator[list[SGLangServerProcess]]:
    """Two SGLang servers, started at once: the first is the server of every `sglang` test, and both
    are the workers behind the router in the router tests."""
    workers = [sglang_test_server("sglang-test-server.log"), sglang_test_server("sglang-test-worker-2.log")]
    try:
        with ThreadPoolExecutor(len(workers)) as pool:
            for started in [pool.submit(worker.start) for worker in workers]:
                started.result()
        yield workers
    finally:
        for worker in workers:
            worker.stop()


@pytest.fixture(scope="module")
def sglang_server(sglang_workers: list[SGLangServerProcess]) -> RealServer:
    return sglang_real_server(sglang_workers[0].url)


@pytest.fixture(scope="module")
def vllm_server() -> Iterator[RealServer]:
    assert VLLM_PYTHON.exists() and MODEL.exists(), "run scripts/prepare-engine-envs.sh first"
    log = CACHE / "vllm-test-server.log"
    process, url = start_vllm(log, "bfloat16", eager=True, api_key=API_KEY)  # eager: up in ~60 s, not 209
    try:
        running = ("vllm:num_requests_running", "vllm:num_requests_waiting")
        yield RealServer("vllm", url, "/metrics", running, None, "vllm:generation_tokens_total")
    finally:
        stop_process_group(process)


@pytest.fixture(params=["sglang", "vllm"])
def real_server(request: pytest.FixtureRequest) -> RealServer:
    return request.getfixturevalue(f"{request.param}_server")


@pytest.fixture
async def backend(real_server: RealServer) -> AsyncIterator[tuple[BackendServer, RealServer]]:
    # max_tokens past the model's 2048-token context must reach the engine, for the error test.
    async with serving(real_server.make_engine(), Limits(max_tokens_max=4096)) as server:
        yield server, real_server


async def recv(ws: ClientConnection) -> dict[str, Any]:
    return await recv_frame(ws, FRAME_TIMEOUT_S)


async def run_request(ws: ClientConnection, rid: str, on_frame: Any = None) -> dict[str, Any]:
    """Collect one request's frames until its done: texts, finishes, errors; `on_frame(frame,
    texts)` sees each of its frames before the done, with the texts so far."""

    async def each(frame: dict[str, Any], frames: list[dict[str, Any]]) -> None:
        if on_frame is not None:
            await on_frame(frame, texts_of(frames, rid))

    frames = await until_done(ws, rid, limit_s=None, frame_s=FRAME_TIMEOUT_S, on_frame=each)
    finishes = finishes_of(frames, rid)
    assert len({f["index"] for f in finishes}) == len(finishes), "one finish per index"
    return {
        "texts": texts_of(frames, rid),
        "finishes": {f["index"]: f for f in finishes},
        "errors": of_request(frames, "error", rid),
        "done": frames[-1],
    }


def params(max_tokens: int, temperature: float = 0.8) -> dict[str, Any]:
    """A request's sampling settings: `max_tokens` at `temperature`, top_p 0.95."""
    return {"max_tokens": max_tokens, "temperature": temperature, "top_p": 0.95}


async def assert_stopped_on_server(
    server: RealServer, aborted_before: float, generated_before: float, n: int
) -> None:
    """The server runs nothing of the request, counted its n aborts (SGLang), and generates no more."""
    deadline = time.monotonic() + METRICS_SETTLE_S
    while server.running() > 0 or (server.aborted_metric and server.aborted() - aborted_before < n):
        assert time.monotonic() < deadline, (server.running(), server.aborted() - aborted_before)
        await asyncio.sleep(0.5)
    await assert_generates_no_more(server, generated_before, n)


async def settled(read: Callable[[], float], quiet_s: float = TALLY_QUIET_S) -> float:
    """`read()` once it has given the same value for `quiet_s`; fails past METRICS_SETTLE_S."""
    deadline = time.monotonic() + METRICS_SETTLE_S
    value, since = await asyncio.to_thread(read), time.monotonic()
    while time.monotonic() - since < quiet_s:
        assert time.monotonic() < deadline, f"the count still moves {METRICS_SETTLE_S:.0f} s on"
        await asyncio.sleep(0.25)
        now = await asyncio.to_thread(read)
        if now != value:
            value, since = now, time.monotonic()
    return value


async def assert_generates_no_more(server: Any, generated_before: float, n: int) -> None:
    """Once `server` runs nothing of a request of n samples, its count of generated tokens holds
    still for 2 s while it still runs nothing, and the samples fell short of max_tokens. SGLang
    tallies a request's tokens (`sglang:generation_tokens_total`) in its tokenizer manager all at
    once, when the request's finish reaches it, which can be after the scheduler's count reads 0:
    the count is read once it has held still for TALLY_QUIET_S (vLLM counts as it generates)."""
    generated = await settled(server.generated)
    await asyncio.sleep(2.0)
    assert server.generated() == generated, "the server still generates after the abort"
    assert server.running() == 0, "the server runs the request again"
    assert generated - generated_before < n * LONG, "the samples ran to max_tokens: nothing was aborted"


async def stop_one_then_the_rest(url: str, rid: str, stopped_on: Any) -> None:
    """Stop sample 1 of three while 0 and 2 stream on, then cancel the rest; the server (or the
    workers) `stopped_on` then runs nothing of it and counted its aborts."""
    before, generated_before = stopped_on.aborted(), stopped_on.generated()
    watch = StopOneSample()

    async def on_frame(frame: dict[str, Any], texts: dict[int, str]) -> None:
        if frame["type"] not in ("chunk", "finish"):
            return
        action = watch.see(frame["index"], frame.get("text", ""), frame.get("reason"))
        if action:
            cancel = cancel_frame(rid) | ({"index": 1} if action == "one" else {})
            await ws.send(json.dumps(cancel))

    async with connect(url) as ws:
        await ws.send(generate(rid, 3, LONG_PROMPT, params(LONG)))
        result = await run_request(ws, rid, on_frame)
    assert not watch.problems(), watch.report()
    reasons = [f["reason"] for f in result["finishes"].values()]
    await assert_stopped_on_server(stopped_on, before, generated_before, reasons.count("abort"))


async def disconnect_mid_stream(server: BackendServer, rid: str, stopped_on: Any) -> None:
    """Close the connection while four samples stream: `stopped_on` then runs nothing of them."""
    before, generated_before = stopped_on.aborted(), stopped_on.generated()
    async with connect(server.url) as ws:
        await ws.send(generate(rid, 4, LONG_PROMPT, params(LONG)))
        chunks = 0
        while chunks < 8:
            frame = await recv(ws)
            assert frame["type"] != "finish", f"a sample ended before the disconnect: {frame}"
            chunks += frame["type"] == "chunk" and bool(frame["text"])
        assert stopped_on.running() > 0 and server.health()["running_samples"] > 0
    await assert_stopped_on_server(stopped_on, before, generated_before, 4)


async def wait_running_zero(stopped_on: Any, since: float, within: float = STOPPED_WITHIN_S) -> float:
    """Seconds from `since` until `stopped_on` (SGLang's own count) runs and queues nothing; fails past
    `within`. A reading takes time (through the router, two workers' each): a count above 0 says
    SGLang still ran at the reading's start, a count of 0 is timed at the reading's end."""
    while True:
        asked = time.monotonic() - since
        count = await asyncio.to_thread(stopped_on.running)
        if count <= 0:
            break
        assert asked < within, f"SGLang still runs {count} requests {asked:.2f} s after the cancel"
        await asyncio.sleep(0.05)
    took = time.monotonic() - since
    assert took < within, f"SGLang's count was first read as 0 {took:.2f} s after the cancel"
    return took


async def cancel_at_once(
    ws_url: str,
    rid: str,
    stopped_on: Any,
    *,
    reached: bool = False,
    headers: dict[str, str] | None = None,
    within: float | None = None,
) -> None:
    """Generate n=4 and Cancel right away (with `reached`: once SGLang counts the request, before its
    first chunk where the prefill is long enough): every sample ends `abort`, SGLang's own count is 0
    within `within` s of the Cancel (by default STOPPED_WITHIN_S, IN_PASS_STOPPED_WITHIN_S with
    `reached`: on a server, through the router or in-process), and no sample reaches max_tokens."""
    if within is None:
        within = IN_PASS_STOPPED_WITHIN_S if reached else STOPPED_WITHIN_S
    generated_before = stopped_on.generated()
    async with connect(ws_url, additional_headers=headers) as ws:
        await ws.send(generate(rid, 4, LONG_PROMPT, params(LONG)))
        deadline = time.monotonic() + FRAME_TIMEOUT_S
        while reached and await asyncio.to_thread(stopped_on.running) == 0:
            assert time.monotonic() < deadline, "SGLang never counted the request"
            await asyncio.sleep(0.02)
        cancelled_at = time.monotonic()
        await ws.send(json.dumps(cancel_frame(rid)))
        result = await run_request(ws, rid)
    assert [f["reason"] for f in result["finishes"].values()] == ["abort"] * 4, result["finishes"]
    assert all(f["stats"]["tokens"] < LONG for f in result["finishes"].values()), result["finishes"]
    took = await wait_running_zero(stopped_on, cancelled_at, within)
    print(f"{rid}: SGLang runs nothing {took:.2f} s after the cancel")
    await assert_generates_no_more(stopped_on, generated_before, 4)


async def stop_one_at_once(ws_url: str, rid: str, headers: dict[str, str] | None = None) -> None:
    """Generate n=3 and Stop sample 1 right away, before any chunk: it ends `abort` within its first
    few tokens while 0 and 2 stream on, then Cancel ends them."""
    async with connect(ws_url, additional_headers=headers) as ws:
        await ws.send(generate(rid, 3, LONG_PROMPT, params(LONG)))
        await ws.send(json.dumps(cancel_frame(rid, 1)))
        going: dict[int, int] = {0: 0, 2: 0}
        sent: list[bool] = []

        async def on_frame(frame: dict[str, Any], texts: dict[int, str]) -> None:
            if frame["type"] == "chunk" and frame["index"] in going and frame["text"]:
                going[frame["index"]] += 1
            if not sent and all(count >= 4 for count in going.values()):
                sent.append(True)
                await ws.send(json.dumps(cancel_frame(rid)))

        result = await run_request(ws, rid, on_frame)
    finishes = result["finishes"]
    assert [finishes[i]["reason"] for i in range(3)] == ["abort"] * 3, finishes
    assert sent, f"samples 0 and 2 did not stream on after sample 1 was stopped: {going}"
    # Sample 1 is stopped with its first event, which names it to SGLang: a few tokens at most.
    assert finishes[1]["stats"]["tokens"] < LONG // 10, finishes[1]


async def test_a_chat_prompt_is_answered_on_topic(backend: tuple[BackendServer, RealServer]) -> None:
    """n=4 in the chat format: every sample answers the question, as a person reading it would see."""
    server, _ = backend
    async with connect(server.url) as ws:
        await ws.send(generate("r1", 4, COLOUR_PROMPT, params(64, 0.3)))
        accepted = await recv(ws)
        assert accepted["type"] == "accepted" and accepted["model"] == SERVED_NAME
        assert accepted["format"] == "chat" and "chat template" in accepted["format_reason"]
        result = await run_request(ws, "r1")
    assert sorted(result["finishes"]) == [0, 1, 2, 3]
    assert {f["reason"] for f in result["finishes"].values()} <= {"stop", "length"}
    assert all(f["stats"]["tokens"] >= 10 for f in result["finishes"].values()), result["finishes"]
    assert all(answers_colours(result["texts"].get(i, "")) for i in range(4)), result["texts"]
    assert len(set(result["texts"].values())) > 1, "the samples should differ"
    assert not result["errors"]


@pytest.mark.parametrize("prompt_format", ["chat", "raw"])
async def test_logprobs_come_with_every_token(
    backend: tuple[BackendServer, RealServer], prompt_format: str
) -> None:
    """With logprobs, each chunk's pieces carry one log probability per token, as the server gave
    them; a greedy sample's are each the most likely token's, so none is unlikely."""
    server, _ = backend
    # A raw prompt the model continues at length (a question as raw text may end at once).
    prompt = COLOUR_PROMPT if prompt_format == "chat" else "Once upon a time"
    async with connect(server.url) as ws:
        await ws.send(generate("lp", 2, prompt, params(24, 0.8), format=prompt_format, logprobs=True))
        pieces: dict[int, list[Any]] = {0: [], 1: []}
        tokens = {0: 0, 1: 0}

        async def on_frame(frame: dict[str, Any], texts: dict[int, str]) -> None:
            if frame["type"] == "chunk":
                assert "".join(text for text, _ in frame["logprobs"]) == frame["text"]
                pieces[frame["index"]].extend(frame["logprobs"])
                tokens[frame["index"]] += frame["tokens"]

        result = await run_request(ws, "lp", on_frame)
        await ws.send(generate("greedy", 1, prompt, params(16, 0.0), format=prompt_format, logprobs=True))
        greedy: list[float] = []

        async def on_greedy(frame: dict[str, Any], texts: dict[int, str]) -> None:
            if frame["type"] == "chunk":
                greedy.extend(lp for _, lps in frame["logprobs"] for lp in lps)

        await run_request(ws, "greedy", on_greedy)
    assert not result["errors"]
    for index in (0, 1):
        values = [lp for _, lps in pieces[index] for lp in lps]
        # one per token the sample counted (a chat stream's closing event may count its stop token)
        assert tokens[index] - 1 <= len(values) <= tokens[index], (values, tokens)
        assert all(lp <= 0 for lp in values)
    assert sum(len(lps) for sample in pieces.values() for _, lps in sample) >= 10, pieces
    assert len(greedy) >= 5 and all(lp > -5 for lp in greedy), greedy  # argmax tokens are likely ones


@pytest.mark.parametrize("prompt_format", ["chat", "raw"])
async def test_the_server_gives_k_alternatives_a_token(
    backend: tuple[BackendServer, RealServer], prompt_format: str
) -> None:
    """With `alternatives: k`, each token's piece lists the server's own k most likely tokens there
    (SGLang's `output_top_logprobs`, vLLM's `top_logprobs`), most likely first, with texts; the
    top one at least as likely as the drawn one, which is marked where it is among them."""
    server, _ = backend
    prompt = COLOUR_PROMPT if prompt_format == "chat" else "Once upon a time"
    k = 4
    async with connect(server.url) as ws:
        await ws.send(
            generate("alt", 2, prompt, params(16), format=prompt_format, logprobs=True, alternatives=k)
        )
        entries: list[tuple[float, list[Any]]] = []

        async def on_frame(frame: dict[str, Any], texts: dict[int, str]) -> None:
            if frame["type"] == "chunk":
                for piece in frame["logprobs"]:
                    assert len(piece) == 3, piece
                    entries.extend(zip(piece[1], piece[2], strict=False))

        result = await run_request(ws, "alt", on_frame)
    assert not result["errors"]
    assert len(entries) >= 10, entries
    # vLLM's completions API keys its list by text: two tokens of the same text make one entry.
    assert sum(len(top) == k for _, (_, top) in entries) >= 0.9 * len(entries), entries
    marked = 0
    for logprob, (drawn, top) in entries:
        assert 1 <= len(top) <= k, top
        values = [value for _, value in top]
        assert values == sorted(values, reverse=True) and all(v <= 0 for v in values), top
        assert values[0] >= logprob - 1e-3 and all(isinstance(token, str) and token for token, _ in top), top
        if drawn >= 0:
            assert abs(top[drawn][1] - logprob) < 1e-3, (logprob, top)
            marked += 1
    assert marked >= len(entries) // 2, entries


async def test_a_raw_prompt_still_streams(backend: tuple[BackendServer, RealServer]) -> None:
    server, _ = backend
    async with connect(server.url) as ws:
        await ws.send(generate("r0", 2, "Once upon a time", params(16), format="raw"))
        accepted = await recv(ws)
        assert accepted["format"] == "raw"
        result = await run_request(ws, "r0")
    assert all(f["stats"]["tokens"] > 1 for f in result["finishes"].values()), result["finishes"]
    assert all(len(result["texts"].get(i, "").split()) >= 3 for i in range(2)), result["texts"]
    assert not result["errors"]


async def test_a_continuation_keeps_the_chat_template_and_sglang_reuses_its_cache(
    backend: tuple[BackendServer, RealServer],
) -> None:
    """A sample's first words continued as the assistant's turn (`prefix`): the samples go on from
    them, the prompt grows by those words, and SGLang's radix cache serves what it computed for the
    sample (`cached_tokens` past the first run's whole prompt), as the run summary shows."""
    from ui.view import RunView, prefix_cache_line

    server, real = backend
    async with connect(server.url) as ws:
        await ws.send(generate("p1", 2, COLOUR_PROMPT, params(40, 0.3)))
        first = await run_request(ws, "p1")
        text = first["texts"][0]
        cut = text.index(" ", len(text) // 2)
        await ws.send(generate("p2", 2, COLOUR_PROMPT, params(16, 0.3), prefix=text[:cut]))
        accepted = await recv(ws)
        assert accepted["format"] == "chat"
        second = await run_request(ws, "p2")
    assert not first["errors"] and not second["errors"], (first["errors"], second["errors"])
    assert all(second["texts"].get(i, "").strip() for i in range(2)), second["texts"]
    assert all(f["stats"]["tokens"] >= 2 for f in second["finishes"].values()), second["finishes"]
    if real.kind != "sglang":
        return
    before = first["finishes"][0]["engine"]
    after = [f["engine"] for f in second["finishes"].values()]
    assert all(e["prompt_tokens"] > before["prompt_tokens"] + 3 for e in after), (before, after)
    assert all(e["cached_tokens"] > before["prompt_tokens"] for e in after), (before, after)
    view = RunView("p2", 0.0)
    view.apply({**accepted, "id": "p2"}, 0.0)
    for frame in second["finishes"].values():
        view.apply(frame, 0.0)
    assert "reused from the engine's cache" in prefix_cache_line(view)


async def test_stop_one_sample(backend: tuple[BackendServer, RealServer]) -> None:
    """Stopping sample 1 ends it as abort while 0 and 2 keep streaming; then the rest is cancelled.

    Every sample may run to LONG tokens (at 48 tokens vLLM on a fast CPU once finished
    sample 1 first, as `length`).
    """
    server, real = backend
    await stop_one_then_the_rest(server.url, "r2", real)


async def test_cancel_all_aborts_on_the_server(backend: tuple[BackendServer, RealServer]) -> None:
    server, real = backend
    before, generated_before = real.aborted(), real.generated()

    async def cancel_after_some(frame: dict[str, Any], texts: dict[int, str]) -> None:
        if frame["type"] == "chunk" and sum(len(t) for t in texts.values()) > 20 and not sent:
            sent.append(True)
            await ws.send(json.dumps(cancel_frame("r3")))

    sent: list[bool] = []
    async with connect(server.url) as ws:
        await ws.send(generate("r3", 4, LONG_PROMPT, params(LONG)))
        result = await run_request(ws, "r3", cancel_after_some)
    assert {f["reason"] for f in result["finishes"].values()} == {"abort"}
    await assert_stopped_on_server(real, before, generated_before, 4)


@pytest.mark.server_sglang
async def test_cancel_and_stop_before_the_first_chunk_stop_sglang(sglang_server: RealServer) -> None:
    """Cancel sent right after Generate, Cancel once SGLang has the request (its prefill under way),
    and Stop on one sample before any chunk: SGLang's own count (`/v1/loads`) is 0 within 1 s of
    the first Cancel and 5 s of the second (IN_PASS_STOPPED_WITHIN_S), and no sample runs to
    max_tokens."""
    async with serving(sglang_server.make_engine(), Limits(max_tokens_max=4096)) as server:
        await cancel_at_once(server.url, "c1", sglang_server)
        await cancel_at_once(server.url, "c2", sglang_server, reached=True)
        await stop_one_at_once(server.url, "c3")


async def test_client_disconnect_aborts_on_the_server(backend: tuple[BackendServer, RealServer]) -> None:
    server, real = backend
    await disconnect_mid_stream(server, "r4", real)


async def test_engine_error_becomes_error_finishes(backend: tuple[BackendServer, RealServer]) -> None:
    server, _ = backend
    async with connect(server.url) as ws:
        await ws.send(generate("r5", 2, LONG_PROMPT, params(4000)))  # past the 2048-token context
        result = await run_request(ws, "r5")
    assert {f["reason"] for f in result["finishes"].values()} == {"error"}
    said = json.dumps(result["errors"]) + json.dumps(result["finishes"])
    assert re.search(r"context|max_tokens|maximum", said), said


async def test_unreachable_server_is_reported_and_recovers(real_server: RealServer) -> None:
    port = free_port()
    engine = real_server.make_engine(f"http://127.0.0.1:{port}")
    async with serving(engine) as server:
        assert "unreachable" in engine.model and server.health()["server_ok"] is False
        async with connect(server.url) as ws:
            await ws.send(generate("r6", 2, LONG_PROMPT, params(8)))
            result = await run_request(ws, "r6")
        assert {f["reason"] for f in result["finishes"].values()} == {"error"}
        assert result["errors"] and "unreachable" in result["errors"][0]["message"]
        # The server comes back at that address: the engine notices without a restart.
        assert isinstance(engine, HTTPEngine)
        await engine.client.aclose()
        engine.url, engine._client = real_server.url, None  # the next call connects to the new address
        assert await engine.check()
        assert engine.model == SERVED_NAME and server.health()["server_ok"] is True


@pytest.mark.parametrize("key", ["", "wrong-key"])
async def test_a_missing_or_wrong_api_key_is_said_in_the_page(real_server: RealServer, key: str) -> None:
    engine = real_server.make_engine(api_key=key)
    async with serving(engine) as server:
        said = "without an API key" if not key else "refused the API key"
        setting = "SGLANG_API_KEY" if real_server.kind == "sglang" else "OPENAI_API_KEY"
        line, _ = await engine_line_now(server.url)
        assert line.startswith("⚠️") and said in line and setting in line, line
        async with connect(server.url) as ws:
            await ws.send(generate("r7", 2, LONG_PROMPT, params(8)))
            result = await run_request(ws, "r7")
        assert {f["reason"] for f in result["finishes"].values()} == {"error"}
        assert said in result["errors"][0]["message"], result["errors"]


BACKEND_TOKEN = "backend-token-9d1e"
"""The token app.py's backend asks of websocket clients (DASHBOARD_TOKEN): the tests connect too."""

SGLANG_CPU_ENGINE_ARGS = {
    **({} if ON_GPU else {"device": "cpu", "attention_backend": "torch_native"}),
    "max_total_tokens": KV_TOKENS,
    "context_length": 2048,
    "sleep_on_idle": True,
}
"""sglang.Engine's settings for this CPU (on a GPU, without the device's), given to app.py as
SGLANG_ENGINE_ARGS."""


@dataclass
class SGLangApp:
    """`python app.py --engine sglang-engine` run with the SGLang environment's Python."""

    process: subprocess.Popen[bytes]
    url: str
    health_url: str
    log: Path

    @property
    def ws_url(self) -> str:
        """The backend's websocket URL."""
        return self.health_url.replace("http://", "ws://").replace("/health", "/ws")

    def health(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.health_url, timeout=10) as response:
            return json.loads(response.read())

    @property
    def ws_headers(self) -> dict[str, str]:
        """What the backend's websocket asks of a client: app.py's backend token (BACKEND_TOKEN)."""
        return {"Authorization": f"Bearer {BACKEND_TOKEN}"}

    def running(self) -> float:
        """In-process SGLang's own count of the requests its scheduler runs or queues, as the
        backend's /health reports it (read there on the asking: /health is asked twice)."""
        self.health()
        count = self.health().get("sglang_requests")
        assert count is not None, "the backend reports no SGLang load"
        return float(count)

    def generated(self) -> float:
        """In-process SGLang counts no tokens where a test can read them: the finishes say instead."""
        return 0.0

    def wait_page(self) -> None:
        """Return once the page answers; stop the app if it does not."""
        try:
            wait_for_http(self.url, self.process, SERVER_START_S)
        except BaseException:
            stop_process_group(self.process)
            raise

    def session(self) -> list[int]:
        """The live processes of app.py's session."""
        return live_processes(self.process.pid)

    def descendants(self) -> list[tuple[int, str]]:
        """(pid, title) of every live process in app.py's session (its own, started with one)."""
        found = []
        for pid in live_processes(self.process.pid):
            with contextlib.suppress(OSError):
                title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
                found.append((pid, title.strip()))
        return found

    def wait_engine(self, limit_s: float = SERVER_START_S) -> dict[str, Any]:
        """/health once the engine's start has ended, ready or failed."""
        deadline = time.monotonic() + limit_s
        while (health := self.health())["engine_state"] == "starting":
            assert self.process.poll() is None, self.log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "the engine did not settle in time"
            time.sleep(1.0)
        return health


def as_in_a_terminal() -> None:
    """In the child before exec: SIGINT and SIGQUIT as a terminal's foreground job has them. A
    background job of a non-interactive shell (a CI runner's) ignores both, and would pass that on."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def warm_compile_caches() -> dict[str, str]:
    """Where SGLang, FlashInfer, Triton and TorchInductor keep compiled kernels for this user (the
    image's environment moves them to its empty /data): a test that is not about a cold start
    keeps them warm, or every kernel compiles again, minutes on a GPU's first start."""
    home = Path.home()
    return {
        "SGLANG_JIT_CACHE_DIR": str(compile_cache()),
        "FLASHINFER_WORKSPACE_BASE": os.environ.get("FLASHINFER_WORKSPACE_BASE") or str(home),
        "TRITON_CACHE_DIR": os.environ.get("TRITON_CACHE_DIR") or str(home / ".triton" / "cache"),
        "TORCHINDUCTOR_CACHE_DIR": os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        or str(Path(tempfile.gettempdir()) / f"torchinductor_{getpass.getuser()}"),
    }


def launch_sglang_app(
    model: Path | None,
    log: Path,
    engine: str = "sglang-engine",
    env: dict[str, str] | None = None,
    image_data: Path | None = None,
    backend_only: bool = False,
) -> SGLangApp:
    """Start app.py with the SGLang environment's Python (SGLang plus the dashboard's packages);
    call from the main thread (the child is prepared before exec), then `wait_page`. With
    `image_data`: as the GPU Space's image starts it (its entry command and environment, its /data
    there), the engine being the image's. With `backend_only`: `python -m backend` instead, its
    /health standing in for the page."""
    python = SGLANG_PYTHON
    port, backend_port = free_port(), free_port()
    env = {
        **cpu_env(),
        **sglang_device_env(),
        "PYTHONPATH": os.pathsep.join([str(ROOT), *SGLANG_CPU_PATHS]),
        "SGLANG_ENGINE_ARGS": json.dumps(SGLANG_CPU_ENGINE_ARGS),
        "GRADIO_ANALYTICS_ENABLED": "False",
        "DASHBOARD_TOKEN": BACKEND_TOKEN,
        **(image_env(image_data) | warm_compile_caches() if image_data is not None else {}),
        **(env or {}),
    }
    if image_data is not None:
        command = entry_command(str(python))
        env |= {"DASHBOARD_MODEL": str(model), "DASHBOARD_HOST": "127.0.0.1"}
        env |= {"DASHBOARD_PORT": str(port), "DASHBOARD_BACKEND_PORT": str(backend_port)}
        assert env["DASHBOARD_ENGINE"] == engine, env["DASHBOARD_ENGINE"]
    elif backend_only:
        command = [str(python), "-m", "backend", "--engine", engine]
        command += ["--model", str(model)] if model is not None else []
        command += ["--host", "127.0.0.1", "--port", str(backend_port)]
    else:
        command = [str(python), str(ROOT / "app.py"), "--engine", engine]
        command += ["--model", str(model)] if model is not None else []
        command += ["--host", "127.0.0.1", "--port", str(port), "--backend-port", str(backend_port)]
    with log.open("wb") as out:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=as_in_a_terminal,  # called from the main thread only
        )
    health = f"http://127.0.0.1:{backend_port}/health"
    return SGLangApp(process, health if backend_only else f"http://127.0.0.1:{port}/", health, log)


def start_sglang_app(
    model: Path | None, log: Path, engine: str = "sglang-engine", env: dict[str, str] | None = None
) -> SGLangApp:
    """`launch_sglang_app` (without `--model` where `model` is None), then wait for its page."""
    app = launch_sglang_app(model, log, engine, env)
    app.wait_page()
    return app


def live_processes(session: int | None = None, group: int | None = None) -> list[int]:
    """The live (not zombie) processes of session `session` (app.py's, started with its own
    session) or of process group `group`, from /proc."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and (int(fields[3]) == session or int(fields[2]) == group):
            alive.append(int(stat.parent.name))
    return alive


CONTAINER_GRACE_S = 10.0
"""A container platform (a Space, `docker stop`) kills 10 s after SIGTERM: app.py and every process
it started must be gone by then."""

LOST_WITHIN_S = 10.0
"""How soon a dead scheduler's running samples must end."""


def assert_gone_within_grace(process: subprocess.Popen[bytes], left: Any) -> None:
    """SIGTERM to app.py; fail unless `left()` (its processes) is empty within CONTAINER_GRACE_S."""
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    while remaining := left():
        took = time.monotonic() - signalled
        assert took < CONTAINER_GRACE_S, f"still running {took:.1f} s after SIGTERM: {remaining}"
        time.sleep(0.1)
    print(f"every process gone {time.monotonic() - signalled:.1f} s after SIGTERM")


def descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, title) of every live process below `pid`, from /proc."""
    found = []
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    for child in map(int, children):
        with contextlib.suppress(OSError):
            title = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            found.append((child, title.strip()))
        found += descendants(child)
    return found


def stream_then(client: Any, act: Any) -> Any:
    """Start a long two-sample request on the page, run `act()` once both columns stream, and
    return the request's job."""
    job = client.submit(LONG_PROMPT, 2, LONG, 0.8, 0.95, 1, api_name="/generate")
    deadline = time.monotonic() + FRAME_TIMEOUT_S
    while not any(o[0]["samples"] and all(column_texts(o)) for o in job.outputs()):
        assert time.monotonic() < deadline, "the columns did not start streaming"
        time.sleep(0.2)
    act()
    return job


def wait_for_output(job: Any, holds: Any) -> Any:
    """The first of the page's outputs for `job` (newest looked at first) for which `holds(output)`;
    fails after FRAME_TIMEOUT_S."""
    deadline = time.monotonic() + FRAME_TIMEOUT_S
    while True:
        for output in reversed(job.outputs()):
            if output[0]["samples"] and holds(output):
                return output
        assert time.monotonic() < deadline, f"the page never showed it: {job.outputs()[-1:]}"
        time.sleep(0.1)


def column_texts(output: Any) -> list[str]:
    return [sample["text"] for sample in output[0]["samples"]]


def column_statuses(output: Any) -> list[str]:
    return [sample["status"] for sample in output[0]["samples"]]


@pytest.mark.app_serving
def test_app_py_serves_in_process_sglang(tmp_path: Path) -> None:
    """The real entry point with in-process SGLang: chat answers, a raw prompt, an engine error,
    Stop, Cancel, the engine lost mid-run, and a SIGTERM that leaves nothing of app.py's session
    running."""
    from gradio_client import Client

    # Without --model and with the hub off: SGLang loads the bundled model, converted where
    # scripts/prepare-engine-envs.sh put it (MODEL), and the engine line says so.
    offline = {"HF_HUB_OFFLINE": "1", "XDG_CACHE_HOME": str(CACHE.parent)}
    bundled = CACHE.name == "parallel-sampling-dashboard"  # MODEL is where the dashboard looks
    app = start_sglang_app(None if bundled else MODEL, tmp_path / "app.log", env=offline if bundled else None)
    try:
        health = app.wait_engine()
        assert health["engine_state"] == "ready", health
        if bundled:
            line, _ = asyncio.run(engine_line_now(app.ws_url))
            assert f"the bundled SmolLM2-135M-Instruct, converted locally ({MODEL})" in line, line
            assert "the Hugging Face Hub is off (HF_HUB_OFFLINE is set)" in line, line
        client = Client(app.url, verbose=False)
        final = client.predict(
            COLOUR_PROMPT,
            4,
            64,
            0.3,
            0.95,
            1,
            api_name="/generate",
        )
        assert all(answers_colours(text) for text in column_texts(final)), (column_texts(final), final[1])
        assert "Prompt format **chat**" in final[1], final[1]
        experiments = ("cooperative", 20, "n")  # consumer, block_ms, fan-out: the page's defaults
        raw = client.predict(
            "Once upon a time", 2, 16, 0.8, 0.95, 1, *experiments, "raw", "", api_name="/generate"
        )
        assert "Prompt format **raw**" in raw[1], raw[1]
        assert all(len(text.split()) >= 3 for text in column_texts(raw)), column_texts(raw)
        # The prompt and 2048 new tokens overflow the 2048-token context: SGLang's error, in the page.
        over = client.predict(
            "Once upon a time", 2, 2048, 0.8, 0.95, 1, *experiments, "raw", "", api_name="/generate"
        )
        assert column_statuses(over) == ["error"] * 2 and "context" in over[1], over[1]

        job = client.submit(LONG_PROMPT, 3, LONG, 0.8, 0.95, 1, api_name="/generate")
        deadline = time.monotonic() + FRAME_TIMEOUT_S
        while not any(o[0]["samples"] and all(column_texts(o)) for o in job.outputs()):
            assert time.monotonic() < deadline, "the columns did not start streaming"
            time.sleep(0.2)
        client.predict(1, api_name="/stop_sample")
        # Sample 1 shows `stopped` while 0 and 2 still stream (their text grows after it).
        stopped = wait_for_output(job, lambda o: column_statuses(o)[1] == "stopped")
        wait_for_output(
            job, lambda o: all(len(column_texts(o)[i]) > len(column_texts(stopped)[i]) for i in (0, 2))
        )
        cancelled = client.predict(api_name="/cancel")
        assert column_statuses(cancelled) == ["stopped"] * 3, column_statuses(cancelled)
        assert app.health()["running_samples"] == 0
        # Cancel and Stop before the first chunk, through the backend's websocket: SGLang's own count.
        asyncio.run(cancel_at_once(app.ws_url, "c1", app, headers=app.ws_headers))
        asyncio.run(cancel_at_once(app.ws_url, "c2", app, reached=True, headers=app.ws_headers))
        asyncio.run(stop_one_at_once(app.ws_url, "c3", headers=app.ws_headers))

        # Stop when decided (Adaptive-Consistency's Beta rule): the samples still running once the
        # vote is decided stop in SGLang, whose own count of running requests goes to 0.
        job = client.submit(
            WEEK,
            16,
            96,
            0.8,
            0.95,
            33,
            *experiments,
            "chat",
            "",
            "delta",
            0,
            False,
            "",
            "beta",
            api_name="/generate",
        )
        decided = job.result(timeout=FRAME_TIMEOUT_S)
        lines = [o[5] for o in job.outputs() if isinstance(o[5], str)]  # redrawn when a sample finished
        said = next((line for line in lines if "Stopped when decided" in line), lines[-1])
        # 16 samples of a question the model answers alike: the vote is decided with samples running.
        assert "Stopped when decided" in said, said
        stopped = [i for i, status in enumerate(column_statuses(decided)) if status == "stopped"]
        assert stopped and all(
            "stopped by the vote" in decided[0]["samples"][i]["header"] for i in stopped
        ), decided[0]["samples"]
        assert app.running() == 0, "SGLang still runs the samples the vote stopped"
        print(f"stop when decided on SGLang: {said}")

        # SIGTERM while a request streams: app.py and every process of its session gone within 10 s.
        stream_then(client, lambda: assert_gone_within_grace(app.process, app.session))
    finally:
        stop_process_group(app.process)


@pytest.mark.app_serving
def test_in_process_sglangs_scheduler_killed_mid_run_ends_its_samples_with_the_cause(tmp_path: Path) -> None:
    """SGLang's scheduler killed mid-run (as the kernel's OOM killer or a crash would end it):
    SGLang's watchdog signals the backend, whose running request ends at once, each column `error`
    with the cause, and the next request is refused saying why."""
    from gradio_client import Client

    app = start_sglang_app(MODEL, tmp_path / "app.log")
    try:
        assert app.wait_engine()["engine_state"] == "ready"
        client = Client(app.url, verbose=False)
        killed: list[tuple[int, float]] = []

        def kill_scheduler() -> None:
            (scheduler,) = [pid for pid, title in app.descendants() if title.startswith("sglang::scheduler")]
            killed.append((scheduler, time.monotonic()))
            os.kill(scheduler, signal.SIGKILL)

        job = stream_then(client, kill_scheduler)
        lost = job.result(timeout=FRAME_TIMEOUT_S)
        (scheduler, killed_at), ended_at = killed[0], time.monotonic()
        assert ended_at - killed_at < LOST_WITHIN_S, ended_at - killed_at
        assert column_statuses(lost) == ["error"] * 2, column_statuses(lost)
        assert "stopped working" in lost[1], lost[1]
        assert f"(pid {scheduler}) ended, killed by SIGKILL" in lost[1], lost[1]
        assert app.health()["engine_state"] == "lost"
        after = client.predict("Hello", 1, 8, 0.8, 0.95, 1, api_name="/generate")
        assert "stopped working" in after[1] and "killed by SIGKILL" in after[1], after[1]
        line, _ = asyncio.run(engine_line_now(app.ws_url))
        assert "stopped working while serving" in line and "killed by SIGKILL" in line, line
        assert_gone_within_grace(app.process, lambda: live_processes(app.process.pid))
    finally:
        stop_process_group(app.process)


@pytest.mark.app_failing
def test_in_process_sglang_that_cannot_load_says_why(tmp_path: Path) -> None:
    """A model whose weights are missing: the scheduler fails to load; the backend lives on and the
    page says what happened."""
    app = start_sglang_app(weightless_copy(tmp_path / "no-weights"), tmp_path / "app.log")
    try:
        health = app.wait_engine()
        assert health["engine_state"] == "failed" and health["engine_error"], health
        line, _ = asyncio.run(engine_line_now(app.ws_url))
        assert "could not start" in line and "failed and sent SIGQUIT" in line, line
        assert app.process.poll() is None and app.health()["status"] == "ok"
    finally:
        stop_process_group(app.process)


SGLANG_CPU_SERVER_ARGS = " ".join(
    [*SGLANG_DEVICE_FLAGS, f"--max-total-tokens {KV_TOKENS} --context-length 2048"]
)
"""launch_server's flags for this CPU, given to app.py's `--engine auto` as SGLANG_SERVER_ARGS."""
MARK = "DASHBOARD_TEST_RUN"
"""An environment variable every process of one test app inherits, down to SGLang's scheduler."""


@dataclass
class AutoApp:
    """app.py with `--engine auto` taking the GPU path on this CPU: it launches an SGLang server."""

    app: SGLangApp
    mark: str
    server_log: Path

    def processes(self) -> list[tuple[int, int, str]]:
        """(pid, session, command line) of every live process of this app, the server's included."""
        found = []
        needle = f"{MARK}={self.mark}".encode()
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                if needle not in (proc / "environ").read_bytes().split(b"\0"):
                    continue
                fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
                command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if fields[0] != "Z":
                found.append((int(proc.name), int(fields[3]), command))
        return found

    def launched(self) -> list[str]:
        """The launched SGLang server's processes (its own session, not app.py's): command lines."""
        return [command for _, session, command in self.processes() if session != self.app.process.pid]

    def wait_launched(self, limit_s: float = SERVER_START_S) -> None:
        deadline = time.monotonic() + limit_s
        while not any("sglang.launch_server" in command for command in self.launched()):
            assert self.app.process.poll() is None, self.app.log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "app.py did not launch an SGLang server"
            time.sleep(0.5)

    def wait_gone(self, limit_s: float = 60.0) -> None:
        """Every process of the app is gone (after app.py was stopped)."""
        deadline = time.monotonic() + limit_s
        while left := self.processes():
            assert time.monotonic() < deadline, f"still running: {left}"
            time.sleep(0.5)

    def kill(self) -> None:
        stop_process_group(self.app.process)
        for pid, _, _ in self.processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def launched_server(command: str) -> bool:
    """Whether `command` is a launched SGLang server's own (not its keeper's, whose line holds it)."""
    return command.split()[1:3] == ["-m", "sglang.launch_server"]


def launch_auto_app(
    tmp_path: Path,
    name: str,
    model: Path = MODEL,
    as_image: bool = False,
    backend_only: bool = False,
    **env: str,
) -> AutoApp:
    """app.py with `--engine auto` launching SGLang; `as_image`: started as the GPU Space's image
    starts it (`launch_sglang_app`'s `image_data`), its caches (the server's log too) in the image's;
    `backend_only`: `python -m backend` instead of app.py."""
    folder = tmp_path / name
    folder.mkdir()
    mark = f"{name}-{os.getpid()}-{time.monotonic_ns()}"
    cache = folder / "data" / "cache" if as_image else folder / "cache"
    env = {
        **({} if ON_GPU else {"DASHBOARD_ASSUME_CUDA": "1"}),  # on this CPU: the GPU path without a GPU
        "SGLANG_SERVER_ARGS": SGLANG_CPU_SERVER_ARGS,
        **({} if as_image else {"XDG_CACHE_HOME": str(cache)}),  # the launched server's log lands under it
        MARK: mark,
        **env,
    }
    app = launch_sglang_app(
        model,
        folder / "app.log",
        engine="auto",
        env=env,
        image_data=folder / "data" if as_image else None,
        backend_only=backend_only,
    )
    return AutoApp(app, mark, cache / "parallel-sampling-dashboard" / "sglang-server.log")


def weightless_copy(folder: Path) -> Path:
    """The test model without its weights: SGLang's scheduler fails to load it."""
    folder.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((MODEL / name).read_bytes())
    return folder


@pytest.mark.app_serving
def test_auto_launches_sglang_serves_and_sigterm_leaves_nothing(tmp_path: Path) -> None:
    """`--engine auto` on the GPU path, started as the GPU Space's image starts app.py (its entry
    command and environment): it starts the SGLang server itself (incremental streaming, its output
    kept in a log), the page answers through it, and SIGTERM to app.py ends every process."""
    from gradio_client import Client

    auto = launch_auto_app(tmp_path, "served", as_image=True)
    try:
        auto.app.wait_page()
        health = auto.app.wait_engine()
        assert health["engine_state"] == "ready", health
        (server,) = [c for c in auto.launched() if launched_server(c)]
        assert "--incremental-streaming-output" in server and SGLANG_CPU_SERVER_ARGS in server, server
        assert "--log-level warning" in server and "--sleep-on-idle" in server, server
        final = Client(auto.app.url, verbose=False).predict(
            COLOUR_PROMPT, 4, 64, 0.3, 0.95, 1, api_name="/generate"
        )
        assert all(answers_colours(text) for text in column_texts(final)), (column_texts(final), final[1])
        port = server.split("--port ", 1)[1].split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=10) as response:
            assert json.loads(response.read())["incremental_streaming_output"] is True
        assert "POST /generate" not in auto.server_log.read_text(errors="replace")  # no access log
        # SIGTERM while a request streams: app.py, its backend and the server gone within 10 s.
        client = Client(auto.app.url, verbose=False)
        stream_then(client, lambda: assert_gone_within_grace(auto.app.process, auto.processes))
    finally:
        auto.kill()


@pytest.mark.app_failing
def test_auto_launch_stopped_during_start_up_too_slow_or_broken_leaves_no_server(tmp_path: Path) -> None:
    """Four app.py starts at once, each launching an SGLang server: SIGTERM during the server's start,
    Ctrl-C (SIGINT to the terminal's process group) during it, a start slower than
    SGLANG_START_TIMEOUT, and a model that cannot load. None leaves an SGLang process behind; the
    last two keep the page up and say why, quoting the server's log."""
    broken = weightless_copy(tmp_path / "no-weights")
    starts = {
        "sigterm": {},
        "ctrl-c": {},
        "too-slow": {"SGLANG_START_TIMEOUT": "8"},
        "broken": {},
    }
    apps = {
        name: launch_auto_app(tmp_path, name, broken if name == "broken" else MODEL, **env)
        for name, env in starts.items()
    }
    try:
        for auto in apps.values():
            auto.app.wait_page()
        signalled: dict[str, float] = {}
        for name, signum in (("sigterm", signal.SIGTERM), ("ctrl-c", signal.SIGINT)):
            auto = apps[name]
            auto.wait_launched()
            assert auto.app.health()["engine_state"] == "starting"
            signalled[name] = time.monotonic()
            if signum == signal.SIGINT:
                os.killpg(auto.app.process.pid, signal.SIGINT)
            else:
                auto.app.process.send_signal(signal.SIGTERM)
        for name in ("sigterm", "ctrl-c"):
            while left := apps[name].processes():
                took = time.monotonic() - signalled[name]
                assert took < CONTAINER_GRACE_S, (
                    f"{name}: still running {took:.1f} s after the signal: {left}"
                )
                time.sleep(0.1)
        for name, said in (("too-slow", "did not answer /health within 8 s"), ("broken", "exited with")):
            auto = apps[name]
            health = auto.app.wait_engine()
            assert health["engine_state"] == "failed" and said in health["engine_error"], health
            assert f"the end of its output ({auto.server_log})" in health["engine_error"], health
            assert auto.server_log.exists()  # 8 s under this load may pass before its first line
            if name == "broken":
                assert "Error" in auto.server_log.read_text(errors="replace")
            deadline = time.monotonic() + 30
            while left := auto.launched():
                assert time.monotonic() < deadline, f"{name}: the server outlived its failed start: {left}"
                time.sleep(0.5)
            assert auto.app.process.poll() is None and auto.app.health()["status"] == "ok"
            line, _ = asyncio.run(engine_line_now(auto.app.ws_url))
            assert "could not start" in line and said in line, line
    finally:
        for auto in apps.values():
            auto.kill()


KILLED_GONE_S = 5.0
"""How soon after app.py or the backend is killed outright every process they started must be gone."""


@pytest.mark.app_failing
def test_sglang_killed_outright_with_its_dashboard_leaves_nothing(tmp_path: Path) -> None:
    """SIGKILL, as the out-of-memory killer sends it, to app.py and to `python -m backend` with
    `--engine auto` launching the real SGLang server (its scheduler and detokenizer with it), and to
    app.py with SGLang in process: within KILLED_GONE_S nothing of theirs runs, counted by the mark in
    their environment, by app.py's session, and by the process groups recorded at the launch."""
    autos = {
        "app.py, auto": launch_auto_app(tmp_path, "killed-app"),
        "python -m backend, auto": launch_auto_app(tmp_path, "killed-backend", backend_only=True),
    }
    in_process = launch_sglang_app(MODEL, tmp_path / "in-process.log")
    try:
        for auto in autos.values():
            auto.app.wait_page()
            assert auto.app.wait_engine()["engine_state"] == "ready"
        in_process.wait_page()
        assert in_process.wait_engine()["engine_state"] == "ready"
        kills: list[tuple[str, subprocess.Popen[bytes], Callable[[], list[Any]]]] = [
            (name, auto.app.process, auto.processes) for name, auto in autos.items()
        ]
        kills.append(("app.py, SGLang in process", in_process.process, in_process.session))
        for name, process, left_by_mark in kills:
            folder = {"app.py, auto": "killed-app", "python -m backend, auto": "killed-backend"}.get(name)
            records = "cache/parallel-sampling-dashboard/launched/*.json"
            launches = tmp_path.glob(f"{folder}/{records}") if folder else []
            groups = [process.pid] + [json.loads(path.read_text())["pid"] for path in launches]
            if "auto" in name:
                assert len(groups) == 2, (name, groups)
            before = left_by_mark() + [pid for pgid in groups for pid in live_processes(group=pgid)]
            assert len(before) >= 3, (name, before)  # the process, and what it started
            killed = time.monotonic()
            process.kill()
            process.wait()
            while left := left_by_mark() + [pid for pgid in groups for pid in live_processes(group=pgid)]:
                took = time.monotonic() - killed
                assert took < KILLED_GONE_S, f"{name}: still running {took:.1f} s after SIGKILL: {left}"
                time.sleep(0.05)
            print(f"{name} killed: every process gone {time.monotonic() - killed:.1f} s after SIGKILL")
    finally:
        for auto in autos.values():
            auto.kill()
        stop_process_group(in_process.process)


@pytest.mark.app_failing
def test_a_launched_servers_scheduler_killed_mid_run_ends_its_samples_with_the_cause(tmp_path: Path) -> None:
    """`--engine auto` with its SGLang server: the server's scheduler killed while two samples
    stream. SGLang's watchdog ends the server; each column ends `error` within seconds, saying the
    server exited and quoting its log; the next request and the page's line say so too."""
    from gradio_client import Client

    auto = launch_auto_app(tmp_path, "scheduler-killed")
    try:
        auto.app.wait_page()
        assert auto.app.wait_engine()["engine_state"] == "ready"
        client = Client(auto.app.url, verbose=False)
        job = client.submit(LONG_PROMPT, 2, LONG, 0.8, 0.95, 1, api_name="/generate")
        deadline = time.monotonic() + FRAME_TIMEOUT_S
        while not any(o[0]["samples"] and all(column_texts(o)) for o in job.outputs()):
            assert time.monotonic() < deadline, "the columns did not start streaming"
            time.sleep(0.2)
        # setproctitle rewrites the scheduler's environment area too: found as the server's child.
        (server,) = [pid for pid, _, command in auto.processes() if launched_server(command)]
        (scheduler,) = [pid for pid, title in descendants(server) if title.startswith("sglang::scheduler")]
        killed_at = time.monotonic()
        os.kill(scheduler, signal.SIGKILL)
        lost = job.result(timeout=FRAME_TIMEOUT_S)
        assert time.monotonic() - killed_at < LOST_WITHIN_S, time.monotonic() - killed_at
        assert column_statuses(lost) == ["error"] * 2, column_statuses(lost)
        assert "the SGLang server it started exited" in lost[1], lost[1]
        after = client.predict("Hello", 1, 8, 0.8, 0.95, 1, api_name="/generate")
        assert "stopped working" in after[1] and "the SGLang server it started exited" in after[1], after[1]
        line, _ = asyncio.run(engine_line_now(auto.app.ws_url))
        assert "stopped working while serving: the SGLang server it started exited" in line, line
        assert "scheduler" in line, line  # SGLang's own line about its dead scheduler, from the log
        assert_gone_within_grace(auto.app.process, auto.processes)
    finally:
        auto.kill()


@dataclass
class Router:
    """SGLang's router (`sglang-router`) in front of the two test workers, round robin."""

    url: str
    workers: list[RealServer]
    processes: list[SGLangServerProcess]

    def listed(self) -> list[dict[str, Any]]:
        request = urllib.request.Request(
            self.url + "/workers", headers={"Authorization": f"Bearer {API_KEY}"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())["workers"]


class Workers:
    """The workers' /metrics summed, read as one server's (for `assert_stopped_on_server`)."""

    aborted_metric = "sglang:num_aborted_requests_total"

    def __init__(self, workers: list[RealServer]) -> None:
        self.each = workers

    def running(self) -> float:
        """Both workers' counts, asked at once: a reading takes no longer than one worker's."""
        with ThreadPoolExecutor(len(self.each)) as pool:
            return sum(pool.map(RealServer.running, self.each))

    def aborted(self) -> float:
        return sum(worker.aborted() for worker in self.each)

    def generated(self) -> float:
        return sum(worker.generated() for worker in self.each)


@pytest.fixture(scope="module")
def sglang_router(sglang_workers: list[SGLangServerProcess]) -> Iterator[Router]:
    python = SGLANG_PYTHON
    port = free_port()
    command = [
        str(python), "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
        "--worker-urls", *(worker.url for worker in sglang_workers), "--policy", "round_robin",
        "--api-key", API_KEY, "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
        "--log-level", "warn",
    ]  # fmt: skip
    with open(CACHE / "sglang-router-test.log", "ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    router = Router(
        f"http://127.0.0.1:{port}", [sglang_real_server(w.url) for w in sglang_workers], sglang_workers
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, (CACHE / "sglang-router-test.log").read_text()[-3000:]
            with contextlib.suppress(OSError, ValueError, KeyError):
                if sum(bool(w.get("is_healthy")) for w in router.listed()) == len(sglang_workers):
                    break
            assert time.monotonic() < deadline, "the router did not list both workers as healthy"
            time.sleep(0.5)
        yield router
    finally:
        stop_process_group(process)


@pytest.fixture
async def router_backend(sglang_router: Router) -> AsyncIterator[BackendServer]:
    async with serving(
        SGLangEngine(sglang_router.url, api_key=API_KEY), Limits(max_tokens_max=4096)
    ) as server:
        yield server


@pytest.mark.server_sglang
async def test_router_answers_and_stop_cancel_and_disconnect_reach_the_workers(
    router_backend: BackendServer, sglang_router: Router
) -> None:
    """Through the router: n=4 chat answers; Stop on one sample, Cancel and a closed connection
    each stop the samples on the worker that runs them, read in the workers' own /metrics."""
    server, workers = router_backend, Workers(sglang_router.workers)
    assert sorted(server.health()["router_workers"]) == sorted(w.url for w in sglang_router.workers)
    line, _ = await engine_line_now(server.url)
    assert "through a router to 2 workers" in line and SERVED_NAME in line, line
    async with connect(server.url) as ws:
        await ws.send(generate("q1", 4, COLOUR_PROMPT, params(64, 0.3)))
        accepted = await recv(ws)
        assert accepted["format"] == "chat", accepted
        result = await run_request(ws, "q1")
    assert all(answers_colours(result["texts"].get(i, "")) for i in range(4)), result["texts"]
    assert {f["reason"] for f in result["finishes"].values()} <= {"stop", "length"} and not result["errors"]

    # Stop sample 1, then Cancel the rest: the router answers /abort_request with 404, so the
    # engine sends each abort to every worker; the one running the sample counts it.
    await stop_one_then_the_rest(server.url, "q2", workers)
    await disconnect_mid_stream(server, "q3", workers)
    # Cancel right after Generate: the router passes the closed stream on to the worker.
    await cancel_at_once(server.url, "q4", workers, within=ROUTER_STOPPED_WITHIN_S)
    await cancel_at_once(server.url, "q5", workers, reached=True)
    await stop_one_at_once(server.url, "q6")


@pytest.mark.server_sglang
async def test_router_spreads_fanned_out_samples_over_both_workers(
    router_backend: BackendServer, sglang_router: Router
) -> None:
    requests_before = [metrics(w.url).get("sglang:num_requests_total", 0.0) for w in sglang_router.workers]
    async with connect(router_backend.url) as ws:
        await ws.send(generate("f1", 4, COLOUR_PROMPT, params(64, 0.3), fanout="requests"))
        result = await run_request(ws, "f1")
    assert all(answers_colours(result["texts"].get(i, "")) for i in range(4)), result["texts"]
    counted = [
        metrics(w.url).get("sglang:num_requests_total", 0.0) - before
        for w, before in zip(sglang_router.workers, requests_before, strict=True)
    ]
    assert all(count >= 1 for count in counted) and sum(counted) >= 4, counted


@pytest.mark.server_sglang
async def test_two_backends_share_one_router(sglang_router: Router) -> None:
    seen: dict[str, dict[str, float]] = {}

    async def one(backend: BackendServer, rid: str) -> dict[str, Any]:
        times = seen.setdefault(rid, {})

        async def on_frame(frame: dict[str, Any], texts: dict[int, str]) -> None:
            if frame["type"] == "chunk":
                times.setdefault("first_chunk", time.monotonic())

        async with connect(backend.url) as ws:
            await ws.send(generate(rid, 2, COLOUR_PROMPT, params(64, 0.3)))
            result = await run_request(ws, rid, on_frame)
        times["done"] = time.monotonic()
        return result

    async with (
        serving(SGLangEngine(sglang_router.url, api_key=API_KEY)) as first,
        serving(SGLangEngine(sglang_router.url, api_key=API_KEY)) as second,
    ):
        results = await asyncio.gather(one(first, "s1"), one(second, "s2"))
    for result in results:
        assert all(answers_colours(result["texts"].get(i, "")) for i in range(2)), result["texts"]
        assert not result["errors"]
    assert seen["s1"]["first_chunk"] < seen["s2"]["done"] and seen["s2"]["first_chunk"] < seen["s1"]["done"]


@pytest.mark.server_sglang
async def test_a_worker_killed_mid_run_ends_its_samples_and_the_other_serves_on(
    router_backend: BackendServer, sglang_router: Router
) -> None:
    """Runs last of the router tests: it kills the second worker."""
    from ui.view import RunView, status_markdown

    first, second = sglang_router.workers
    view = RunView("k1", time.monotonic())
    killed: list[bool] = []

    async def on_frame(frame: dict[str, Any], texts: dict[int, str]) -> None:
        view.apply(frame, time.monotonic())
        if not killed and len(texts) == 4 and first.running() > 0 and second.running() > 0:
            killed.append(True)
            os.killpg(sglang_router.processes[1].process.pid, signal.SIGKILL)  # type: ignore[union-attr]

    async with connect(router_backend.url) as ws:
        await ws.send(generate("k1", 4, LONG_PROMPT, params(160), fanout="requests"))
        result = await run_request(ws, "k1", on_frame)
        view.apply(result["done"], time.monotonic())
        assert killed, "the samples did not run on both workers at once"
        reasons = sorted(f["reason"] for f in result["finishes"].values())
        assert reasons.count("error") >= 1 and set(reasons) - {"error"} <= {"stop", "length"}, reasons
        assert len(reasons) - reasons.count("error") >= 1, reasons
        errors = [f["engine"]["error"] for f in result["finishes"].values() if f["reason"] == "error"]
        assert all("SGLang at" in error for error in errors), errors
        assert "**Error:**" in status_markdown(view) and errors[0] in status_markdown(view)
        # The next Generate runs on the worker that is left.
        await ws.send(generate("k2", 2, COLOUR_PROMPT, params(64, 0.3)))
        after = await run_request(ws, "k2")
    assert {f["reason"] for f in after["finishes"].values()} <= {"stop", "length"}, after
    assert all(answers_colours(after["texts"].get(i, "")) for i in range(2)), after["texts"]


@pytest.mark.app_failing
@pytest.mark.skipif(ON_GPU, reason="make gpu-check runs the smoke tier itself, before these tests")
def test_the_gpu_checks_smoke_tier_answers_on_sglangs_cpu_build(tmp_path: Path) -> None:
    """`python -m scripts.gpu_smoke` as `make gpu-check` runs it, with SGLang's CPU build and flags:
    both engines come up and every sample of each answers, its tokens/s printed."""
    env = {
        **cpu_env(),
        **sglang_device_env(),
        "DASHBOARD_ASSUME_CUDA": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), *SGLANG_CPU_PATHS]),
        "SGLANG_SERVER_ARGS": SGLANG_CPU_SERVER_ARGS,
        "SGLANG_ENGINE_ARGS": json.dumps(SGLANG_CPU_ENGINE_ARGS),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    command = [str(SGLANG_PYTHON), "-m", "scripts.gpu_smoke", "--model", str(MODEL), "--max-tokens", "32"]
    command += ["--logs", str(tmp_path / "logs")]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert said.rstrip().splitlines()[-1] == "smoke passed: auto answered, sglang-engine answered", said
    samples = re.findall(r"sample (\d) \[(stop|length)\] (\d+) tokens, ([\d.]+) tok/s: (.+)$", said, re.M)
    assert [index for index, *_ in samples] == ["0", "1", "2", "3"] * 2, said
    for _, _, tokens, rate, text in samples:
        assert int(tokens) > 0 and float(rate) > 0 and len(text) > 2, said
