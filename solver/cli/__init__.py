"""Step 8, the ``tangram`` command: parses arguments, runs a step or a study, prints the answer.

Takes in command lines. Hands on text tables, ``--json`` payloads (public contracts), PNG
figures, one-line errors and exit codes (0 ok, 2 bad input, 3 no plan, 130 interrupted).
Subcommands live in :mod:`solver.cli.commands` (a command line imports only the one it runs,
:mod:`solver.cli.main`); text tables and shared JSON payloads in :mod:`solver.cli.report`;
figures in :mod:`solver.cli.plots`; the terminal's working indicator in
:mod:`solver.cli.progress`.
"""

from solver.cli.main import main, run

__all__ = ["main", "run"]
