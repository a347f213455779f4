"""The base of every error opcost raises on purpose.

Each stage raises its own subclass (``ConfigError``, ``EvaluationError``, ...), whose
message names the file or field at fault and what to do. The CLI turns any
``OpcostError`` into one line on stderr and exit code 2; anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations


class OpcostError(Exception):
    """An input, file or setting opcost refuses, with a message meant for the user."""


class ConfigError(OpcostError, ValueError):
    """The config is invalid; the message names the field (:mod:`opcost.config`)."""
