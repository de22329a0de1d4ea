"""Network partitions on one machine: the job store and the worker "hosts" in network
namespaces of their own, joined by veth pairs to a bridge, and faults on their links.

Layout (``pid`` is the harness's process id, so that two runs never share a name)::

    root namespace: bridge hb<pid> 10.a.b.1  (the harness, the simulators)
      |-- veth -- herd-<pid>-store  eth0 10.a.b.2   (the job store's server)
      |-- veth -- herd-<pid>-w1     eth0 10.a.b.11  (worker host 1)
      |-- ...

The faults act on a namespace's egress (a ``clsact`` qdisc with a ``u32`` filter), so
that each direction is cut on its own: a one-way cut is one filter, a two-way cut two.

- **drop**: ``mirred`` redirects the matching packets to an ``ifb`` device kept down,
  where the kernel discards them: silent loss, as in a real partition (no reset, no
  "unreachable"; a connection just stops answering).
- **delay and loss**: ``mirred`` redirects them to a ``tap`` device; a small pump
  process (``python -m chaos.netns pump``) reads each frame, drops a share of them and
  sends the rest out of the veth after the delay through a packet socket that bypasses
  the qdisc (so a frame is not caught twice). ``tc netem`` does the same in the
  kernel, where the kernel has it: the machines this runs on (CI included) lack
  ``sch_netem``, and the pump needs only ``u32``, ``mirred`` and ``tun``, which they have.

Everything a run creates is removed in :meth:`Network.close` (also on Ctrl-C, as the
harness calls it in ``finally``), and what a crashed run left behind (namespaces and
bridges named after a process that no longer exists) at the next :meth:`Network.open`.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import logging
import os
import random
import re
import shutil
import socket
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("chaos.netns")

PREFIX = "herd-"
_NS = re.compile(r"^herd-(\d+)-(\w+)$")
_BRIDGE = re.compile(r"^hb(\d+)$")
DEV = "eth0"  # the veth end inside each namespace
HOLE = "hole"  # an ifb device kept down: what is redirected there is dropped
TAP = "dly"  # the pump's tap device


class NetnsUnavailable(RuntimeError):
    """The kernel (or the lack of privileges) refuses network namespaces here."""


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(list(args), capture_output=True, text=True, timeout=30, check=False)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {out.stderr.strip() or out.stdout.strip()}")
    return out


def ip_binary() -> str | None:
    return shutil.which("ip") or (os.path.exists("/usr/sbin/ip") and "/usr/sbin/ip") or None


def ensure_tools() -> None:
    """iproute2 (ip, tc) installed with apt-get when missing, as the suite does for
    pgbouncer: a missing package is installed, never a reason to skip."""
    if ip_binary() and (shutil.which("tc") or os.path.exists("/usr/sbin/tc")):
        return
    if shutil.which("apt-get") is None:
        raise RuntimeError("iproute2 (ip, tc) is missing and there is no apt-get to install it")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "iproute2"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        subprocess.run(["apt-get", "update"], env=env, capture_output=True, timeout=900)
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"apt-get install iproute2 failed: {done.stderr.strip()[-300:]}")


def probe() -> str | None:
    """None if namespaces, veths, ifb, u32 and mirred work here; else why not (the
    kernel's or the privileges' answer: the only reason a partition test skips)."""
    ensure_tools()
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN)"
    name = f"{PREFIX}{os.getpid()}-probe"
    try:
        out = _run("ip", "netns", "add", name, check=False)
        if out.returncode != 0:
            return f"ip netns add refused: {out.stderr.strip()}"
        steps = [
            ("ip", "link", "set", "lo", "up"),
            ("ip", "link", "add", "v0", "type", "veth", "peer", "name", "v1"),
            ("ip", "link", "add", HOLE, "type", "ifb"),
            ("ip", "tuntap", "add", "dev", TAP, "mode", "tap"),
            ("tc", "qdisc", "add", "dev", "v0", "clsact"),
            ("tc", "filter", "add", "dev", "v0", "egress", "protocol", "ip", "u32",
             "match", "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", HOLE),
        ]  # fmt: skip
        for step in steps:
            out = _run("ip", "netns", "exec", name, *step, check=False)
            if out.returncode != 0:
                return f"the kernel refuses `{' '.join(step)}`: {out.stderr.strip()}"
        return None
    finally:
        _run("ip", "netns", "del", name, check=False)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> list[str]:
    """Namespaces and bridges of runs whose process is gone (a crash, a SIGKILL)."""
    removed = []
    out = _run("ip", "netns", "list", check=False).stdout
    for line in out.splitlines():
        name = line.split()[0] if line.strip() else ""
        m = _NS.match(name)
        if m and not _pid_alive(int(m.group(1))):
            _kill_in(name)
            _run("ip", "netns", "del", name, check=False)
            removed.append(name)
    for line in _run("ip", "-o", "link", "show", "type", "bridge", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        m = _BRIDGE.match(name)
        if m and not _pid_alive(int(m.group(1))):
            _run("ip", "link", "del", name, check=False)
            removed.append(name)
    if removed:
        log.warning("removed what a crashed run left behind: %s", removed)
    return removed


def _kill_in(ns: str) -> None:
    """SIGKILL every process still running in namespace ``ns``."""
    out = _run("ip", "netns", "pids", ns, check=False).stdout
    for pid in out.split():
        try:
            os.kill(int(pid), 9)
        except (ProcessLookupError, ValueError):
            pass


@dataclass
class Host:
    name: str  # "store", "w1", ...
    ns: str
    address: str
    root_dev: str  # the veth end on the bridge
    pump: subprocess.Popen[bytes] | None = None


Handles = list[tuple[Host, int]]  # what a fault put on: (host, filter preference)


class Network:
    """A bridge, a store namespace and N worker namespaces; faults on their links."""

    def __init__(self, hosts: int, run_dir: Path) -> None:
        pid = os.getpid()
        self.pid = pid
        self.tag = f"{PREFIX}{pid}"
        # A /24 of 10/8 picked from the pid: concurrent runs on one machine do not collide.
        self.net = f"10.{20 + (pid >> 8) % 200}.{pid % 256}"
        self.bridge = f"hb{pid}"
        self.gateway = f"{self.net}.1"
        self.run_dir = run_dir
        self.store = self._host("store", 2)
        self.workers = [self._host(f"w{i + 1}", 11 + i) for i in range(hosts)]
        self._pref = 10
        self.opened = False

    def _host(self, name: str, octet: int) -> Host:
        return Host(name, f"{self.tag}-{name}", f"{self.net}.{octet}", f"hv{self.pid}{name}")

    @property
    def hosts(self) -> list[Host]:
        return [self.store, *self.workers]

    def open(self) -> None:
        why = probe()
        if why is not None:
            raise NetnsUnavailable(why)
        remove_stale()
        self.opened = True
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for h in self.hosts:
            _run("ip", "netns", "add", h.ns)
            _run(
                "ip", "link", "add", h.root_dev, "type", "veth", "peer", "name", DEV, "netns", h.ns
            )
            _run("ip", "link", "set", h.root_dev, "master", self.bridge, "up")
            for step in (
                ("ip", "link", "set", "lo", "up"),
                ("ip", "addr", "add", f"{h.address}/24", "dev", DEV),
                ("ip", "link", "set", DEV, "up"),
                ("ip", "route", "add", "default", "via", self.gateway),
                ("ip", "link", "add", HOLE, "type", "ifb"),  # left down: a black hole
                ("tc", "qdisc", "add", "dev", DEV, "clsact"),
            ):
                self.exec(h, *step)
        log.info("network %s: store %s, workers %s", self.net, self.store.address,
                 [w.address for w in self.workers])  # fmt: skip

    def exec(self, host: Host, *args: str) -> None:
        _run("ip", "netns", "exec", host.ns, *args)

    def prefix(self, host: Host) -> list[str]:
        """The command prefix that runs a process on ``host``."""
        return [ip_binary() or "ip", "netns", "exec", host.ns]

    def close(self) -> None:
        if not self.opened:
            return
        for h in self.hosts:
            self.stop_pump(h)
            _kill_in(h.ns)
            _run("ip", "netns", "del", h.ns, check=False)
        _run("ip", "link", "del", self.bridge, check=False)
        self.opened = False

    # -- faults: each returns its handles, (host, filter preference), for heal()

    def _filter(self, host: Host, dst: str | None, target: str) -> Handles:
        self._pref += 1
        match = ["match", "ip", "dst", f"{dst}/32"] if dst else ["match", "u32", "0", "0"]
        self.exec(host, "tc", "filter", "add", "dev", DEV, "egress", "pref", str(self._pref),
                  "protocol", "ip", "u32", *match, "action", "mirred", "egress", "redirect",
                  "dev", target)  # fmt: skip
        return [(host, self._pref)]

    def drop(self, src: Host, dst: Host | None = None) -> Handles:
        """Packets from ``src`` (to ``dst``, or to anyone) are silently dropped."""
        return self._filter(src, dst.address if dst else None, HOLE)

    def cut(self, a: Host, b: Host) -> Handles:
        """Both directions between ``a`` and ``b``."""
        return self.drop(a, b) + self.drop(b, a)

    def impair(self, host: Host, delay: float, loss: float) -> Handles:
        """Every packet ``host`` sends is delayed ``delay`` s, a share ``loss`` lost
        (until stop_pump)."""
        if host.pump is not None:
            raise RuntimeError(f"host {host.name} is already slowed down")
        self.exec(host, "ip", "tuntap", "add", "dev", TAP, "mode", "tap")
        self.exec(host, "ip", "link", "set", TAP, "up")
        with (self.run_dir / f"pump-{host.name}.log").open("ab") as err:
            host.pump = subprocess.Popen(
                [*self.prefix(host), sys.executable, "-m", "chaos.netns", "pump",
                 "--tap", TAP, "--dev", DEV, "--delay", str(delay), "--loss", str(loss)],
                stdout=subprocess.PIPE, stderr=err, cwd=Path(__file__).resolve().parent.parent,
            )  # fmt: skip
        assert host.pump.stdout is not None
        if host.pump.stdout.readline().strip() != b"ready":
            self.stop_pump(host)
            raise RuntimeError(f"the delay pump did not start: see pump-{host.name}.log")
        return self._filter(host, None, TAP)

    def heal(self, handles: Handles) -> None:
        for host, pref in handles:
            self.exec(host, "tc", "filter", "del", "dev", DEV, "egress", "pref", str(pref))

    def stop_pump(self, host: Host) -> None:
        if host.pump is not None:
            if host.pump.poll() is None:
                host.pump.terminate()
                try:
                    host.pump.wait(5)
                except subprocess.TimeoutExpired:
                    host.pump.kill()
            host.pump = None
            _run("ip", "netns", "exec", host.ns, "ip", "link", "del", TAP, check=False)


# -- the pump (runs inside a namespace)

_TUNSETIFF = 0x400454CA
_IFF_TAP, _IFF_NO_PI = 0x0002, 0x1000
_SOL_PACKET, _PACKET_QDISC_BYPASS = 263, 20


async def _pump(tap: str, dev: str, delay: float, loss: float) -> None:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", tap.encode(), _IFF_TAP | _IFF_NO_PI))
    out = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    out.bind((dev, 0))
    # Straight to the device: the frame must not meet the egress filter again.
    out.setsockopt(_SOL_PACKET, _PACKET_QDISC_BYPASS, 1)
    loop = asyncio.get_running_loop()
    rng = random.Random()

    def send(frame: bytes) -> None:
        try:
            out.send(frame)
        except OSError:
            pass  # a full device queue drops, as a real link does

    def readable() -> None:
        while True:
            try:
                frame = os.read(fd, 65536)
            except BlockingIOError:
                return
            if rng.random() >= loss:
                loop.call_later(delay, send, frame)

    loop.add_reader(fd, readable)
    print("ready", flush=True)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m chaos.netns")
    sub = p.add_subparsers(dest="cmd", required=True)
    pump = sub.add_parser("pump", help="delay and drop the frames a tap device receives")
    pump.add_argument("--tap", required=True)
    pump.add_argument("--dev", required=True)
    pump.add_argument("--delay", type=float, required=True)
    pump.add_argument("--loss", type=float, default=0.0)
    sub.add_parser("clean", help="remove what crashed runs left behind")
    sub.add_parser("probe", help="can network namespaces work here?")
    args = p.parse_args(argv)
    if args.cmd == "pump":
        if not 0.0 <= args.loss < 1.0:
            p.error(f"--loss {args.loss}: a share in [0, 1)")
        try:
            asyncio.run(_pump(args.tap, args.dev, args.delay, args.loss))
        except KeyboardInterrupt:
            pass
        return 0
    if args.cmd == "clean":
        print("\n".join(remove_stale()) or "nothing to remove")
        return 0
    why = probe()
    print(why or "network namespaces work here")
    return 0 if why is None else 1


if __name__ == "__main__":
    sys.exit(main())
