"""``HERD_EMBED_DEVICE``: where ONNX embedders run, ``auto`` (default), ``cpu`` or ``cuda``.

``auto`` takes the GPU when ONNX Runtime offers one (the ``onnxruntime-gpu`` build,
``pip install 'herd[gpu]'``) and the CPU otherwise; ``cuda`` insists on the GPU and
refuses to start without it; ``cpu`` never tries. On a GPU, TensorRT runs first when
that provider is present (its engines cached under ``HERD_HOME/models/tensorrt``, fp32
so its vectors stay those of the CPU within float error), then CUDA, then the CPU for
any operator the GPU providers lack.

A GPU that was asked for but did not come (an ``onnxruntime-gpu`` that the CPU build
of ``onnxruntime`` shadows, CUDA libraries missing) is never taken quietly: ``cuda``
raises, ``auto`` logs an error and issues a :class:`~herd.errors.FallbackWarning`.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnxruntime as ort  # type: ignore[import-untyped]

from herd.errors import ConfigError, FallbackWarning
from herd.rag.embedders.base import EmbedError

log = logging.getLogger("herd.rag")

ENV = "HERD_EMBED_DEVICE"
DEVICES = ("auto", "cpu", "cuda")
CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"
GPU_BATCH = 64
"""Texts per run on a GPU: enough to fill it for sentence-sized texts, little padding."""

Provider = str | tuple[str, dict[str, Any]]


@dataclass(frozen=True)
class Placement:
    """The device asked for, and the ONNX Runtime providers that give it, in order."""

    device: str  # "cpu" or "cuda": what was resolved, not what was asked
    requested: str  # "auto", "cpu" or "cuda"
    providers: tuple[Provider, ...]

    @property
    def gpu(self) -> bool:
        return self.device == "cuda"


def requested(device: str | None = None) -> str:
    """The device a caller asked for: the argument, else ``HERD_EMBED_DEVICE``, else auto."""
    chosen = (device if device is not None else os.environ.get(ENV, "")).strip().lower()
    if not chosen:
        return "auto"
    if chosen not in DEVICES:
        raise ConfigError(f"{ENV}: {chosen!r} is not one of {', '.join(DEVICES)}")
    return chosen


def place(device: str | None = None, *, cache_dir: Path | None = None) -> Placement:
    """Resolve ``device`` against the providers this ONNX Runtime build offers."""
    asked = requested(device)
    available = set(ort.get_available_providers())
    if asked == "cpu" or (asked == "auto" and CUDA not in available):
        if asked == "auto" and _gpu_build_installed():
            _fallback(
                f"onnxruntime-gpu is installed but ONNX Runtime offers no {CUDA}"
                f" ({', '.join(sorted(available))}): {_shadowed_hint()}"
            )
        return Placement("cpu", asked, (CPU,))
    if CUDA not in available:
        raise ConfigError(
            f"{ENV}=cuda, but this ONNX Runtime has no {CUDA}"
            f" (it offers {', '.join(sorted(available))}): pip install 'herd[gpu]'"
            + (f"; {_shadowed_hint()}" if _gpu_build_installed() else "")
        )
    providers: list[Provider] = []
    if TENSORRT in available:
        options: dict[str, Any] = {"trt_fp16_enable": False, "trt_engine_cache_enable": True}
        if cache_dir is not None:
            options["trt_engine_cache_path"] = str(cache_dir / "tensorrt")
        providers.append((TENSORRT, options))
    providers += [CUDA, CPU]
    return Placement("cuda", asked, tuple(providers))


def check_session(session: Any, placement: Placement, model: Path) -> None:
    """Refuse (``cuda``) or loudly report (``auto``) a session that fell back to the CPU.

    ONNX Runtime drops a provider it cannot start (no driver, a missing libcudnn) with
    only a log line of its own, and the embedder would then run many times slower.
    """
    if not placement.gpu:
        return
    active = list(session.get_providers())
    if active and active[0] in (CUDA, TENSORRT):
        return
    message = (
        f"{model}: ONNX Runtime could not start the GPU (active providers:"
        f" {', '.join(active) or 'none'}); check the CUDA and cuDNN libraries"
        " that onnxruntime-gpu needs"
    )
    if placement.requested == "cuda":
        raise EmbedError(message)
    _fallback(message + "; running on the CPU instead")


def _fallback(message: str) -> None:
    log.error("%s", message)
    warnings.warn(message, FallbackWarning, stacklevel=3)


def _gpu_build_installed() -> bool:
    try:
        importlib.metadata.distribution("onnxruntime-gpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _shadowed_hint() -> str:
    # Both wheels install the same `onnxruntime` package; whichever came last wins.
    return (
        "the CPU build `onnxruntime` shadows it when installed after it: pip uninstall -y"
        " onnxruntime && pip install --force-reinstall --no-deps onnxruntime-gpu"
    )
