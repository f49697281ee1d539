"""Tuning specs: versioned JSON, checked against a published JSON Schema.

Keys are written sorted with a fixed indent, and nothing that varies between
two identical runs (clock times, paths, run ids) goes in, so that the same
seed gives a byte-identical spec and ``git diff`` of a spec shows only real
changes.
"""
from __future__ import annotations

import json
import os
import re
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema

SCHEMA_VERSION = 1


class SpecError(ValueError):
    """A spec that cannot be read: malformed, invalid, or from a newer planforge."""


@lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    """The JSON Schema of the current spec version (``spec.schema.json`` in this package)."""
    return json.loads(resources.files("planforge.spec").joinpath("spec.schema.json").read_text())


def dumps(spec: dict[str, Any]) -> str:
    return json.dumps(spec, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"


def validate(spec: Any, source: str = "spec") -> dict[str, Any]:
    """Check ``spec`` (a parsed object) and return it; ``SpecError`` says what is wrong and where."""
    if not isinstance(spec, dict):
        raise SpecError(f"{source}: expected a JSON object at the top level, got {type(spec).__name__}")
    version = spec.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise SpecError(f"{source}: missing or non-integer 'schema_version'; is this a planforge spec?")
    if version > SCHEMA_VERSION:
        raise SpecError(f"{source}: written by a newer planforge (schema version {version}; this planforge reads up "
                        f"to {SCHEMA_VERSION}); upgrade planforge to read it")
    if version < 1:
        raise SpecError(f"{source}: schema version {version} does not exist")
    errors = sorted(jsonschema.Draft202012Validator(schema()).iter_errors(spec), key=lambda e: list(e.absolute_path))
    if errors:
        lines = []
        for e in errors[:5]:
            where = "/".join(str(p) for p in e.absolute_path) or "(top level)"
            lines.append(f"at {where}: {e.message}")
        more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
        raise SpecError(f"{source}: does not match the spec schema v{SCHEMA_VERSION}:\n  " + "\n  ".join(lines) + more)
    return spec


def spec_filename(target: str | None = None) -> str:
    """``spec.json``; for another device fingerprint tuned in the same run (a
    heterogeneous cluster), ``spec-TARGET.json``, each character of the
    fingerprint other than a letter, digit, ``.``, ``_`` or ``-`` written ``-``.
    The spec inside names its fingerprint in full (``target.fingerprint``)."""
    if not target:
        return "spec.json"
    return f"spec-{re.sub(r'[^A-Za-z0-9._-]', '-', target)}.json"


def write_spec(spec: dict[str, Any], path: str | os.PathLike) -> Path:
    """Validate and write ``spec`` atomically (a partial file never replaces a good one)."""
    validate(spec, "new spec")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(dumps(spec))
    os.replace(tmp, path)
    return path


def load_spec(path: str | os.PathLike) -> dict[str, Any]:
    """Read and validate a spec file."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise SpecError(f"{path}: no such spec file") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as e:
        raise SpecError(f"{path}: cannot read: {e}") from None
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    return validate(spec, str(path))
