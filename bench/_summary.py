"""The ``--summary PATH`` file every bench script can write, read by ``bench/report.py``.

    {"bench": name, "peer": "Procrastinate, arq", "rows": [{"metric": str, "herd": float,
     "peer": float, "unit": str, "ratio": herd / peer, "better": "lower" | "higher"}],
     "notes": [str], "seconds": float (optional: the script's wall time)}

``ratio`` is always herd / peer; ``better`` says which way is good, so a row with
``better: "lower"`` and ``ratio`` 0.2 means herd needs a fifth of the peer's value.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def row(metric: str, herd: float, peer: float, unit: str, better: str) -> dict[str, Any]:
    if better not in ("lower", "higher"):
        raise ValueError("better is 'lower' or 'higher'")
    return {
        "metric": metric,
        "herd": float(herd),
        "peer": float(peer),
        "unit": unit,
        "ratio": float(herd) / float(peer) if peer else None,
        "better": better,
    }


def write(
    path: Path | str | None,
    bench: str,
    peer: str,
    rows: list[dict[str, Any]],
    notes: list[str] | None = None,
    seconds: float | None = None,
) -> None:
    """Write the summary (nothing when no ``--summary`` was given)."""
    if path is None:
        return
    data: dict[str, Any] = {"bench": bench, "peer": peer, "rows": rows, "notes": list(notes or [])}
    if seconds is not None:
        data["seconds"] = float(seconds)
    Path(path).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
