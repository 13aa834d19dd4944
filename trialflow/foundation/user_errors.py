"""The base of every failure a user can fix from its message alone: a bad config, an unknown
experiment, a refused credential, a store written by a newer trialflow. The message is one line that
names what is wrong and how to fix it; the CLI prints it as ``error: <message>`` and exits 1 (one
handler, in ``cli.main``), the Python API raises it as it is.

Standard library only and imported by the lowest layers; nothing else belongs here."""

from __future__ import annotations


class UserError(Exception):
    """A failure whose message says what is wrong and how to fix it, in one line."""
