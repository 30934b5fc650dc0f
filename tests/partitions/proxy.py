"""A small userspace TCP proxy that stands on every link of `make partitions` (the kernel here
has no netem): each route forwards one listening address to one service, byte for byte,
until told to make the link bad:

- delay: every chunk is held ``delay_ms`` ± ``jitter_ms`` (uniform) before it is passed on,
  never overtaking the chunk before it (TCP stays in order);
- resets: every connection, new or established, is reset (RST, as a dropped NAT entry or a
  crashed middlebox does) with ``reset_probability`` per ``reset_interval_s``; a new
  connection is also reset at once with that probability.

    python -m tests.partitions.proxy --control 10.77.0.100:7000 \\
        --route 10.77.0.121:6379=10.77.0.21:6379 --route ...

The control port takes one JSON line, ``{"delay_ms": 300, "jitter_ms": 100,
"reset_probability": 0.05}`` (all optional; ``{}`` heals), and answers one JSON line with the
counters. The decisions are pure functions of the settings and a random draw (unit-tested).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import socket
import struct
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

CHUNK = 65536


@dataclass(frozen=True, kw_only=True)
class LinkFaults:
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    reset_probability: float = 0.0
    reset_interval_s: float = 10.0

    def __post_init__(self) -> None:
        if self.delay_ms < 0 or self.jitter_ms < 0 or self.jitter_ms > self.delay_ms:
            raise ValueError("need 0 <= jitter_ms <= delay_ms")
        if not 0.0 <= self.reset_probability <= 1.0:
            raise ValueError("reset_probability is a probability")
        if self.reset_interval_s <= 0:
            raise ValueError("reset_interval_s must be positive")

    @classmethod
    def parse(cls, line: bytes) -> LinkFaults:
        body = json.loads(line or b"{}")
        if not isinstance(body, dict):
            raise ValueError("a JSON object")
        return cls(**{k: float(v) for k, v in body.items()})

    def delay_s(self, draw: float) -> float:
        """The delay of one chunk for a uniform ``draw`` in [0, 1)."""
        return (self.delay_ms + self.jitter_ms * (2 * draw - 1)) / 1000.0

    def resets(self, draw: float) -> bool:
        return draw < self.reset_probability


def due_at(arrived: float, delay_s: float, previous_due: float) -> float:
    """When a chunk may leave: after its own delay and never before the chunk ahead of it
    (jitter delays, it never reorders a byte stream)."""
    return max(arrived + delay_s, previous_due)


@dataclass
class Counters:
    connections: int = 0
    open: int = 0
    resets: int = 0
    refused: int = 0
    bytes: int = 0


@dataclass
class Proxy:
    routes: dict[tuple[str, int], tuple[str, int]]
    faults: LinkFaults = field(default_factory=LinkFaults)
    rng: random.Random = field(default_factory=random.Random)
    counters: Counters = field(default_factory=Counters)

    async def serve(self, control: tuple[str, int]) -> None:
        servers = [
            await asyncio.start_server(self._route(target), host, port, reuse_address=True)
            for (host, port), target in self.routes.items()
        ]
        servers.append(await asyncio.start_server(self._control, *control, reuse_address=True))
        print(f"proxy: {len(self.routes)} routes, control on {control[0]}:{control[1]}", flush=True)
        await asyncio.gather(*(s.serve_forever() for s in servers))

    def _route(
        self, target: tuple[str, int]
    ) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
        async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._connection(reader, writer, target)

        return connected

    async def _control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await reader.readline()
            try:
                self.faults = LinkFaults.parse(line.strip())
                answer: dict[str, object] = {"ok": True, **self.counters.__dict__}
                print(f"proxy: faults now {self.faults}", flush=True)
            except (ValueError, TypeError) as bad:
                answer = {"ok": False, "error": str(bad)}
            writer.write(json.dumps(answer).encode() + b"\n")
            await writer.drain()
        finally:
            writer.close()

    async def _connection(
        self,
        client_reader: asyncio.StreamReader,
        client_writer: asyncio.StreamWriter,
        target: tuple[str, int],
    ) -> None:
        self.counters.connections += 1
        if self.faults.resets(self.rng.random()):
            self.counters.resets += 1
            _reset(client_writer)
            return
        try:
            upstream_reader, upstream_writer = await asyncio.wait_for(
                asyncio.open_connection(*target), timeout=10
            )
        except (OSError, TimeoutError):
            self.counters.refused += 1
            _reset(client_writer)  # as the unreachable service would look to the client
            return
        self.counters.open += 1
        pipes = [
            asyncio.create_task(self._pipe(client_reader, upstream_writer)),
            asyncio.create_task(self._pipe(upstream_reader, client_writer)),
        ]
        watch = asyncio.create_task(self._maybe_reset(client_writer, upstream_writer))
        try:
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            for task in pipes:
                task.cancel()
            for writer in (client_writer, upstream_writer):
                writer.close()
            self.counters.open -= 1

    async def _maybe_reset(self, *writers: asyncio.StreamWriter) -> None:
        while True:
            await asyncio.sleep(self.faults.reset_interval_s)
            if self.faults.resets(self.rng.random()):
                self.counters.resets += 1
                for writer in writers:
                    _reset(writer)
                return

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        sender = asyncio.create_task(self._send(queue, writer))
        previous = 0.0
        try:
            while chunk := await reader.read(CHUNK):
                delay = self.faults.delay_s(self.rng.random()) if self.faults.delay_ms else 0.0
                previous = due_at(time.monotonic(), delay, previous)
                queue.put_nowait((previous, chunk))
            queue.put_nowait((previous, b""))  # the end of the stream, in its turn
            await sender
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            sender.cancel()

    async def _send(
        self, queue: asyncio.Queue[tuple[float, bytes]], writer: asyncio.StreamWriter
    ) -> None:
        with contextlib.suppress(OSError):
            while True:
                due, chunk = await queue.get()
                if (wait := due - time.monotonic()) > 0:
                    await asyncio.sleep(wait)
                if not chunk:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(chunk)
                self.counters.bytes += len(chunk)
                await writer.drain()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with SO_LINGER 0: the peer gets a RST, not an orderly FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def parse_address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"not HOST:PORT: {text!r}")
    return host, int(port)


def parse_route(text: str) -> tuple[tuple[str, int], tuple[str, int]]:
    listen, sep, target = text.partition("=")
    if not sep:
        raise ValueError(f"not LISTEN=TARGET: {text!r}")
    return parse_address(listen), parse_address(target)


def control(address: tuple[str, int], faults: dict[str, float]) -> dict[str, object]:
    """Set the proxy's faults (``{}`` heals every link); its counters come back."""
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(json.dumps(faults).encode() + b"\n")
        answer = sock.makefile("rb").readline()
    body = json.loads(answer)
    if not isinstance(body, dict) or not body.get("ok"):
        raise RuntimeError(f"proxy refused {faults}: {body}")
    return body


def round_trip(
    address: tuple[str, int], request: bytes, answer: bytes, timeout: float = 10
) -> float:
    """Seconds from sending ``request`` on a new connection to ``address`` until ``answer`` is
    in: how slow a link is (through the proxy: both directions' delays)."""
    with socket.create_connection(address, timeout=timeout) as sock:
        started = time.monotonic()
        sock.sendall(request)
        received = b""
        while answer not in received:
            chunk = sock.recv(4096)
            if not chunk:
                raise ConnectionError(f"{address} closed before answering")
            received += chunk
        return time.monotonic() - started


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.partitions.proxy")
    parser.add_argument("--control", required=True, type=parse_address)
    parser.add_argument("--route", action="append", required=True, type=parse_route)
    args = parser.parse_args(argv)
    proxy = Proxy(routes=dict(args.route))
    asyncio.run(proxy.serve(args.control))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
