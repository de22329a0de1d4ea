"""A model-provider simulator: a real HTTP server speaking OpenAI's and Anthropic's APIs.

Run it as its own process (the first stdout line is its URL)::

    python -m herd.llm.simulator --port 0 --latency 0.5 --fail-rate 429=0.05

or in-process with ``Simulator(SimConfig(...)).start()``. See ``server`` for the
routes, ``batches`` for the Batch APIs (OpenAI Files + Batches, Anthropic Message
Batches) and ``__main__`` for the flags.
"""

from herd.llm.simulator.server import SimConfig, SimState, Simulator

__all__ = ["SimConfig", "SimState", "Simulator"]
