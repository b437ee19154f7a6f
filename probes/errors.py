"""The one error family of meshtop.

Every error that the user can cause or fix derives from :class:`MeshtopError`;
the CLI turns it into a single line on stderr and exit code 2.
"""

from __future__ import annotations


class MeshtopError(Exception):
    """Base of every error meshtop reports to its user as one line."""


class ProbeError(MeshtopError):
    """A measurement or the telemetry stream cannot be set up as asked."""


def one_line(error: BaseException) -> str:
    """``error``'s words on one line, whatever it quoted (a server's answer, a YAML error's spans); its type's
    name where it has none."""
    return " ".join(str(error).split()) or type(error).__name__
