"""The first run after an install compiles the numba kernels; ``tangram`` says so on stderr
(its times include the compilation), and only for kernels compiled during that command."""

from __future__ import annotations

import importlib
import sys
import types
from collections import Counter

from solver.spec.loaders import INSTANCES

cli = importlib.import_module("solver.cli.main")  # the module (solver.cli exports main())
CLUSTER = str(INSTANCES / "clusters" / "three-gen-512.toml")


class _Kernel:
    """Stands for a numba dispatcher: its ``stats.cache_misses`` counts fresh compilations."""

    def __init__(self, misses: int):
        self.stats = types.SimpleNamespace(cache_misses=Counter({"(float64,)": misses}))


def _fake_command(kernels: types.ModuleType, compile_now: int):
    def run(args):
        kernels.k.stats.cache_misses["(float64,)"] += compile_now
        print("done")
        return 0
    return run


def test_note_counts_only_this_commands_compilations(monkeypatch, capsys):
    kernels = types.ModuleType("fake_kernels")
    kernels.k, kernels.other = _Kernel(5), object()  # 5 compiled by an earlier command
    monkeypatch.setitem(sys.modules, "fake_kernels", kernels)
    monkeypatch.setattr(cli, "KERNEL_MODULES", ("fake_kernels", "not_imported"))
    parser = cli.build_parser()
    for compile_now, note in ((2, "compiled 2 numba kernels"), (0, None)):
        monkeypatch.setattr(cli, "build_parser", lambda: parser)
        args = parser.parse_args(["islands", CLUSTER])
        args.func = _fake_command(kernels, compile_now)
        monkeypatch.setattr(parser, "parse_args", lambda argv: args)
        assert cli.main(["islands", CLUSTER]) == 0
        err = capsys.readouterr().err
        assert (note in err) if note else err == ""
