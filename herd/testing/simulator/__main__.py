"""``python -m herd.testing.simulator``: serve until SIGINT/SIGTERM; the URL on stdout's first line.

Examples::

    python -m herd.testing.simulator --port 0 --latency 0.5
    python -m herd.testing.simulator --latency 20:90 --fail-rate 429=0.02,500=0.01 --seed 7
    python -m herd.testing.simulator --script 429:2,500,ok --api-key sk-sim
    python -m herd.testing.simulator --rpm 600 --tpm 200000 --latency 0.2:0.5
    python -m herd.testing.simulator --batch-latency 30   # Batch APIs end 30 s after creation

Then point a client at it: ``OpenAICompatible(base_url=URL + "/v1", ...)`` or
``Anthropic(base_url=URL, ...)``; read ``GET URL/_sim/stats`` for the counters.
"""

from __future__ import annotations

import argparse
import signal
import sys
from types import FrameType

from herd.errors import ConfigError
from herd.testing.simulator.config import (
    CONTENT_MODES,
    SimConfig,
    parse_latency,
    parse_outcome,
    parse_rates,
)
from herd.testing.simulator.server import Simulator


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m herd.testing.simulator",
        description="Simulate an OpenAI-compatible and an Anthropic model provider over HTTP.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8099, help="port; 0 picks a free one")
    p.add_argument(
        "--latency", default="0", help="seconds per answer: 0.5, or LOW:HIGH drawn uniformly"
    )
    p.add_argument("--content", choices=CONTENT_MODES, default="schema", help="answer mode")
    p.add_argument("--fixed-text", default="", help="the answer when --content fixed")
    p.add_argument(
        "--fail-rate",
        action="append",
        default=[],
        metavar="OUTCOME=P",
        help="probability of an outcome: 429, 500, malformed, schema_invalid, hang, or a "
        "status code; comma-separated or repeated",
    )
    p.add_argument(
        "--script",
        default="",
        help="comma-separated outcomes for the first calls, in order (e.g. 429:2,500,ok)",
    )
    p.add_argument("--retry-after", type=float, default=1.0, help="seconds sent with a 429")
    p.add_argument("--api-key", default=None, help="require this key (default: accept any)")
    p.add_argument(
        "--key",
        action="append",
        default=[],
        metavar="KEY[:RPM[:TPM]]",
        help="accept this key too, with buckets of its own at RPM and TPM (default: the"
        " simulator's); repeated for several keys (a key pool)",
    )
    p.add_argument("--hang-max", type=float, default=3600.0, help="longest hang, seconds")
    p.add_argument("--seed", type=int, default=None, help="seed of the failure draws")
    p.add_argument(
        "--rpm", type=int, default=None, help="requests per minute, per API key and model"
    )
    p.add_argument(
        "--tpm",
        type=int,
        default=None,
        help="tokens per minute (input + max_tokens), per API key and model",
    )
    p.add_argument(
        "--batch-latency",
        type=float,
        default=1.0,
        help="seconds from a batch's creation to its end (default 1.0)",
    )
    p.add_argument(
        "--batch-expire", action="store_true", help="batches end expired, nothing answered"
    )
    p.add_argument(
        "--prompt-cache-ttl",
        type=float,
        default=300.0,
        help="seconds a cached prompt prefix lives (a '1h' breakpoint: 12 x); default 300",
    )
    p.add_argument("--verbose", action="store_true", help="log every request on stderr")
    return p


def config_from(args: argparse.Namespace) -> SimConfig:
    rates: dict[str, float] = {}
    for spec in args.fail_rate:
        rates.update(parse_rates(spec))
    config = SimConfig(
        latency=parse_latency(args.latency),
        content=args.content,
        fixed_text=args.fixed_text,
        script=[parse_outcome(s) for s in args.script.split(",") if s.strip()],
        retry_after=args.retry_after,
        api_key=args.api_key,
        hang_max=args.hang_max,
        seed=args.seed,
    )
    config.update(  # validates the sum of the rates
        {
            "fail_rates": rates,
            "rpm": args.rpm,
            "tpm": args.tpm,
            "batch_latency": args.batch_latency,
            "batch_expire": args.batch_expire,
            "prompt_cache_ttl": args.prompt_cache_ttl,
            "keys": dict(parse_key(k) for k in args.key),
        }
    )
    return config


def parse_key(text: str) -> tuple[str, dict[str, int | None]]:
    """``KEY[:RPM[:TPM]]`` -> (KEY, {"rpm", "tpm"}); a key holds no colon."""
    key, *sizes = text.split(":")
    if not key or len(sizes) > 2:
        raise ConfigError("--key is KEY, KEY:RPM or KEY:RPM:TPM")
    try:
        numbers = [int(n) if n else None for n in sizes] + [None, None]
    except ValueError:
        raise ConfigError("--key: RPM and TPM are whole numbers per minute") from None
    return key, {"rpm": numbers[0], "tpm": numbers[1]}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from(args)
    except (ConfigError, ValueError) as exc:
        parser.error(str(exc))
    try:
        sim = Simulator(config, host=args.host, port=args.port, verbose=args.verbose)
    except OSError as exc:
        print(f"simulator: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1

    def stop(signum: int, frame: FrameType | None) -> None:
        print(f"simulator stopping on {signal.Signals(signum).name}", file=sys.stderr, flush=True)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(sim.url, flush=True)
    print(f"simulator listening on {sim.url}", file=sys.stderr, flush=True)
    try:
        sim.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        sim.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
