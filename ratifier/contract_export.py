"""Write one JSON Schema file per contract record, the AsyncAPI 3 document of every topic and
the OpenAPI 3.1 documents of the HTTP APIs (approvals, dashboard):
``python -m ratifier.contract_export [DIR]``; ``--check [DIR]`` lists the stale files."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import schemas
from ratifier import asyncapi, openapi
from schemas.envelopes import CONTRACT_RECORDS

DEFAULT_DIR = Path(schemas.__file__).parent / "json"
ASYNCAPI_FILE = "asyncapi.json"


def render() -> dict[str, str]:
    """File name → JSON text, for every record of the contract, the AsyncAPI document and
    the OpenAPI documents (``openapi.APPROVALS_FILE``, ``openapi.DASHBOARD_FILE``)."""
    files: dict[str, str] = {}
    for topic, model in sorted(CONTRACT_RECORDS.items()):
        schema = model.model_json_schema(mode="validation")
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        schema["$id"] = f"https://ratifier.dev/schemas/v1/{topic}.json"
        schema["x-topic"] = topic
        files[f"{topic}.json"] = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    files[ASYNCAPI_FILE] = json.dumps(asyncapi.render(), indent=2) + "\n"
    for name, document in openapi.render().items():
        files[name] = json.dumps(document, indent=2) + "\n"
    return files


def write(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render().items():
        path = directory / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def stale(directory: Path) -> list[str]:
    """The files under ``directory`` that differ from what the models render."""
    return [
        name
        for name, text in render().items()
        if not (directory / name).is_file()
        or (directory / name).read_text(encoding="utf-8") != text
    ]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--check"]:
        directory = Path(args[1]) if len(args) > 1 else DEFAULT_DIR
        outdated = stale(directory)
        for name in outdated:
            print(f"stale: {directory / name} (run `make schemas`)", file=sys.stderr)
        return 1 if outdated else 0
    directory = Path(args[0]) if args else DEFAULT_DIR
    for path in write(directory):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
