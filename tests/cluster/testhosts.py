"""Test hosts: N hosts on this one machine, each a network namespace of its own.

Each host has its own IP on a private bridge, its own loopback, its own host name (a UTS
namespace per command, all set to the same name) and an /etc/hosts that names every test host
(bound over /etc/hosts from /etc/netns/<netns>/, as `ip netns exec` does). Everything else is this
machine's: the filesystem (so runs/ is shared, as on a real cluster), the users, the processes
(visible from here, which the fault tests use). The bridge has no address in this machine's own
namespace and nothing routes off it: the hosts reach each other and nothing else.

    with TestHosts(["host0", "host1"]) as hosts:
        hosts["host0"].run(["hostname"])            # prints host0
        hosts["host1"].popen(["make", "bench", ...])
        hosts["host1"].cut_link()                   # the host drops off the network

Needs root (namespaces, links). `python -m tests.cluster.testhosts N` brings up N hosts, prints
how to run a command on each, and tears them down on Ctrl-C; `... check` says in one line why
test hosts cannot be made here (exit 3), or nothing (exit 0).

Everything made is named after this process's pid and a letter a fixture (dlrm<pid><letter>...), so
a fixture killed before its teardown is cleaned up by the next one (its pid is gone), and a fixture
never reuses the names of one just torn down (the kernel frees a namespace's links lazily).
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

PREFIX = "dlrm"
SUBNET = ipaddress.ip_network("10.213.0.0/24")
"""The hosts' addresses. Private (RFC 1918) and never routed: the bridge has no address outside
the test hosts, so this subnet can overlap nothing this machine uses."""
NETNS_ETC = Path("/etc/netns")


class HostsUnavailable(RuntimeError):
    """This machine cannot make test hosts (not root, no `ip`, no namespaces); the message says which."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def unavailable_reason() -> str | None:
    """Why test hosts cannot be made here, or None when they can (checked by making one namespace)."""
    if os.geteuid() != 0:
        return "test hosts need root (network namespaces and links); this is uid " + str(os.geteuid())
    for tool in ("ip", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"test hosts need `{tool}` (iproute2 / util-linux), which is not on PATH"
    probe = f"{PREFIX}{os.getpid()}-probe"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip() or 'ip netns add failed'}"
    _ip("netns", "delete", probe, check=False)
    return None


