"""``python -m solver`` runs the ``tangram`` command."""

from solver.cli.main import run

run()
