"""Test infrastructure herd ships on purpose, for its own suite and for yours.

- ``herd.testing.simulator``: a model provider (OpenAI's and Anthropic's wire formats,
  their Batch APIs, rate limits, failures) over real HTTP; ``python -m
  herd.testing.simulator``.
- ``herd.testing.servers``: Redis Stack, a Redis Cluster and PgBouncer, started from
  wheels and Debian packages (needs the ``test`` extra).
- ``herd.testing.fleet``: ``herd worker`` processes to start, kill, freeze and wait on.

Nothing here is imported by ``import herd``; see docs/testing.md.
"""
