"""The virtual network of `make partitions`: one network namespace per host, joined by veth
pairs to a bridge that lives in a namespace of its own (nothing is added to the machine's own
namespace: no link, address or route), addresses in 10.77.0.0/24 used only inside them.

    python -m tests.partitions.network up      create every namespace, link and address
    python -m tests.partitions.network down    end every process in them, delete them
    python -m tests.partitions.network check   exit 1 (and say what) when anything is left

Every service is reached through the link proxy (tests/partitions/proxy.py), which owns one
address per proxied service, so that cutting "executor e1 from Redis" is one blackhole route
in e1's namespace towards Redis's proxy address, and slowing "every link" is one setting of
the proxy. The test driver (host `ctl`) talks to the services directly: it observes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

PREFIX = "rpt-"
SUBNET = "10.77.0"
BRIDGE_NS = f"{PREFIX}net"
BRIDGE = "br0"

# Host → last octet of its address; each host is a namespace rpt-<host>.
HOSTS: dict[str, int] = {
    "ctl": 2,  # the test driver: load, answers, checks
    "k1": 11,
    "k2": 12,
    "k3": 13,
    "redis": 21,
    "pg": 22,
    "s1": 31,
    "s2": 32,
    "s3": 33,  # scale-out
    "e1": 41,
    "e2": 42,
    "e3": 43,
    "e4": 44,  # scale-out
    "aux": 51,  # fake provider and reconciler
    "proxy": 100,
}
# Proxied service → the proxy's address that stands for it (owned by the proxy host).
PROXY_FOR: dict[str, int] = {
    "k1": 111,
    "k2": 112,
    "k3": 113,
    "redis": 121,
    "pg": 122,
    "provider": 123,
}
BROKERS = ("k1", "k2", "k3")


def namespace(host: str) -> str:
    return f"{PREFIX}{host}"


def address(host: str) -> str:
    return f"{SUBNET}.{HOSTS[host]}"


def proxy_address(service: str) -> str:
    return f"{SUBNET}.{PROXY_FOR[service]}"


def peer_link(host: str) -> str:
    """The bridge-side end of a host's veth pair (≤ 15 characters)."""
    return f"v-{host}"


def up_commands() -> list[list[str]]:
    """Every `ip` command that builds the network, in order."""
    commands = [
        ["ip", "netns", "add", BRIDGE_NS],
        ["ip", "-n", BRIDGE_NS, "link", "set", "lo", "up"],
        ["ip", "-n", BRIDGE_NS, "link", "add", BRIDGE, "type", "bridge"],
        ["ip", "-n", BRIDGE_NS, "link", "set", BRIDGE, "up"],
    ]
    for host, octet in HOSTS.items():
        ns, peer = namespace(host), peer_link(host)
        commands += [
            ["ip", "netns", "add", ns],
            ["ip", "-n", ns, "link", "set", "lo", "up"],
            # Created inside the bridge namespace, its peer directly in the host's: the
            # machine's own namespace never holds either end.
            [
                "ip",
                "-n",
                BRIDGE_NS,
                "link",
                "add",
                peer,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                ns,
            ],
            ["ip", "-n", BRIDGE_NS, "link", "set", peer, "master", BRIDGE, "up"],
            ["ip", "-n", ns, "addr", "add", f"{SUBNET}.{octet}/24", "dev", "eth0"],
        ]
        if host == "proxy":
            commands += [
                ["ip", "-n", ns, "addr", "add", f"{SUBNET}.{extra}/24", "dev", "eth0"]
                for extra in PROXY_FOR.values()
            ]
        commands.append(["ip", "-n", ns, "link", "set", "eth0", "up"])
    return commands


def namespaces() -> list[str]:
    return [BRIDGE_NS, *(namespace(h) for h in HOSTS)]


def blackhole(host: str, destinations: Sequence[str], *, on: bool) -> None:
    """Drop everything ``host`` sends to ``destinations`` (addresses or prefixes): a cut that
    needs no firewall. Locally sent packets towards a blackhole are discarded (new
    connections fail at once; established ones see silence), which severs TCP both ways."""
    for destination in destinations:
        prefix = destination if "/" in destination else f"{destination}/32"
        action = "add" if on else "del"
        ip("-n", namespace(host), "route", action, "blackhole", prefix, check=on)