@dataclass(frozen=True)
class Host:
    name: str
    """Its host name (what `hostname` and socket.gethostname() say inside it)."""
    netns: str
    """Its network namespace."""
    addr: str
    """Its IP on the bridge."""
    link: str
    """The bridge's end of its link, on this machine: down cuts the host off."""

    def argv(self, cmd: Sequence[str]) -> list[str]:
        """`cmd` run inside this host: its network namespace, its host name, its /etc/hosts.

        Not `ip netns exec`: that mounts a fresh /sys, without this machine's cgroup hierarchy,
        which slurmd needs even with no cgroup plugin configured (22.05 refuses to start)."""
        return ["nsenter", f"--net=/run/netns/{self.netns}", "unshare", "--uts", "--mount", "--propagation", "private",
                "--", "sh", "-c", 'mount --bind "$1" /etc/hosts && mount --bind "$2" /etc/resolv.conf && hostname "$0" '
                '&& shift 2 && exec "$@"', self.name, str(NETNS_ETC / self.netns / "hosts"),
                str(NETNS_ETC / self.netns / "resolv.conf"), *cmd]

    def popen(self, cmd: Sequence[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.argv(cmd), **kwargs)

    def run(self, cmd: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(cmd), **kwargs)

    def pids(self) -> list[int]:
        """Every process in this host's network namespace."""
        out = _ip("netns", "pids", self.netns, check=False).stdout
        return [int(p) for p in out.split()]

    def kill_all(self, sig: int = signal.SIGKILL) -> list[int]:
        """Send `sig` to every process on this host (a host that dies); the pids signalled."""
        pids = self.pids()
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        return pids

    def cut_link(self) -> None:
        """The host's network link goes down (its cable pulled): its packets go nowhere."""
        _ip("link", "set", self.link, "down")


_made = 0
"""Fixtures made by this process so far (each takes the next letter)."""


class TestHosts(Mapping[str, Host]):
    """The hosts, by name; made on enter, torn down on exit (also after a failure)."""

    __test__ = False  # not a pytest test class

    def __init__(self, names: Sequence[str]) -> None:
        if len(set(names)) != len(names) or not names:
            raise ValueError(f"host names must be distinct and at least one: {list(names)}")
        if len(names) > SUBNET.num_addresses - 12:
            raise ValueError(f"at most {SUBNET.num_addresses - 12} test hosts")
        global _made
        tag = f"{PREFIX}{os.getpid()}{'abcdefghijklmnopqrstuvwxyz'[_made % 26]}"  # at most 15 characters a link
        _made += 1
        self.bridge = f"{tag}b"
        self._hosts = {
            name: Host(name=name, netns=f"{tag}-{k}", addr=str(SUBNET[10 + k]), link=f"{tag}v{k}")
            for k, name in enumerate(names)
        }

    def __getitem__(self, name: str) -> Host:
        return self._hosts[name]

    def __iter__(self):
        return iter(self._hosts)

    def __len__(self) -> int:
        return len(self._hosts)

    def hosts_file(self) -> str:
        return "127.0.0.1\tlocalhost\n" + "".join(f"{h.addr}\t{h.name}\n" for h in self._hosts.values())

    def __enter__(self) -> "TestHosts":
        reason = unavailable_reason()
        if reason:
            raise HostsUnavailable(reason)
        clean_stale()
        try:
            self._make()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()

    def _make(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("link", "set", self.bridge, "up")
        for host in self._hosts.values():
            _ip("netns", "add", host.netns)
            _ip("link", "add", host.link, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
            _ip("link", "set", host.link, "master", self.bridge, "up")
            _ip("-n", host.netns, "addr", "add", f"{host.addr}/{SUBNET.prefixlen}", "dev", "eth0")
            _ip("-n", host.netns, "link", "set", "eth0", "up")
            _ip("-n", host.netns, "link", "set", "lo", "up")
            etc = NETNS_ETC / host.netns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(self.hosts_file())
            # No name server: a lookup that /etc/hosts cannot answer fails at once instead of
            # trying this machine's resolver, which a test host cannot (and must not) reach.
            (etc / "resolv.conf").write_text("options attempts:1 timeout:1\n")
        self._wait_reachable()

    def _wait_reachable(self, timeout_s: float = 10.0) -> None:
        """The bridge forwards once its ports leave the learning state; wait until every host
        reaches every other, so a test never starts on a network that is still coming up."""
        hosts = list(self._hosts.values())
        deadline = time.monotonic() + timeout_s
        for a in hosts:
            for b in hosts:
                if a is b:
                    continue
                while a.run(["ping", "-c1", "-W1", b.addr], capture_output=True).returncode != 0:
                    if time.monotonic() > deadline:
                        raise HostsUnavailable(f"test host {a.name} cannot reach {b.name} ({b.addr}) after {timeout_s:.0f} s")
                    time.sleep(0.2)

    def teardown(self) -> None:
        _teardown([self.bridge], [h.netns for h in self._hosts.values()], [h.link for h in self._hosts.values()])


def _kill_netns(netns: str) -> None:
    """Kill every process in the namespace and wait until they are gone (a namespace deleted with
    processes still in it lives on, invisible, holding its addresses)."""
    deadline = time.monotonic() + 10
    while True:
        pids = [int(p) for p in _ip("netns", "pids", netns, check=False).stdout.split()]
        if not pids or time.monotonic() > deadline:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


def _teardown(bridges: Sequence[str], namespaces: Sequence[str], links: Sequence[str] = ()) -> None:
    for netns in namespaces:
        _kill_netns(netns)
    # A namespace outlives its processes while a socket of theirs still holds it (a connection
    # retransmitting over a cut link, for minutes), and keeps its link to the bridge: delete the
    # links themselves, so nothing of a torn-down host stays on this machine's side.
    for link in links:
        _ip("link", "delete", link, check=False)
    for netns in namespaces:
        _ip("netns", "delete", netns, check=False)
        shutil.rmtree(NETNS_ETC / netns, ignore_errors=True)
    for bridge in bridges:
        _ip("link", "delete", bridge, check=False)


def clean_stale() -> None:
    """Remove what a fixture whose process is gone left behind: its namespaces (and their
    /etc/netns folders), links and bridge, all named after that process's pid."""

    def dead(listing: str, pattern: str) -> list[str]:
        return [m.group(1) for m in re.finditer(pattern, listing, re.M) if not _alive(int(m.group(2)))]

    links = _ip("-o", "link", "show", check=False).stdout
    _teardown(bridges=dead(links, rf"^\d+: ({PREFIX}(\d+)[a-z]b)[:@]"),
              namespaces=dead(_ip("netns", "list", check=False).stdout, rf"^({PREFIX}(\d+)[a-z]-\S+)"),
              links=dead(links, rf"^\d+: ({PREFIX}(\d+)[a-z]v\d+)[:@]"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["check"]:  # make test-cluster: one line and exit 0 where hosts cannot be made
        reason = unavailable_reason()
        if reason:
            print(f"make test-cluster: skipped, {reason}")
            return 3
        return 0
    if len(args) != 1 or not args[0].isdigit() or int(args[0]) < 1:
        print("usage: python -m tests.cluster.testhosts N   (N test hosts host0..host<N-1> until Ctrl-C)", file=sys.stderr)
        return 2
    try:
        with TestHosts([f"host{k}" for k in range(int(args[0]))]) as hosts:
            for h in hosts.values():
                print(f"{h.name} {h.addr}: {' '.join(h.argv(['bash']))}")
            print("Ctrl-C tears them down", flush=True)
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
            try:
                signal.pause()
            except KeyboardInterrupt:
                pass
    except HostsUnavailable as exc:
        print(f"testhosts: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
