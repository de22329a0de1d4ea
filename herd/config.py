"""Settings in force: a flag beats a variable, a variable beats a default."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import platformdirs
from psycopg import ProgrammingError
from psycopg.conninfo import conninfo_to_dict

from herd.errors import ConfigError
from herd.jsonvalue import MAX_BYTES, MAX_DEPTH
from herd.masking import mask, remember, remember_urls

FINISHED_TTL = 7 * 86400  # a week: long enough to inspect results, short enough to stay small
# Two days of jobs finished per minute: the dashboard shows two hours; the rest is
# for looking back over a weekend's incident.
THROUGHPUT_TTL = 2 * 86400

# Retention of evaluation state (seconds; 0 keeps). The ledger's totals live in a
# summary that outlives its rows, so a quarter of itemised rows is enough to audit a
# bill. Evaluations and cache entries: a month, long enough to re-run or re-read a
# batch, short enough that answers of a model alias that has since moved on expire.
LEDGER_TTL = 90 * 86400
LIMIT_MAX_WAIT = 30
EVAL_TTL = 30 * 86400
CACHE_TTL = 30 * 86400

# The largest max_tokens (or max_completion_tokens) an evaluation's params may ask for.
EVAL_MAX_TOKENS = 16_384
# Seconds an evaluation's singleflight lock outlives a worker that died holding it (it
# is renewed while the call runs): the job's retry waits that long before calling.
EVAL_LOCK_TTL = 30

# What one POST /query may ask (herd.api.queries): texts, characters per text, k. The
# request model's bounds (herd.api.models.QueryIn) are the most a setting may raise them
# to. Each text costs an embedding and a search; k, the bytes of the answer and of what
# the semantic cache keeps.
QUERY_MAX_TEXTS, QUERY_TEXTS_CEILING = 32, 100
QUERY_MAX_CHARS, QUERY_CHARS_CEILING = 2_000, 10_000
QUERY_MAX_K, QUERY_K_CEILING = 100, 1_000
# Query embeddings a process runs at once, whatever the number of requests: the rest
# wait their turn rather than take every thread and core from the server.
QUERY_EMBED_CONCURRENCY = 2
# The largest answer the semantic cache keeps (JSON bytes); a larger one is computed
# and returned, not stored: the cache's bound counts entries, so each must be small.
SEMANTIC_MAX_ENTRY_BYTES = 256 * 1024

# Shorter is guessable by anyone who can reach the port (herd.api.security).
MIN_TOKEN_LENGTH = 16

# Queues a Redis job store may hold (HERD_MAX_QUEUES); queues the dashboard and /metrics
# show one by one (HERD_SHOWN_QUEUES), the others summed in one row.
MAX_QUEUES = 1000
SHOWN_QUEUES = 50

# The pool of a process that is not a worker (serve, enqueue, the CLI's reads).
PG_POOL_SIZE = 8
# A worker's pool beyond one connection per running job: the claim loop, the
# heartbeat, the completer, retention, and a store call nested in a job's
# fenced transaction (the ledger, a lock's renewal) — so that none waits.
PG_POOL_SPARE = 4


def pool_size(settings: Settings, concurrency: int | None = None) -> int:
    """HERD_PG_POOL_SIZE, else what a worker at ``concurrency`` (or any other process) needs."""
    if settings.pg_pool_size:
        return settings.pg_pool_size
    return concurrency + PG_POOL_SPARE if concurrency else PG_POOL_SIZE


def default_home() -> Path:
    return Path(platformdirs.user_data_dir("herd", appauthor=False))


@dataclass(frozen=True)
class TenantToken:
    """A bearer token bound to tenants (HERD_API_TOKENS): it may query as them, only."""

    token: str = field(repr=False)
    tenants: frozenset[str]


@dataclass(frozen=True, repr=False)
class Settings:
    home: Path = field(default_factory=default_home)
    database_url: str | None = None
    # The server itself when database_url goes through PgBouncer (transaction mode):
    # LISTEN goes there; without it herd listens on database_url or polls.
    database_direct_url: str | None = None
    redis_url: str | None = None
    broker: str = "postgres"  # where jobs live: "postgres" or "redis"
    cache: str = "postgres"  # where the exact cache lives: "postgres" or "redis"
    api_token: str | None = field(default=None, repr=False)
    # Tokens bound to tenants (HERD_API_TOKENS); api_token is bound to none.
    api_tokens: tuple[TenantToken, ...] = field(default=(), repr=False)
    api_body_limit: int = 1 << 20  # bytes of a request body `herd serve` accepts (413 past it)
    # Host names the API answers for besides loopback ones ('*.example.org': its subdomains);
    # empty: any name with a token, none without (herd.api.security.LocalOrTrusted).
    api_trusted_hosts: tuple[str, ...] = ()
    # Refused at enqueue (payload) or dead-lettered at completion (result): one huge or
    # deeply nested job must not break every listing and dashboard poll that shows it.
    max_payload_bytes: int = MAX_BYTES
    max_result_bytes: int = MAX_BYTES
    max_json_depth: int = MAX_DEPTH
    # Seconds a corpus generation swapped out keeps its vectors, for the queries that
    # resolved it just before the swap; a later ingest's finalize drops it.
    rag_retired_grace: int = 300
    # Where new corpus generations keep their vectors (herd.rag.vectors): None is
    # pgvector in herd's database; milvus://, qdrant:// or qdrant+edge:// otherwise.
    vector_url: str | None = None
    # Seconds a succeeded job (and its result) is kept on either backend; 0 keeps them.
    finished_ttl: int = FINISHED_TTL
    # Seconds an itemised cost-ledger row is kept (its totals stay in the summary).
    ledger_ttl: int = LEDGER_TTL
    # Seconds a finished evaluation item is kept; documents and specs no queued item
    # needs go that long after their last submission.
    eval_ttl: int = EVAL_TTL
    # Seconds an exact-cache entry (an evaluation's result) stays fresh after it is written.
    cache_ttl: int = CACHE_TTL
    # Seconds the per-minute throughput rollup is kept on either backend; 0 keeps it.
    throughput_ttl: int = THROUGHPUT_TTL
    # Bounds what an evaluation's params may ask a provider to generate (and bill) per call.
    eval_max_tokens: int = EVAL_MAX_TOKENS
    # Seconds the singleflight lock of a dead evaluation holder blocks its key.
    eval_lock_ttl: int = EVAL_LOCK_TTL
    # Connections of the process's one PostgreSQL pool (and each Redis pool); None: a
    # worker takes its concurrency + PG_POOL_SPARE, other commands PG_POOL_SIZE.
    pg_pool_size: int | None = None
    # The provider limits file (TOML, herd.limits.config); None: no limits.
    limits_path: Path | None = None
    # Seconds a call may wait for capacity under a provider limit before its job is handed
    # back with a delay (no attempt counted) instead of holding a worker slot.
    limit_max_wait: int = LIMIT_MAX_WAIT
    # How a request that a provider batch answered with an error, or let expire, gets its
    # one retry: "sync" (a synchronous call at the full price) or "batch" (a new provider
    # batch, half price, up to a day later). A second failure is dead-lettered.
    eval_batch_retry: str = "sync"
    # The semantic query cache's policy: "guarded" (threshold and near-miss guards) or
    # "bounded" (herd.semantic.bounded: learned, with at most this chance of a wrong hit).
    semantic_mode: str = "guarded"
    semantic_error_bound: float = 0.05
    semantic_max_entry_bytes: int = SEMANTIC_MAX_ENTRY_BYTES
    # Bounds of one POST /query, and the query embeddings a process runs at once.
    query_max_texts: int = QUERY_MAX_TEXTS
    query_max_chars: int = QUERY_MAX_CHARS
    query_max_k: int = QUERY_MAX_K
    query_embed_concurrency: int = QUERY_EMBED_CONCURRENCY
    # Whether opening a store may create or update herd's tables (HERD_AUTO_MIGRATE=0:
    # never; `herd migrate` does it), for teams whose schema changes go through review.
    auto_migrate: bool = True
    # Queues a Redis job store may hold (each takes one of its 2**20 - 1 numbers for as
    # long as it has jobs): an enqueue, from the API too, that would add one more is refused.
    max_queues: int = MAX_QUEUES
    # Queues /overview and /metrics show one by one (the busiest); the rest are summed
    # into one row, so that many queues cannot make every poll slow and large.
    shown_queues: int = SHOWN_QUEUES

    def __post_init__(self) -> None:
        # Whatever prints an error later masks these verbatim, even where the URL's
        # shape did not survive (a driver quoting the piece it could not parse).
        remember(self.api_token)
        for bound in self.api_tokens:
            remember(bound.token)
        remember_urls(self.database_url, self.database_direct_url, self.redis_url, self.vector_url)

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{f.name}='****'"
            if f.name == "api_token" and self.api_token
            else f"{f.name}={self._tenant_tokens()!r}"
            if f.name == "api_tokens"
            else f"{f.name}={mask(repr(getattr(self, f.name)))}"
            for f in fields(self)
        )
        return f"Settings({shown})"

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        env = dict(os.environ if env is None else env)
        home = env.get("HERD_HOME")
        return cls(
            home=Path(home).expanduser() if home else default_home(),
            database_url=env.get("HERD_DATABASE_URL") or None,
            database_direct_url=env.get("HERD_DATABASE_DIRECT_URL") or None,
            redis_url=env.get("HERD_REDIS_URL") or None,
            broker=env.get("HERD_BROKER") or "postgres",
            cache=env.get("HERD_CACHE") or "postgres",
            # Trimmed as the Authorization header is: a token pasted with its newline matches.
            api_token=(env.get("HERD_API_TOKEN") or "").strip() or None,
            api_tokens=_tenant_tokens(env, "HERD_API_TOKENS"),
            api_body_limit=_bytes(env, "HERD_API_BODY_LIMIT", 1 << 20),
            api_trusted_hosts=_hosts(env, "HERD_API_TRUSTED_HOSTS"),
            max_payload_bytes=_bytes(env, "HERD_MAX_PAYLOAD_BYTES", MAX_BYTES),
            max_result_bytes=_bytes(env, "HERD_MAX_RESULT_BYTES", MAX_BYTES),
            max_json_depth=_bytes(env, "HERD_MAX_JSON_DEPTH", MAX_DEPTH, unit="levels"),
            rag_retired_grace=_bytes(env, "HERD_RAG_RETIRED_GRACE", 300, unit="seconds"),
            vector_url=_vector_url(env),
            finished_ttl=_bytes(env, "HERD_FINISHED_TTL", FINISHED_TTL, unit="seconds", zero=True),
            ledger_ttl=_bytes(env, "HERD_LEDGER_TTL", LEDGER_TTL, unit="seconds", zero=True),
            eval_ttl=_bytes(env, "HERD_EVAL_TTL", EVAL_TTL, unit="seconds", zero=True),
            cache_ttl=_bytes(env, "HERD_CACHE_TTL", CACHE_TTL, unit="seconds", zero=True),
            throughput_ttl=_bytes(
                env, "HERD_THROUGHPUT_TTL", THROUGHPUT_TTL, unit="seconds", zero=True
            ),
            eval_max_tokens=_bytes(env, "HERD_EVAL_MAX_TOKENS", EVAL_MAX_TOKENS, unit="tokens"),
            eval_lock_ttl=_bytes(env, "HERD_EVAL_LOCK_TTL", EVAL_LOCK_TTL, unit="seconds"),
            pg_pool_size=_bytes(env, "HERD_PG_POOL_SIZE", 0, unit="connections") or None,
            limits_path=Path(env["HERD_LIMITS"]).expanduser() if env.get("HERD_LIMITS") else None,
            limit_max_wait=_bytes(env, "HERD_LIMIT_MAX_WAIT", LIMIT_MAX_WAIT, unit="seconds"),
            eval_batch_retry=_choice(env, "HERD_EVAL_BATCH_RETRY", ("sync", "batch")),
            semantic_mode=_choice(env, "HERD_SEMANTIC_MODE", ("guarded", "bounded")),
            semantic_error_bound=_probability(env, "HERD_SEMANTIC_ERROR_BOUND", 0.05),
            semantic_max_entry_bytes=_bytes(
                env, "HERD_SEMANTIC_MAX_ENTRY_BYTES", SEMANTIC_MAX_ENTRY_BYTES
            ),
            query_max_texts=_at_most(
                env, "HERD_QUERY_MAX_TEXTS", QUERY_MAX_TEXTS, QUERY_TEXTS_CEILING, "texts"
            ),
            query_max_chars=_at_most(
                env, "HERD_QUERY_MAX_CHARS", QUERY_MAX_CHARS, QUERY_CHARS_CEILING, "characters"
            ),
            query_max_k=_at_most(env, "HERD_QUERY_MAX_K", QUERY_MAX_K, QUERY_K_CEILING, "hits"),
            query_embed_concurrency=_bytes(
                env, "HERD_QUERY_EMBED_CONCURRENCY", QUERY_EMBED_CONCURRENCY, unit="embeddings"
            ),
            auto_migrate=auto_migrate_from(env),
            max_queues=_bytes(env, "HERD_MAX_QUEUES", MAX_QUEUES, unit="queues"),
            shown_queues=_bytes(env, "HERD_SHOWN_QUEUES", SHOWN_QUEUES, unit="queues"),
        )

    def override(self, **values: object) -> Settings:
        """Apply the flags that were given (None means 'not given')."""
        return replace(self, **{k: v for k, v in values.items() if v is not None})  # type: ignore[arg-type]

    def _tenant_tokens(self) -> str:
        """HERD_API_TOKENS as shown: the tenants, each token hidden."""
        return "; ".join("****=" + ",".join(sorted(b.tenants)) for b in self.api_tokens)

    def bearer_tokens(self) -> list[str]:
        """Every token the API accepts, bound or not."""
        return [t for t in (self.api_token, *(b.token for b in self.api_tokens)) if t]

    def masked(self) -> dict[str, str]:
        """What `herd config` prints: every setting, with secrets hidden."""
        out: dict[str, str] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                out[f.name] = "(embedded)" if f.name == "database_url" else "(not set)"
            elif f.name == "api_token":
                out[f.name] = "****"
            elif f.name == "api_tokens":
                out[f.name] = self._tenant_tokens() or "(not set)"
            else:
                out[f.name] = mask(str(value))
        return out


def _bytes(
    env: dict[str, str], name: str, default: int, *, unit: str = "bytes", zero: bool = False
) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < (0 if zero else 1):
        some = "a whole" if zero else "a positive"
        raise ConfigError(f"{name} must be {some} number of {unit}, not {raw!r}")
    return int(raw)


def _at_most(env: dict[str, str], name: str, default: int, ceiling: int, unit: str) -> int:
    value = _bytes(env, name, default, unit=unit)
    if value > ceiling:
        raise ConfigError(f"{name} may be at most {ceiling} {unit}, not {value}")
    return value


_DURATION = re.compile(r"(\d{1,9})([smhdw]?)")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str, what: str) -> int:
    """Seconds in ``30s``, ``15m``, ``12h``, ``7d``, ``2w`` (a bare number: seconds)."""
    m = _DURATION.fullmatch(text.strip().lower())
    if m is None:
        raise ConfigError(
            f"{what} must be a duration such as 30s, 15m, 12h, 7d or 2w, not {text!r}"
        )
    return int(m[1]) * _UNITS[m[2]]


_HOST = re.compile(r"(\*\.)?([a-z0-9_-]+(\.[a-z0-9_-]+)*|\[[0-9a-f:.]+\])|\*")


def _choice(env: dict[str, str], name: str, choices: tuple[str, ...]) -> str:
    """One of ``choices`` (the first when unset)."""
    raw = env.get(name, "").strip().lower()
    if not raw:
        return choices[0]
    if raw not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}, not {raw!r}")
    return raw


def auto_migrate_from(env: Mapping[str, str]) -> bool:
    """HERD_AUTO_MIGRATE: 1 (the default) or 0."""
    raw = env.get("HERD_AUTO_MIGRATE", "").strip().lower()
    if raw in ("", "1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"HERD_AUTO_MIGRATE must be 1 or 0, not {raw!r}")


def _probability(env: dict[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value < 1:  # NaN fails too
        raise ConfigError(f"{name} must be a probability between 0 and 1, not {raw!r}")
    return value


DATABASE_URL_FORM = "postgresql://USER:PASSWORD@HOST:PORT/DATABASE"


def check_database_url(url: str, name: str) -> None:
    """Refuse a PostgreSQL URL libpq cannot read before anything connects: what is
    wrong with it and the form expected, not libpq's words about key=value strings."""
    shown = mask(url)
    scheme, sep, _ = url.partition("://")
    if sep and scheme not in ("postgresql", "postgres"):
        raise ConfigError(f"{name} is a {scheme}:// URL ({shown}); expected {DATABASE_URL_FORM}")
    try:
        conninfo_to_dict(url)
    except ProgrammingError:
        raise ConfigError(
            f"{name} is not a PostgreSQL URL: {shown!r}; expected {DATABASE_URL_FORM}"
            " (or libpq's 'host=HOST dbname=DATABASE ...')"
        ) from None


