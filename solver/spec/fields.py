"""Reading user files with precise errors: the one place where input values are checked.

Every loader reads its tables through :class:`Fields`, which records which keys were used, checks
types and ranges, and raises :class:`~solver.spec.errors.InputError` naming the file, the dotted key and
what is allowed. ``done()`` rejects unknown keys, so a typo never passes silently.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import tempfile
import tomllib
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable

from solver.spec.errors import InputError

#: How alike (difflib ratio) an unknown key must be to an allowed one for the message to suggest
#: it: ``global_bacth`` / ``global_batch`` 0.92, ``clustr`` / ``cluster`` 0.92, ``hidden`` /
#: ``heads`` 0.55 (too far to guess; the message lists the allowed keys instead).
TYPO_CUTOFF = 0.8
_TYPE_NAMES = MappingProxyType({int: "an integer", float: "a number", str: "a string", bool: "true or false",
               dict: "a table", list: "a list"})


def _read_text(path: Path) -> str:
    """The file's text; the reason it cannot be read in plain words."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        reason = "no such file"
    except IsADirectoryError:
        reason = "is a directory, not a file"
    except PermissionError:
        reason = "permission denied"
    except UnicodeDecodeError:
        reason = "not a UTF-8 text file"
    except OSError as exc:
        reason = exc.strerror or "cannot be read"
    raise InputError(str(path), "<file>", f"cannot read: {reason}")


