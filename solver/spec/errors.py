"""Errors the command line turns into one-line messages and exit codes.

``InputError`` is bad input (exit status 2), ``InfeasibleError`` is a well-formed problem with no
feasible answer (exit status 3). Library code raises them; only the CLI prints them.
"""

from __future__ import annotations


class InputError(Exception):
    """A file or value the user gave is malformed.

    Parameters
    ----------
    file : str
        The file the value came from (``"<cli>"`` for a command-line flag, ``"<dict>"`` for data
        built in code).
    key : str
        The key path inside the file, dotted (``"nodes[2].perf"``).
    reason : str
        What is wrong and what is allowed, one line.
    """

    def __init__(self, file: str, key: str, reason: str) -> None:
        self.file = str(file)
        self.key = key
        self.reason = reason
        super().__init__(f"{self.file}: {key}: {reason}")


class SolverTooLarge(InputError):
    """An instance larger than the chosen composition solver's model is built for.

    An :class:`InputError` on the ``--solver`` flag (a command that asked for that solver exits
    with status 2 and the limit); a command comparing solvers (``bench --solvers``,
    ``verify``) reports that solver as not run and goes on with the others.

    Parameters
    ----------
    solver : str
        The solver (``dp``, ``cpsat``, ``milp``, ``brute``).
    limit : str
        Which limit the instance exceeds, one line.
    """

    def __init__(self, solver: str, limit: str) -> None:
        self.solver = solver
        self.limit = limit
        super().__init__("<cli>", "--solver", f"{solver}: {limit}")


class InfeasibleError(Exception):
    """The problem is well formed but nothing satisfies it; the message names the tightest limit.

    ``calls``: parallelizer calls spent finding that out (0 where nobody counted them)."""

    def __init__(self, message: str, calls: int = 0):
        super().__init__(message)
        self.calls = calls
