#!/usr/bin/env python3
"""Check that a Kafka broker really answers the Kafka protocol (stdlib only).

It sends an ApiVersions v0 request, parses the answer, then sends a Metadata
request (highest non-flexible version the broker supports, v4..v8) and checks
that the broker lists at least one broker and has an active controller.

Usage:
    kafka_ready.py [--bootstrap 127.0.0.1:9092] [--timeout 3] [--wait 0] [--brokers 1] [-v]

--wait N retries for up to N seconds (0 = a single attempt).
--brokers N is ready only when the Metadata lists at least N brokers (a cluster).
Exit status: 0 ready, 1 not ready, 2 bad usage.
"""

from __future__ import annotations

import argparse
import socket
import struct
import sys
import time

API_METADATA = 3
API_VERSIONS = 18
CLIENT_ID = b"ratifier-ready"


class NotReady(Exception):
    pass


class Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise NotReady("truncated response")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def int8(self) -> int:
        value: int = struct.unpack(">b", self.take(1))[0]
        return value

    def int16(self) -> int:
        value: int = struct.unpack(">h", self.take(2))[0]
        return value

    def int32(self) -> int:
        value: int = struct.unpack(">i", self.take(4))[0]
        return value

    def string(self) -> str | None:
        n = self.int16()
        if n < 0:
            return None
        return self.take(n).decode("utf-8", "replace")


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise NotReady("connection closed by peer")
        buf += chunk
    return bytes(buf)


def _request(sock: socket.socket, api_key: int, version: int, corr: int, body: bytes) -> Reader:
    # Request header v1: api_key, api_version, correlation_id, client_id (nullable string).
    header = struct.pack(">hhih", api_key, version, corr, len(CLIENT_ID)) + CLIENT_ID
    payload = header + body
    sock.sendall(struct.pack(">i", len(payload)) + payload)
    size = struct.unpack(">i", _recv_exact(sock, 4))[0]
    if size < 4 or size > 64 * 1024 * 1024:
        raise NotReady(f"implausible response size {size} (not a Kafka broker?)")
    reader = Reader(_recv_exact(sock, size))
    got = reader.int32()  # response header v0: correlation_id
    if got != corr:
        raise NotReady(f"correlation id mismatch: sent {corr}, got {got}")
    return reader


def check(host: str, port: int, timeout: float, verbose: bool, min_brokers: int = 1) -> str:
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(timeout)

        # ApiVersions v0: empty body. A broker that does not support v0 still
        # answers in v0 format with UNSUPPORTED_VERSION (35) and its ranges.
        r = _request(sock, API_VERSIONS, 0, 1, b"")
        error = r.int16()
        count = r.int32()
        if count < 0 or count > 1000:
            raise NotReady(f"implausible ApiVersions array length {count}")
        versions: dict[int, tuple[int, int]] = {}
        for _ in range(count):
            key, vmin, vmax = r.int16(), r.int16(), r.int16()
            versions[key] = (vmin, vmax)
        if error not in (0, 35):
            raise NotReady(f"ApiVersions error code {error}")
        if API_METADATA not in versions:
            raise NotReady("broker does not advertise the Metadata API")
        if verbose:
            print(f"ApiVersions: {len(versions)} APIs (error={error})", file=sys.stderr)

        vmin, vmax = versions[API_METADATA]
        version = min(vmax, 8)
        if version < max(vmin, 4):
            # Only flexible Metadata versions left; ApiVersions answered, good enough.
            return f"ApiVersions ok ({len(versions)} APIs); Metadata v{vmin}-v{vmax} not probed"

        # Metadata v4..v8 body: topics = null (all topics), allow_auto_topic_creation=false,
        # v8+: include_cluster_authorized_operations, include_topic_authorized_operations.
        body = struct.pack(">i", -1) + b"\x00"
        if version >= 8:
            body += b"\x00\x00"
        r = _request(sock, API_METADATA, version, 2, body)
        if version >= 3:
            r.int32()  # throttle_time_ms
        brokers = []
        for _ in range(r.int32()):
            node_id = r.int32()
            bhost = r.string()
            bport = r.int32()
            r.string()  # rack
            brokers.append((node_id, bhost, bport))
        cluster_id = r.string()
        controller_id = r.int32()
        if len(brokers) < max(min_brokers, 1):
            raise NotReady(f"Metadata lists {len(brokers)} broker(s), want {min_brokers}")
        if controller_id < 0:
            raise NotReady("no active controller yet")
        listed = ", ".join(f"{n}@{h}:{p}" for n, h, p in brokers)
        return (
            f"cluster {cluster_id} brokers [{listed}] controller {controller_id} "
            f"(Metadata v{version})"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", default="127.0.0.1:9092", help="host:port")
    ap.add_argument("--timeout", type=float, default=3.0, help="socket timeout, seconds")
    ap.add_argument("--wait", type=float, default=0.0, help="retry for up to N seconds")
    ap.add_argument("--brokers", type=int, default=1, help="brokers the Metadata must list")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()

    host, _, port_s = args.bootstrap.rpartition(":")
    if not host or not port_s.isdigit():
        print(f"bad --bootstrap {args.bootstrap!r}, want host:port", file=sys.stderr)
        return 2
    port = int(port_s)

    deadline = time.monotonic() + max(args.wait, 0.0)
    while True:
        try:
            info = check(host, port, args.timeout, args.verbose, args.brokers)
            print(f"kafka ready at {host}:{port}: {info}")
            return 0
        except (OSError, NotReady, struct.error) as exc:
            last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() >= deadline:
            print(f"kafka not ready at {host}:{port}: {last}", file=sys.stderr)
            return 1
        time.sleep(1.0)


if __name__ == "__main__":
    sys.exit(main())
