"""GPU catalogs of one's own: the entries of a catalog file or of a ``[[gpus]]`` table.

The shipped catalog ``instances/gpus.toml`` lists GPUs as ``[NAME]`` tables. A user catalog (the
file the environment variable ``TANGRAM_CATALOG`` names) may use that form or a ``[[gpus]]``
array of tables, each with a ``name``, the form a job or cluster file uses. Each entry adds a GPU
or, when a GPU of that name is known already, changes the fields it gives and keeps the others
(:func:`solver.spec.loaders.extend_catalog` applies them; this module only reads them, so that
every value is still checked in one place, the loaders' ``_gpu``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

from solver.spec.errors import InputError
from solver.spec.hardware import GPUSpec

#: What the optional kernel and link fields of a GPU entry are when the entry omits them
#: (``gemm_half_balance`` and ``gemm_latency_us``: the calibration's pooled fit, marked None;
#: ``nvlink_domain``: 8 where the GPU has NVLink, else 1). ``tangram islands`` names the fields
#: each GPU took from here.
DEFAULTS = MappingProxyType({
    "pcie_gbs": 32.0, "bf16": True, "gemm_eff": 0.80, "fp8_gemm_eff": 0.70,
    "gemm_half_balance": None, "gemm_latency_us": None, "attention": "fa2",
    "attention_eff": 0.50, "nvlink_domain": "8 with NVLink, else 1", "vendor": "nvidia"})
# Fields of GPUSpec that are not figures of the GPU (never written back as an entry's value).
_BOOKKEEPING = frozenset({"name", "defaults", "catalog_file"})


@dataclass(frozen=True)
class CatalogEntry:
    """One GPU entry as written: its name, its table (``name`` removed), where it was read.

    Attributes
    ----------
    name : str
        The GPU type's name.
    table : Mapping[str, Any]
        The entry's fields.
    file, key : str
        The file and the key path of the entry, for messages.
    """

    name: str
    table: Mapping[str, Any]
    file: str
    key: str


def file_entries(data: dict[str, Any], file: str) -> list[CatalogEntry]:
    """The entries of a catalog file: its ``[NAME]`` tables and its ``[[gpus]]`` array."""
    if not data:
        raise InputError(file, "<file>", "catalog defines no GPU")
    out: list[CatalogEntry] = []
    for name, table in data.items():
        if name == "gpus" and isinstance(table, list):
            out += gpus_entries(table, file, "gpus")
        elif not isinstance(table, dict):
            raise InputError(file, name, "must be a table of a GPU's figures (or use [[gpus]] "
                                         "entries with a name)")
        else:
            out.append(CatalogEntry(name, table, file, name))
    return out


def gpus_entries(raw: Any, file: str, key: str) -> list[CatalogEntry]:
    """The entries of a ``[[gpus]]`` array found at ``key`` of ``file``."""
    if not isinstance(raw, list) or not raw:
        raise InputError(file, key, "must be a non-empty array of [[gpus]] tables")
    out: list[CatalogEntry] = []
    for i, table in enumerate(raw):
        where = f"{key}[{i}]"
        if not isinstance(table, dict):
            raise InputError(file, where, "must be a table of a GPU's figures")
        name = table.get("name")
        if not isinstance(name, str) or not name.strip():
            raise InputError(file, f"{where}.name", "missing: every [[gpus]] entry needs a name "
                                                    "(the name its nodes' gpu key uses)")
        if any(e.name == name for e in out):
            raise InputError(file, f"{where}.name", f"GPU {name!r} is defined twice here")
        out.append(CatalogEntry(name, {k: v for k, v in table.items() if k != "name"}, file,
                                where))
    return out


def known_fields(gpu: GPUSpec) -> dict[str, Any]:
    """The fields an entry gave for ``gpu``, as a table: a later entry of the same name is laid
    over them. Fields that took their default stay absent, so they still follow the defaults
    (``nvlink_domain`` then follows a changed ``nvlink_gbs``)."""
    return {f.name: getattr(gpu, f.name) for f in dataclasses.fields(gpu)
            if f.name not in _BOOKKEEPING and f.name not in gpu.defaults
            and getattr(gpu, f.name) is not None}


def omitted(table: Mapping[str, Any]) -> tuple[str, ...]:
    """The optional fields of :data:`DEFAULTS` that ``table`` does not give."""
    return tuple(k for k in DEFAULTS if k not in table)


def defaults_text(fields: tuple[str, ...] | list[str]) -> str:
    """``gemm_eff = 0.8; attention = fa2``: the defaults of ``fields`` in words."""
    def value(k: str) -> str:
        v = DEFAULTS[k]
        if v is None:
            return "the calibration's, pooled over the measured GPUs"
        return str(v).lower() if isinstance(v, bool) else f"{v:g}" if isinstance(v, float) \
            else str(v)
    def label(k: str) -> str:
        return "GEMM curve (gemm_half_balance, gemm_latency_us)" if k == "gemm_half_balance" \
            else k
    return "; ".join(f"{label(k)} = {value(k)}" for k in fields)
