"""The embedder helpers and the public names of ``herd.rag.embedders``."""

from __future__ import annotations

import numpy as np
import pytest

import herd.rag.embedders
from herd.rag.embedders.base import l2_normalize, make_id


def test_make_id_is_sorted_and_escaped() -> None:
    a = make_id("onnx", "m", {"b": 1, "a": "x;y", "flag": True})
    assert a == "onnx:m;a=x%3By;b=1;flag=true"
    assert make_id("onnx", "m", {"flag": True, "b": 1, "a": "x;y"}) == a
    with pytest.raises(ValueError, match="may not contain"):
        make_id("onnx", "bad;name", {})


def test_l2_normalize_leaves_zero_rows_at_zero() -> None:
    out = l2_normalize(np.array([[3.0, 4.0], [0.0, 0.0]]))
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, [[0.6, 0.8], [0.0, 0.0]])


def test_public_names() -> None:
    for name in herd.rag.embedders.__all__:
        assert getattr(herd.rag.embedders, name) is not None


def test_sentence_transformers_is_optional() -> None:
    """Importing herd never imports PyTorch; the embedder says what to install."""
    import subprocess
    import sys

    code = (
        "import sys, herd.rag.embedders;"
        "assert 'torch' not in sys.modules and 'sentence_transformers' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
