"""The first run after an install compiles the numba kernels; ``tangram`` says so on stderr
(its times include the compilation), and only for kernels compiled during that command."""

from __future__ import annotations

import importlib
import os
import sys
import types
from pathlib import Path

from solver.spec.loaders import INSTANCES

cli = importlib.import_module("solver.cli.main")  # the module (solver.cli exports main())
CLUSTER = str(INSTANCES / "clusters" / "three-gen-512.toml")


class _Kernel:
    """Stands for a numba dispatcher: ``stats.cache_path`` is where its compilations are cached."""

    def __init__(self, cache):
        self.stats = types.SimpleNamespace(cache_path=str(cache))


def _fake_command(cache, compile_now: int):
    def run(args):
        for i in range(compile_now):  # what numba writes when it compiles a kernel
            (cache / f"kernels.k{i}-1.py311.nbi").write_bytes(b"index")
        print("done")
        return 0
    return run


def test_note_counts_only_this_commands_compilations(tmp_path, monkeypatch, capsys):
    old = tmp_path / "kernels.earlier-1.py311.nbi"
    old.write_bytes(b"index")  # compiled by an earlier command
    os.utime(old, (1.0, 1.0))
    kernels = types.ModuleType("fake_kernels")
    kernels.k, kernels.other = _Kernel(tmp_path), object()
    monkeypatch.setitem(sys.modules, "fake_kernels", kernels)
    monkeypatch.setattr(cli, "KERNEL_MODULES", ("fake_kernels", "not_imported"))
    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda *_: parser)
    for compile_now, note in ((2, "compiled 2 numba kernels"), (0, None)):
        args = parser.parse_args(["islands", CLUSTER])
        args.func = _fake_command(tmp_path, compile_now)
        monkeypatch.setattr(parser, "parse_args", lambda argv: args)
        assert cli.main(["islands", CLUSTER]) == 0
        err = capsys.readouterr().err
        assert (note in err) if note else err == ""
        if compile_now:  # the next command finds these files from before it started
            for f in tmp_path.glob("kernels.k*.nbi"):
                os.utime(f, (1.0, 1.0))


def test_the_kernel_modules_are_where_numba_caches():
    # The note reads the dispatchers' cache directories: the real modules must expose them once
    # the compiled kernels ran (the stage options' filter makes its dispatcher at its first use).
    from solver.cost import stage_options
    stage_options._compiled_kernel()
    for name in cli.KERNEL_MODULES:
        mod = importlib.import_module(name)
        paths = {k.stats.cache_path for k in vars(mod).values() if hasattr(k, "stats")}
        assert paths and all(paths), name


def test_every_numba_user_is_a_kernel_module():
    """A module that imports numba at its top is listed, so the note counts its kernels; the
    fronts that pick a twin (and the rest of the package) import numba only through them."""
    import ast
    import solver
    root = Path(solver.__file__).parent
    users = set()
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text())
        if any(isinstance(n, ast.ImportFrom) and n.module == "numba" or isinstance(n, ast.Import)
               and any(a.name == "numba" for a in n.names) for n in tree.body):
            users.add(".".join(path.relative_to(root.parent).with_suffix("").parts))
    assert users == set(cli.KERNEL_MODULES) - {"solver.cost.stage_options"}