def write_atomic(path: Path | str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename, so a reader never sees
    a half-written file (and a failed write leaves the old one)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


def closest(name: str, names) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``names`` to ``name``, or ''."""
    found = difflib.get_close_matches(name, list(names), n=1, cutoff=0.5)
    return f" (did you mean {found[0]!r}?)" if found else ""


def read_toml(path: Path | str) -> dict:
    """Parse a TOML file; empty, unreadable or invalid files raise InputError."""
    path = Path(path)
    text = _read_text(path)
    if not text.strip():
        raise InputError(str(path), "<file>", "file is empty")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(str(path), "<file>", f"invalid TOML: {exc}") from None


def read_json(path: Path | str) -> Any:
    """Parse a JSON file; empty, unreadable or invalid files raise InputError."""
    path = Path(path)
    text = _read_text(path)
    if not text.strip():
        raise InputError(str(path), "<file>", "file is empty")
    try:
        return json.loads(text, parse_constant=lambda c: float(c))
    except (json.JSONDecodeError, RecursionError) as exc:
        raise InputError(str(path), "<file>", f"invalid JSON: {exc}") from None


def _type_ok(value: Any, kind: type) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, kind)


class Fields:
    """Typed, range-checked access to one table of a user file.

    Parameters
    ----------
    data : Any
        The parsed table (must be a dict, else InputError).
    file : str
        File name for messages.
    prefix : str
        Dotted key path of this table (``""`` at top level).
    """

    def __init__(self, data: Any, file: str, prefix: str = "") -> None:
        self.file = str(file)
        self.prefix = prefix
        if not isinstance(data, dict):
            raise InputError(self.file, prefix or "<file>", f"must be a table, got {_kind(data)}")
        self.data = data
        self._used: set[str] = set()

    def key(self, name: str) -> str:
        """Dotted path of ``name`` inside this table."""
        return f"{self.prefix}.{name}" if self.prefix else name

    def error(self, name: str, reason: str) -> InputError:
        """An InputError for key ``name`` of this table."""
        return InputError(self.file, self.key(name), reason)

    def has(self, name: str) -> bool:
        """True when the key is present."""
        return name in self.data

    def get(self, name: str, kind: type, default: Any = ..., *, lo: float | None = None,
            hi: float | None = None, lo_open: bool = False, choices: Any = None) -> Any:
        """Value of ``name`` checked for type, finiteness, range and choices.

        ``default=...`` makes the key required. ``lo_open`` makes ``lo`` exclusive.
        """
        self._used.add(name)
        if name not in self.data:
            if default is ...:
                raise self._missing(name)
            return default
        value = self.data[name]
        if not _type_ok(value, kind):
            raise self.error(name, f"must be {_TYPE_NAMES.get(kind, kind.__name__)}, got {_kind(value)}")
        if kind in (int, float):
            self._check_range(name, value, lo, hi, lo_open)
            value = float(value) if kind is float else value
        if choices is not None and value not in choices:
            allowed = ", ".join(repr(c) for c in choices)
            raise self.error(name, f"{value!r} is not one of {allowed}")
        return value

    def _missing(self, name: str) -> InputError:
        """A required key is absent: name the unknown key that looks like its typo, if any (the
        typo is what the user wrote, so it is what the message names)."""
        typo = next((k for k in self.data if k not in self._used and is_typo(k, name)), None)
        if typo is not None:
            return self.error(typo, f"unknown key {typo} (did you mean {name}?)")
        return self.error(name, "missing required key")

    def _check_range(self, name: str, value: float, lo: float | None, hi: float | None,
                     lo_open: bool) -> None:
        if isinstance(value, float) and not math.isfinite(value):
            raise self.error(name, f"must be finite, got {value}")
        if lo is not None and (value <= lo if lo_open else value < lo):
            raise self.error(name, f"must be {'>' if lo_open else '>='} {lo:g}, got {value:g}")
        if hi is not None and value > hi:
            raise self.error(name, f"must be <= {hi:g}, got {value:g}")

    def get_enum(self, name: str, enum_type: type, default: Any = ...) -> Any:
        """Enum member named by the string value of ``name``."""
        allowed = [m.value for m in enum_type]
        raw = self.get(name, str, ... if default is ... else default.value, choices=allowed)
        return enum_type(raw)

    def sub(self, name: str, required: bool = False) -> "Fields | None":
        """The nested table ``name`` (None when absent and not required)."""
        self._used.add(name)
        if name not in self.data:
            if required:
                raise self.error(name, "missing required table")
            return None
        return Fields(self.data[name], self.file, self.key(name))

    def only(self, *names: str) -> None:
        """Reject unknown keys before reading any (a typo is reported before what it hides)."""
        unknown = sorted(set(self.data) - set(names))
        if unknown:
            raise self.error(unknown[0], _unknown(unknown[0], names))

    def done(self) -> None:
        """Reject keys that were never read: they are typos or unsupported options."""
        unknown = sorted(set(self.data) - self._used)
        if unknown:
            raise self.error(unknown[0], _unknown(unknown[0], self._used))

    def check(self, name: str, ok: bool, reason: str) -> None:
        """Raise an InputError on ``name`` with ``reason`` unless ``ok``."""
        if not ok:
            raise self.error(name, reason)


def is_typo(written: str, meant: str) -> bool:
    """``written`` is ``meant`` with one slip: a letter added, dropped or changed, or two
    neighbours swapped (``global_bacth``), ``meant`` at least 4 letters long. Stricter than the
    similarity of :func:`_unknown`, because here ``written`` may be a real key read later
    (``fp16_tflops`` beside a missing ``bf16_tflops`` is two slips away: not a typo)."""
    if len(meant) < 4 or written == meant or abs(len(written) - len(meant)) > 1:
        return False
    return _slips(written, meant) <= 1


def _slips(a: str, b: str) -> int:
    """Optimal-string-alignment distance: insertions, deletions, substitutions and swaps of
    adjacent letters."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], prev2[j - 2] + 1)
        prev2, prev = prev, row
    return prev[-1]


def _unknown(key: str, allowed) -> str:
    """``unknown key global_bacth (did you mean global_batch?)``, or the allowed keys when none
    is close."""
    close = difflib.get_close_matches(key, sorted(allowed), n=1, cutoff=TYPO_CUTOFF)
    if close:
        return f"unknown key {key} (did you mean {close[0]}?)"
    return f"unknown key (allowed: {', '.join(sorted(allowed)) or 'none'})"


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    for kind, text in ((int, "an integer"), (float, "a number"), (str, "a string"),
                       (dict, "a table"), (list, "a list")):
        if isinstance(value, kind):
            return f"{text} ({value!r})" if kind in (int, float, str) else text
    return type(value).__name__


def checked(fn: Callable[[], Any], file: str, key: str) -> Any:
    """Run ``fn`` and turn a ValueError from it into an InputError on ``key``."""
    try:
        return fn()
    except ValueError as exc:
        raise InputError(file, key, str(exc)) from None
