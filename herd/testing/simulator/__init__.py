"""A model-provider simulator: a real HTTP server speaking OpenAI's and Anthropic's APIs.

Run it as its own process (the first stdout line is its URL)::

    python -m herd.testing.simulator --port 0 --latency 0.5 --fail-rate 429=0.05

or from Python as a child process with ``SimulatorProcess("--latency", "0.5")``, or
in-process with ``Simulator(SimConfig(...)).start()``. See ``server`` for the
routes, ``batches`` for the Batch APIs (OpenAI Files + Batches, Anthropic Message
Batches), ``wire`` for the two wire formats both answer in, ``config`` and ``state``
for the behaviour and the counters, and ``__main__`` for the flags.
"""

from herd.testing.simulator.config import SimConfig
from herd.testing.simulator.process import SimulatorProcess
from herd.testing.simulator.server import Simulator
from herd.testing.simulator.state import SimState

__all__ = ["SimConfig", "SimState", "Simulator", "SimulatorProcess"]