def _vector_url(env: dict[str, str]) -> str | None:
    """HERD_VECTOR_URL, refused at start when it names no store (its forms in the error)."""
    from herd.rag.vectors import parse

    raw = env.get("HERD_VECTOR_URL", "").strip() or None
    parse(raw)
    return raw


def _tenant_tokens(env: dict[str, str], name: str) -> tuple[TenantToken, ...]:
    """``TOKEN=TENANT[,TENANT...]`` entries, separated by spaces, newlines or ``;``.
    Errors name the entry by its number: its text holds a token."""
    unbound = (env.get("HERD_API_TOKEN") or "").strip()
    out: list[TenantToken] = []
    seen: set[str] = set()
    for i, entry in enumerate(re.split(r"[;\s]+", env.get(name, "")), 1):
        if not entry:
            continue
        token, sep, listed = entry.partition("=")
        tenants = listed.split(",")
        where = f"{name}: entry {i}"
        if not sep or not token or not all(tenants):
            raise ConfigError(f"{where} is not TOKEN=TENANT[,TENANT...] (tokens hold no '=')")
        if len(token) < MIN_TOKEN_LENGTH:
            raise ConfigError(
                f"{where}: its token has {len(token)} characters; a token needs at least"
                f" {MIN_TOKEN_LENGTH}"
            )
        if token in seen or token == unbound:
            raise ConfigError(
                f"{where}: its token is given twice (or is HERD_API_TOKEN, which is bound to"
                " no tenant): give each token once"
            )
        seen.add(token)
        out.append(TenantToken(token, frozenset(tenants)))
    return tuple(out)


def _hosts(env: dict[str, str], name: str) -> tuple[str, ...]:
    hosts = tuple(h.strip().lower().removesuffix(".") for h in env.get(name, "").split(","))
    for host in hosts:
        if host and not _HOST.fullmatch(host):
            raise ConfigError(
                f"{name}: {host!r} is not a host name; give names without scheme, port or"
                " path, comma separated ('*.example.org' for its subdomains)"
            )
    return tuple(h for h in hosts if h)


def mask_url(url: str) -> str:
    """Hide the credentials of a connection URL, or of any text holding one (the one
    masking of :mod:`herd.masking`), so that they never reach a log."""
    return mask(url)
