"""Write one JSON Schema file per contract record: ``python -m schemas.export [DIR]``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from schemas.envelopes import CONTRACT_RECORDS

DEFAULT_DIR = Path(__file__).parent / "json"


def render() -> dict[str, str]:
    """File name → JSON text, for every record of the contract."""
    files: dict[str, str] = {}
    for topic, model in sorted(CONTRACT_RECORDS.items()):
        schema = model.model_json_schema(mode="validation")
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        schema["$id"] = f"https://ratifier.dev/schemas/v1/{topic}.json"
        schema["x-topic"] = topic
        files[f"{topic}.json"] = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    return files


def write(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render().items():
        path = directory / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    directory = Path(args[0]) if args else DEFAULT_DIR
    for path in write(directory):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
