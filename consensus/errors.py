"""The consensus module's own errors."""

from __future__ import annotations

from fulmar.errors import FulmarError


class ClusterTerminationError(FulmarError):
    """The module stops: a SHUTDOWN/ABORT completed, or a step it cannot do without failed."""
