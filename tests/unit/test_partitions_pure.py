"""The pure parts of `make partitions`: the proxy's fault decisions, its byte-stream order,
the address plan of the namespaces, and the table."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import pytest

from tests.partitions import network, report
from tests.partitions.proxy import LinkFaults, Proxy, due_at, parse_route


def test_delay_spans_the_jitter_around_the_mean() -> None:
    faults = LinkFaults(delay_ms=300, jitter_ms=100)
    assert faults.delay_s(0.0) == pytest.approx(0.2)
    assert faults.delay_s(0.5) == pytest.approx(0.3)
    assert faults.delay_s(0.999999) == pytest.approx(0.4, abs=1e-4)
    assert LinkFaults().delay_s(0.7) == 0.0


def test_reset_follows_the_probability() -> None:
    faults = LinkFaults(reset_probability=0.05)
    assert faults.resets(0.01)
    assert not faults.resets(0.05)
    assert not LinkFaults().resets(0.0)


@pytest.mark.parametrize(
    "body",
    [
        {"jitter_ms": 50},  # jitter larger than the delay
        {"reset_probability": 1.5},
        {"reset_interval_s": 0},
        {"loss": 0.1},  # no such setting
    ],
)
def test_bad_settings_are_refused(body: dict[str, float]) -> None:
    with pytest.raises((ValueError, TypeError)):
        LinkFaults.parse(json.dumps(body).encode())


def test_empty_settings_heal_every_link() -> None:
    assert LinkFaults.parse(b"{}") == LinkFaults()


def test_a_chunk_never_overtakes_the_one_before() -> None:
    first = due_at(10.0, 0.4, 0.0)
    second = due_at(10.1, 0.2, first)  # shorter jitter, but it waits its turn
    assert first == pytest.approx(10.4)
    assert second == pytest.approx(10.4)
    assert due_at(11.0, 0.2, second) == pytest.approx(11.2)


def test_routes_parse() -> None:
    assert parse_route("10.77.0.121:6379=10.77.0.21:6379") == (
        ("10.77.0.121", 6379),
        ("10.77.0.21", 6379),
    )
    with pytest.raises(ValueError, match="LISTEN=TARGET"):
        parse_route("10.77.0.121:6379")


@pytest.mark.timeout(10)
async def test_the_proxy_forwards_in_order_with_its_delay() -> None:
    """Through a real loopback socket pair: bytes arrive whole, in order, no sooner than the
    delay allows."""
    received = bytearray()
    done = asyncio.Event()

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while chunk := await reader.read(1024):
            received.extend(chunk)
            if len(received) >= 3000:
                done.set()
        writer.close()

    upstream = await asyncio.start_server(echo, "127.0.0.1", 0)
    target = upstream.sockets[0].getsockname()[:2]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        listen = probe.getsockname()[:2]
    proxy = Proxy(routes={listen: target}, faults=LinkFaults(delay_ms=100, jitter_ms=50))
    serving = asyncio.create_task(proxy.serve(("127.0.0.1", 0)))
    try:
        for _ in range(50):
            try:
                _, writer = await asyncio.open_connection(*listen)
                break
            except OSError:
                await asyncio.sleep(0.05)
        loop = asyncio.get_running_loop()
        started = loop.time()
        for n in range(3):
            writer.write(bytes([n]) * 1000)
            await writer.drain()
        await asyncio.wait_for(done.wait(), timeout=5)
        assert loop.time() - started >= 0.05
        assert bytes(received) == b"\x00" * 1000 + b"\x01" * 1000 + b"\x02" * 1000
        writer.close()
        await writer.wait_closed()
        while proxy.counters.open:  # noqa: ASYNC110 - the proxy closes both ends in its time
            await asyncio.sleep(0.05)
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        upstream.close()
        await upstream.wait_closed()


def test_every_host_has_its_own_address_in_the_private_range() -> None:
    addresses = [network.address(h) for h in network.HOSTS]
    addresses += [network.proxy_address(s) for s in network.PROXY_FOR]
    assert len(set(addresses)) == len(addresses)
    assert all(a.startswith("10.77.0.") for a in addresses)


def test_the_network_is_built_only_inside_our_namespaces() -> None:
    commands = network.up_commands()
    for command in commands:
        # Every command names one of our namespaces (ip -n NS, or ip netns add NS): none
        # touches the machine's own namespace.
        assert command[1] == "-n" or command[1:3] == ["netns", "add"], command
        target = command[2] if command[1] == "-n" else command[3]
        assert target.startswith(network.PREFIX), command
    assert all(len(network.peer_link(h)) <= 15 for h in network.HOSTS)


def test_the_table_has_a_row_per_fault() -> None:
    rows: list[dict[str, Any]] = [
        {
            "fault": "broker_minority",
            "calls": 700,
            "lost": 0,
            "duplicate_effects": 0,
            "two_final_outcomes": 0,
            "effects_equal_ledger": True,
            "recovery_seconds": 3.2,
            "max_latency_seconds": 12.5,
            "max_answer_pause_seconds": 4.0,
            "commit_lag_total": 0,
        },
        {"fault": "slow_links", "recovery_seconds": None, "effects_equal_ledger": False},
    ]
    lines = report.render(rows).splitlines()
    assert lines[0].startswith("| fault | calls | lost | duplicates | two finals |")
    assert lines[2] == "| broker_minority | 700 | 0 | 0 | 0 | yes | 3.2 | 12.5 | 4.0 | 0 |"
    assert "| never |" in lines[3] and "| NO |" in lines[3]


def test_the_longest_pause_counts_the_window_edges() -> None:
    assert report.max_pause([2.0, 3.0, 9.0], 0.0, 10.0) == 6.0
    assert report.max_pause([], 0.0, 4.0) == 4.0
    assert report.max_pause([0.5, 50.0], 0.0, 1.0) == 0.5  # outside the window: ignored


def test_violations_name_what_broke() -> None:
    clean = {
        "lost": 0,
        "duplicate_effects": 0,
        "two_final_outcomes": 0,
        "history_problems": 0,
        "effects_equal_ledger": True,
        "streams_commit_lag": {},
        "answer_pause_bound_seconds": 20.0,
        "max_answer_pause_seconds": 5.0,
    }
    assert report.violations(clean) == []
    broken = {**clean, "lost": 2, "effects_equal_ledger": False, "max_answer_pause_seconds": 25}
    found = report.violations(broken)
    assert "lost=2" in found
    assert "provider effects differ from the ledger" in found
    assert any("answers paused" in f for f in found)
