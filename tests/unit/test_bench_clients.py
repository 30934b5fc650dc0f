"""bench/ builds its Kafka, Redis and PostgreSQL clients with runtime/clients.py, like the
services, so a benchmark measures the clients the pipeline runs with (security, limits)."""

from __future__ import annotations

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
DIRECT = {"AIOKafkaProducer", "AIOKafkaConsumer", "AIOKafkaAdminClient"}
DIRECT_ATTRIBUTES = {("psycopg", "connect"), ("Redis", "from_url"), ("redis", "Redis")}


def direct_constructions(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in DIRECT:
            found.append(f"{func.id} (line {node.lineno})")
        if (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and (func.value.id, func.attr) in DIRECT_ATTRIBUTES
        ):
            found.append(f"{func.value.id}.{func.attr} (line {node.lineno})")
    return found


def test_the_check_finds_a_client_built_by_hand() -> None:
    assert direct_constructions("p = AIOKafkaProducer(bootstrap_servers='x')\n")
    assert direct_constructions("c = psycopg.connect(url)\n")


def test_bench_builds_every_client_through_runtime_clients() -> None:
    offenders = {
        path.name: found
        for path in sorted(BENCH.glob("*.py"))
        if (found := direct_constructions(path.read_text()))
    }
    assert offenders == {}
