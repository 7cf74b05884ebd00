"""``python -m solver`` runs the ``tangram`` command."""

from solver.cli import run

run()
