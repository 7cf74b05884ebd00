"""The one error of the exporters: the runtime cannot express the plan."""

from __future__ import annotations


class NotExpressible(Exception):
    """The runtime cannot express the plan (the message says why, in one line)."""
