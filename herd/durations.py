"""A span of time as herd prints it, the same in the CLI's status and plans, the
terminal dashboard and the logs (three formatters had three formats)."""

from __future__ import annotations

import math


def duration(seconds: float, *, compact: bool = False) -> str:
    """A span of time as every surface prints it: "45 s", "3 min 05 s", "2 h 05 min";
    ``compact`` where a column's characters are dear (the terminal dashboard): "4.5s",
    "3m 05s", "2.1h", with a sign (a lease past its end is negative)."""
    if compact:
        a = abs(seconds)
        text = (f"{a:.1f}s" if a < 60 else f"{a // 60:.0f}m {a % 60:02.0f}s" if a < 3600
                else f"{a / 3600:.1f}h")  # fmt: skip
        return ("-" if seconds < 0 else "") + text
    # A part of a second left is a second to wait, not none.
    whole = max(0, math.ceil(seconds) if 0 < seconds < 1 else round(seconds))
    if whole < 90:
        return f"{whole} s"
    if whole < 5400:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"
