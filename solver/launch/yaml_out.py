"""YAML text of an export, written with PyYAML: block style for tables, flow style for lists
of scalars (``[8, 1, 1, 16, 1]``), so a reader sees a mesh or a stage's entry on one line."""

from __future__ import annotations

from typing import Any

import yaml

__all__ = ["dump"]


class _Dumper(yaml.SafeDumper):
    """SafeDumper that writes lists of scalars in flow style and never sorts keys."""


def _list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    flow = all(not isinstance(x, (list, dict)) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(list, _list)


def dump(data: dict[str, Any]) -> str:
    """``data`` as block-style YAML (keys in their order)."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                     allow_unicode=True, width=100)
