"""What can go wrong with a private server."""

from __future__ import annotations


class ServerError(Exception):
    """A private server could not be set up, started, stopped or asked something."""


class ServerMissing(ServerError):
    """What a private server needs is not on this machine: a binary, or the user to run it as."""


class ServerFailed(ServerError):
    """A private server did not start, answer or stop in time; the message ends with its log."""