# Run inside a host's namespace by `connects`: exit 0 when the TCP connection is accepted
# (and, given a request, its answer holds what is expected).
_CONNECT = """\
import socket, sys
host, port, timeout, request, expect = sys.argv[1:]
with socket.create_connection((host, int(port)), timeout=float(timeout)) as sock:
    if request:
        sock.sendall(bytes.fromhex(request))
        answer = b""
        while bytes.fromhex(expect) not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                sys.exit(f"closed after {answer!r}")
            answer += chunk
"""


def connects(
    host: str,
    destination: str,
    port: int,
    timeout: float = 3.0,
    *,
    request: bytes = b"",
    expect: bytes = b"",
) -> bool:
    """Whether a TCP connection from inside ``host``'s namespace to ``destination:port`` is
    accepted within ``timeout`` s (and, given ``request``, answered with ``expect``): the
    probe that shows a cut in force (towards a blackholed address a connection fails at once;
    from the other side its answers are dropped, so it times out) and healed again."""
    done = subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            namespace(host),
            sys.executable,
            "-S",
            "-c",
            _CONNECT,
            destination,
            str(port),
            str(timeout),
            request.hex(),
            expect.hex(),
        ],
        capture_output=True,
        timeout=timeout + 60,  # the interpreter's start on a loaded machine
        check=False,
    )
    return done.returncode == 0


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")
    return done


def existing() -> list[str]:
    listed = ip("netns", "list").stdout.split()
    return [name for name in listed if name.startswith(PREFIX)]


def pids_in(ns: str) -> list[int]:
    done = ip("netns", "pids", ns, check=False)
    return [int(p) for p in done.stdout.split() if p.isdigit()]


def up() -> None:
    if existing():
        raise SystemExit(f"partitions: namespaces left from an earlier run: {existing()}")
    for command in up_commands():
        done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
        if done.returncode != 0:
            raise SystemExit(f"partitions: {' '.join(command)} failed: {done.stderr.strip()}")


def _end_processes(names: list[str]) -> None:
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        pids = [p for ns in names for p in pids_in(ns)]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while any(pids_in(ns) for ns in names) and time.monotonic() < deadline:
            time.sleep(0.2)


def down() -> None:
    """End every process left in our namespaces (TERM, then KILL), then delete them; the
    veth pairs and bridge go with their namespaces."""
    names = existing()
    _end_processes(names)
    for ns in names:
        ip("netns", "del", ns, check=False)
    for pid, _command in tagged_processes():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # started by us, outside the namespaces


def leftovers() -> list[str]:
    """What a run left behind: namespaces, links or routes in our range in the machine's own
    namespace, processes inside our namespaces."""
    found = [f"namespace {ns} ({len(pids_in(ns))} processes)" for ns in existing()]
    ours = {peer_link(h) for h in HOSTS} | {BRIDGE_NS}
    links = ip("-o", "link", "show").stdout.splitlines()
    found += [
        f"link {name}"
        for line in links
        if (name := line.split(":")[1].strip().split("@")[0]) in ours
    ]
    routes = ip("route", "show", "table", "all").stdout.splitlines()
    found += [f"route {line}" for line in routes if SUBNET + "." in line]
    addresses = ip("-o", "addr", "show").stdout.splitlines()
    found += [f"address {line}" for line in addresses if f" {SUBNET}." in line]
    found += [f"process {pid}: {cmd}" for pid, cmd in tagged_processes()]
    return found


# Every process the suite starts carries this variable (the driver passes it on), so that
# one left running anywhere — even in a namespace already deleted — is found by the check.
RUN_TAG = "PARTITIONS_RUN_ID"


def tagged_processes() -> list[tuple[int, str]]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as environ:
                tagged = f"{RUN_TAG}=".encode() in environ.read()
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                command = cmdline.read().replace(b"\0", b" ").decode(errors="replace")[:120]
        except OSError:
            continue  # gone meanwhile, or a kernel thread
        if tagged:
            found.append((int(entry), command))
    return found


def main(argv: Sequence[str]) -> int:
    action = argv[0] if argv else ""
    if action == "up":
        up()
        print(f"partitions: network up ({len(HOSTS)} hosts in {SUBNET}.0/24)")
        return 0
    if action == "down":
        down()
        return 0
    if action == "check":
        left = leftovers()
        for item in left:
            print(f"partitions: left behind: {item}", file=sys.stderr)
        if not left:
            print("partitions: nothing left behind (namespaces, links, routes, processes)")
        return 1 if left else 0
    print("usage: python -m tests.partitions.network up|down|check", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
