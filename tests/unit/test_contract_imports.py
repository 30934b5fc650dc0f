"""`schemas` is the wire contract only: it imports pydantic and the standard library, nothing
else (import-linter can only forbid named packages; this allows exactly these)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
ALLOWED = {"pydantic", "schemas"} | set(sys.stdlib_module_names)


def imported_roots(source: str) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_the_check_sees_a_third_party_import() -> None:
    assert imported_roots("import jwt\nfrom pydantic_settings import BaseSettings\n") == {
        "jwt",
        "pydantic_settings",
    }


def test_the_contract_imports_only_pydantic_and_the_standard_library() -> None:
    foreign = {
        path.name: sorted(imported_roots(path.read_text()) - ALLOWED)
        for path in sorted(SCHEMAS.glob("*.py"))
    }
    assert {name: roots for name, roots in foreign.items() if roots} == {}


def test_the_contract_holds_no_settings_identity_or_renderers() -> None:
    assert not {"settings.py", "identity.py", "asyncapi.py", "export.py"} & {
        p.name for p in SCHEMAS.glob("*.py")
    }
