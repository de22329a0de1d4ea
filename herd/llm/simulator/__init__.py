"""Deprecated alias of ``herd.testing.simulator``, kept for one release.

The simulator is test infrastructure and moved to ``herd.testing``; code written
against the old path (``from herd.llm.simulator import Simulator``,
``herd.llm.simulator.content``) goes on working, with a DeprecationWarning.
"""

import sys
import warnings

from herd.testing.simulator import (
    SimConfig,
    SimState,
    Simulator,
    batches,
    config,
    content,
    exchange,
    limits,
    promptcache,
    server,
    state,
    wire,
)

warnings.warn(
    "herd.llm.simulator moved to herd.testing.simulator; the old name goes in the next release",
    DeprecationWarning,
    stacklevel=2,
)

# `import herd.llm.simulator.content` finds the module under its old dotted name too.
for _module in (batches, config, content, exchange, limits, promptcache, server, state, wire):
    sys.modules[f"{__name__}.{_module.__name__.rpartition('.')[2]}"] = _module

__all__ = ["SimConfig", "SimState", "Simulator"]
