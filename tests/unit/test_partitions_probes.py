"""The pure parts of `make partitions`' fault probes (issue 43): a row fails on what the
chaos checks find and on a fault not seen in force; a skewed clock read from a `Date` header;
where libfaketime is found, and that a missing one is an error; a slowed link measured."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from tests.partitions import cluster, report
from tests.partitions.proxy import LinkFaults, Proxy, round_trip


def clean_row() -> dict[str, Any]:
    return {
        "fault": "executor_no_redis",
        "calls": 719,
        "unsent": 0,
        "provider_effects": 110,
        "lost": 0,
        "duplicate_effects": 0,
        "two_final_outcomes": 0,
        "history_problems": 0,
        "effects_equal_ledger": True,
        "streams_commit_lag": {},
        "unexpected_outcomes": {},
        "shortfalls": [],
        "fault_error": None,
        "evidence": "2 cut, 1 kept",
    }


def test_a_row_fails_on_wrong_answers_too_little_or_a_fault_not_in_force() -> None:
    assert report.violations(clean_row()) == []
    wrong = {**clean_row(), "unexpected_outcomes": {"foreign:succeeded": 2}}
    assert report.violations(wrong) == ["unexpected outcomes {'foreign:succeeded': 2}"]
    short = {**clean_row(), "shortfalls": ["12 calls acknowledged of 720 planned < 540"]}
    assert report.violations(short) == ["too little: 12 calls acknowledged of 720 planned < 540"]
    not_in_force = {**clean_row(), "fault_error": "FaultNotInForce('at the cut: e1->… connected')"}
    assert report.violations(not_in_force) == [
        "the fault failed: FaultNotInForce('at the cut: e1->… connected')"
    ]


def test_the_evidence_table_shows_what_each_row_amounted_to() -> None:
    rows = [
        clean_row(),
        {
            **clean_row(),
            "fault": "clock_skew",
            "calls": 600,
            "unsent": 3,
            "unexpected_outcomes": {"refund:expired/approval_expired": 4, "read:denied": 1},
            "shortfalls": ["x"],
            "fault_error": "FaultNotInForce(...)",
        },
    ]
    lines = report.render_evidence(rows).splitlines()
    assert lines[0].startswith("| fault | acknowledged (unsent) | provider effects |")
    assert lines[2] == "| executor_no_redis | 719 (0) | 110 | 0 | 0 | 2 cut, 1 kept |"
    assert lines[3] == "| clock_skew | 600 (3) | 110 | 5 | 1 | NO |"


def test_a_date_header_bounds_the_other_clock() -> None:
    # Read between 1000.2 and 1000.4 on our clock; the other clock said 1020 (truncated).
    stamp = "Thu, 01 Jan 1970 00:17:00 GMT"  # 1020 s
    low, high = cluster.offset_bounds(stamp, 1000.2, 1000.4)
    assert (low, high) == pytest.approx((19.6, 20.8))
    assert cluster.offset_agrees((low, high), 20)
    assert not cluster.offset_agrees((low, high), 0)
    true = cluster.offset_bounds("Thu, 01 Jan 1970 00:16:40 GMT", 1000.2, 1000.4)
    assert cluster.offset_agrees(true, 0)
    assert not cluster.offset_agrees(true, 20)


def test_faketime_is_found_through_its_package_or_the_multiarch_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    library = tmp_path / "faketime" / "libfaketime.so.1"
    library.parent.mkdir()
    library.write_bytes(b"")

    class Listed:
        stdout = f"/usr/share/doc/libfaketime\n{library}\n"

    monkeypatch.setattr("shutil.which", lambda _name: "/usr/bin/dpkg-query")
    monkeypatch.setattr("subprocess.run", lambda *_a, **_k: Listed())
    assert cluster.faketime_library() == library
    env = cluster.clock_ahead(20)
    assert env["LD_PRELOAD"] == str(library) and env["FAKETIME"] == "+20s"


def test_a_missing_faketime_is_an_error_not_an_unskewed_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cluster, "faketime_library", lambda: None)
    with pytest.raises(RuntimeError, match="libfaketime is not installed"):
        cluster.clock_ahead(20)


@pytest.mark.timeout(20)
async def test_a_slowed_proxy_is_measured_slow() -> None:
    """A PING-like round trip through a real proxy on loopback: fast, then at least twice
    (delay - jitter) once the link is slowed (each direction's chunk waits)."""

    async def pong(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(64):
            writer.write(b"+PONG\r\n")
            await writer.drain()
        writer.close()

    upstream = await asyncio.start_server(pong, "127.0.0.1", 0)
    target = upstream.sockets[0].getsockname()[:2]
    with socket.socket() as spare:
        spare.bind(("127.0.0.1", 0))
        listen = spare.getsockname()[:2]
    link = Proxy(routes={listen: target})
    serving = asyncio.create_task(link.serve(("127.0.0.1", 0)))
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                fast = await asyncio.to_thread(round_trip, listen, b"PING\r\n", b"+PONG")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)
        link.faults = LinkFaults(delay_ms=150, jitter_ms=50)
        slow = await asyncio.to_thread(round_trip, listen, b"PING\r\n", b"+PONG")
        while link.counters.open:  # noqa: ASYNC110 - the proxy closes both ends in its time
            await asyncio.sleep(0.05)
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        upstream.close()
        await upstream.wait_closed()
    assert fast < 0.2
    assert slow >= 0.2
