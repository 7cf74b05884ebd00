"""A small YAML writer for nested dicts, lists and scalars (block style, lists of scalars in
flow style), enough for runtime configs without a YAML dependency."""

from __future__ import annotations

import json
from typing import Any


def scalar(value: Any) -> str:
    """One YAML scalar: booleans as true/false, strings quoted when YAML would read them as
    something else."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    plain = text.replace("_", "").replace("-", "").isalnum() and not text[0].isdigit() \
        and text.lower() not in ("true", "false", "yes", "no", "null", "on", "off")
    return text if plain else json.dumps(text)


def dump(data: dict[str, Any], indent: int = 0) -> str:
    """``data`` as block-style YAML."""
    pad, lines = " " * indent, []
    for key, value in data.items():
        if isinstance(value, dict):
            lines.append(f"{pad}{key}:")
            lines.append(dump(value, indent + 2).rstrip("\n"))
        elif isinstance(value, list):
            lines.append(f"{pad}{key}: {_flow(value)}")
        else:
            lines.append(f"{pad}{key}: {scalar(value)}")
    return "\n".join(lines) + "\n"


def _flow(items: list) -> str:
    return "[" + ", ".join(_flow(x) if isinstance(x, list) else scalar(x) for x in items) + "]"
