"""An ONNX sentence-embedding model from a folder (the ``onnx:`` and ``hf:`` kinds).

A folder holds ``model.onnx`` (or ``onnx/model.onnx``), ``tokenizer.json`` and its
configuration: ``herd-embedder.json`` (``pooling`` mean|cls, ``normalize``,
``prefix``/``passage_prefix``, ``query_prefix``, ``max_length``, ``name``) or, when
that is absent, the sentence-transformers files next to the model
(``1_Pooling/config.json``, ``modules.json``'s Normalize, the ``prompts`` of
``config_sentence_transformers.json``, ``sentence_bert_config.json``'s
``max_seq_length``). A Hugging Face model is its snapshot folder, downloaded once
into the Hugging Face cache where the network allows, else found there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from herd.errors import InvalidInput
from herd.rag.embedders.base import ModelUnavailable
from herd.rag.embedders.onnx import MODEL_MAX_LENGTH, POOLINGS, OnnxEmbedder

CONFIG_FILE = "herd-embedder.json"
_MODEL_FILES = ("model.onnx", "onnx/model.onnx")
_HF_FILES = [
    "*.json",
    "onnx/model.onnx",
    "model.onnx",
    "1_Pooling/*",
]


def folder_embedder(folder: Path, **options: Any) -> OnnxEmbedder:
    """An ONNX sentence-embedding model from its folder (see the module's docstring)."""
    model = next((folder / m for m in _MODEL_FILES if (folder / m).is_file()), None)
    tokenizer = folder / "tokenizer.json"
    if model is None or not tokenizer.is_file():
        raise ModelUnavailable(
            f"{folder}: an ONNX embedder folder needs model.onnx (or onnx/model.onnx)"
            " and tokenizer.json"
        )
    config = _config(folder)
    max_length = config.get("max_length", 512)
    if not isinstance(max_length, int) or not 1 <= max_length <= MODEL_MAX_LENGTH:
        raise InvalidInput(
            f"{folder / CONFIG_FILE}: max_length must be a whole number from 1 to"
            f" {MODEL_MAX_LENGTH}, not {max_length!r}"
        )
    pooling = config.get("pooling", "mean")
    if pooling not in POOLINGS:
        raise InvalidInput(
            f"{folder}: pooling must be one of {', '.join(POOLINGS)}, not {pooling!r}"
        )
    prefix = config.get("passage_prefix", config.get("prefix", ""))
    query_prefix = config.get("query_prefix", prefix)
    for key, value in (("passage_prefix", prefix), ("query_prefix", query_prefix)):
        if not isinstance(value, str):
            raise InvalidInput(f"{folder}: {key} must be text, not {value!r}")
    return OnnxEmbedder(
        model,
        tokenizer,
        name=str(config.get("name") or folder.name),
        max_length=max_length,
        pooling=pooling,
        normalize=bool(config.get("normalize", True)),
        prefix=prefix,
        query_prefix=query_prefix,
        threads=options.get("threads") or (os.cpu_count() or 1),
    )


def _config(folder: Path) -> dict[str, Any]:
    own = folder / CONFIG_FILE
    if own.is_file():
        data = _json(own)
        known = {"pooling", "normalize", "prefix", "passage_prefix", "query_prefix"}
        unknown = set(data) - known - {"max_length", "name"}
        if unknown:
            raise InvalidInput(f"{own}: unknown keys {', '.join(sorted(unknown))}")
        return data
    # A sentence-transformers export: read what it says about pooling and prompts.
    out: dict[str, Any] = {}
    pooling = folder / "1_Pooling" / "config.json"
    if pooling.is_file():
        out["pooling"] = "cls" if _json(pooling).get("pooling_mode_cls_token") else "mean"
    modules = folder / "modules.json"
    if modules.is_file():
        kinds = [str(m.get("type", "")) for m in _json_list(modules)]
        out["normalize"] = any(k.endswith("Normalize") for k in kinds)
    st = folder / "config_sentence_transformers.json"
    if st.is_file():
        prompts = _json(st).get("prompts") or {}
        if isinstance(prompts, dict):
            if "query" in prompts:
                out["query_prefix"] = prompts["query"]
            passage = prompts.get("passage", prompts.get("document"))
            if passage is not None:
                out["passage_prefix"] = passage
    bert = folder / "sentence_bert_config.json"
    if bert.is_file() and isinstance(_json(bert).get("max_seq_length"), int):
        out["max_length"] = min(_json(bert)["max_seq_length"], MODEL_MAX_LENGTH)
    return out


def _json(path: Path) -> dict[str, Any]:
    data = _load(path)
    if not isinstance(data, dict):
        raise InvalidInput(f"{path}: expected a JSON object")
    return data


def _json_list(path: Path) -> list[dict[str, Any]]:
    data = _load(path)
    if not isinstance(data, list) or not all(isinstance(m, dict) for m in data):
        raise InvalidInput(f"{path}: expected a JSON list of objects")
    return data


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidInput(f"{path}: {exc}") from None


def hf_folder(repo: str) -> Path:
    """The model's snapshot folder: downloaded if the network allows, else from the cache.

    ``HF_HUB_OFFLINE=1`` looks in the cache only; ``HF_HUB_CACHE`` (else HF_HOME's) is
    the cache. Both are read here, on each call, not when huggingface_hub is imported.
    """
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ModelUnavailable(
            f"hf:{repo} needs huggingface_hub: pip install huggingface_hub"
        ) from None
    cache = os.environ.get("HF_HUB_CACHE") or None
    reason = "HF_HUB_OFFLINE is set"
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() not in ("1", "true", "yes", "on"):
        try:
            return Path(snapshot_download(repo, allow_patterns=_HF_FILES, cache_dir=cache))
        except Exception as exc:  # noqa: BLE001 - no network and hub errors alike: try the cache
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    try:
        found = snapshot_download(
            repo, allow_patterns=_HF_FILES, cache_dir=cache, local_files_only=True
        )
    except Exception:  # noqa: BLE001
        raise ModelUnavailable(
            f"hf:{repo}: cannot download it ({reason}), and the Hugging Face cache"
            f" ({cache or 'HF_HOME'}) does not hold it"
        ) from None
    return Path(found)
