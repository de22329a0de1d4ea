"""Where ONNX embedders run: the device's choice, its refusals and fallbacks, on the CPU.

These run on machines without a GPU: they check what is chosen from the providers this
ONNX Runtime build offers, that a GPU which was asked for and did not come is never
taken quietly, and that an index built on one kind of machine is served by the same
model on the other (bench/embed_throughput.py --device cuda measures a real GPU).
"""

from __future__ import annotations

import logging
from pathlib import Path

import onnxruntime as ort
import pytest

from herd.errors import ConfigError, FallbackWarning
from herd.rag.embedders import device as devices
from herd.rag.embedders.base import EmbedError
from herd.rag.embedders.onnx import (
    OnnxEmbedder,
    minilm_embedder,
    minilm_files,
    minilm_like,
)
from herd.rag.embedders.spec import MINILM
from herd.rag.ingest import RagRuntime

GPU_HERE = devices.CUDA in ort.get_available_providers()
needs_no_gpu = pytest.mark.skipif(GPU_HERE, reason="this ONNX Runtime offers CUDA")


@needs_no_gpu
def test_auto_takes_the_cpu_where_onnx_runtime_offers_no_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(devices.ENV, raising=False)
    placement = devices.place()
    assert (placement.device, placement.requested) == ("cpu", "auto")
    assert placement.providers == (devices.CPU,)
    assert devices.place("cpu").providers == (devices.CPU,)


@needs_no_gpu
def test_cuda_without_a_gpu_build_is_refused_with_the_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(devices.ENV, "cuda")
    with pytest.raises(ConfigError, match=r"HERD_EMBED_DEVICE=cuda.*pip install 'herd\[gpu\]'"):
        devices.place()
    with pytest.raises(ConfigError, match="HERD_EMBED_DEVICE=cuda"):
        minilm_embedder(fast=False)


def test_an_unknown_device_names_the_variable_and_the_choices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(devices.ENV, "tpu")
    with pytest.raises(ConfigError, match=r"HERD_EMBED_DEVICE: 'tpu' is not one of auto, cpu"):
        devices.place()
    monkeypatch.setenv(devices.ENV, " CPU ")
    assert devices.place().device == "cpu"


def _cpu_session() -> object:
    model, _ = minilm_files()
    return ort.InferenceSession(str(model), providers=[devices.CPU])


def test_a_gpu_asked_for_that_did_not_start_is_refused_or_loudly_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """ONNX Runtime drops a GPU provider it cannot start with only its own log line."""
    session, model = _cpu_session(), Path("model.onnx")
    insisted = devices.Placement("cuda", "cuda", (devices.CUDA, devices.CPU))
    with pytest.raises(EmbedError, match="could not start the GPU"):
        devices.check_session(session, insisted, model)
    automatic = devices.Placement("cuda", "auto", (devices.CUDA, devices.CPU))
    with caplog.at_level(logging.ERROR, "herd.rag"), pytest.warns(FallbackWarning, match="CPU"):
        devices.check_session(session, automatic, model)
    assert "could not start the GPU" in caplog.text
    devices.check_session(session, devices.place("cpu"), model)  # the CPU asked for: quiet


def test_on_a_gpu_a_batch_invariant_model_runs_in_large_batches_one_at_a_time() -> None:
    model, tokenizer = minilm_files()
    # A GPU placement whose provider list is the CPU's: what a machine with a broken
    # CUDA would give. The embedder still plans for the GPU it was given, and says so.
    gpu = devices.Placement("cuda", "auto", (devices.CPU,))
    with pytest.warns(FallbackWarning):
        on_gpu = OnnxEmbedder(model, tokenizer, name="m", workers=4, device=gpu)
    on_cpu = OnnxEmbedder(model, tokenizer, name="m", workers=4, device="cpu")
    assert (on_gpu.batch_size, on_gpu.workers) == (devices.GPU_BATCH, 1)
    assert (on_cpu.batch_size, on_cpu.workers) == (32, 4)
    assert on_gpu.id == on_cpu.id  # the device does not change the vectors
    texts = ["In the beginning God created the heaven and the earth.", "Jesus wept.", "a"]
    assert abs(on_gpu.embed(texts) - on_cpu.embed(texts)).max() < 1e-5
    with pytest.warns(FallbackWarning):
        variant = OnnxEmbedder(model, tokenizer, name="m", batch_invariant=False, device=gpu)
    assert variant.batch_size == 32  # its id records the batch size, which stays


def test_the_default_model_a_generation_was_built_with_is_found_on_any_machine(
    herd_home: Path,
) -> None:
    fast = minilm_embedder(herd_home)
    shipped = minilm_embedder(herd_home, fast=False)
    assert fast.id != shipped.id
    assert minilm_like(shipped.id, herd_home).id == shipped.id
    assert minilm_like("onnx:someone-else", herd_home).id == fast.id


async def test_the_runtime_serves_a_generation_with_its_own_default_model(
    herd_home: Path,
) -> None:
    """An index built on a GPU (the shipped file) queried on a CPU machine."""
    cpu = RagRuntime(None, None, lambda: minilm_embedder(herd_home), herd_home)  # type: ignore[arg-type]
    fast = await cpu.embedder_for(MINILM)
    shipped_id = minilm_embedder(herd_home, fast=False).id
    assert fast.id != shipped_id
    assert (await cpu.embedder_for(MINILM, shipped_id)).id == shipped_id
    assert (await cpu.embedder_for(MINILM, fast.id)) is fast
    assert (await cpu.embedder_for(MINILM, None)) is fast
