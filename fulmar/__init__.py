"""fulmar: fault-tolerant replicated state machines for Python.

The short names of the API most programs need::

    from fulmar import StateMachine, command      # a service written as methods
    client = fulmar.connect("0=host:port,...")    # a client that calls them

They are imported on first use: every process of a node imports this
package, and needs neither the client nor msgpack.

The root package holds the pieces every process shares (shared-memory
buffers, log buffers, frames, counters); the component packages
``fulmar.driver``, ``fulmar.archive``, ``fulmar.consensus``,
``fulmar.service``, ``fulmar.codecs`` and ``fulmar.cli`` live in the
repository's top-level folders of the same names.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fulmar.consensus.call_client import (
        AsyncClient,
        CallError,
        CallTimeoutError,
        Client,
        ClientClosedError,
        ClientExpiredError,
        ClusterUnavailableError,
        CommandArgumentsError,
        CommandError,
        ResultEncodingError,
        UnknownCommandError,
        connect,
    )
    from fulmar.service.state_machine import StateMachine, command

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "CallError",
    "CallTimeoutError",
    "Client",
    "ClientClosedError",
    "ClientExpiredError",
    "ClusterUnavailableError",
    "CommandArgumentsError",
    "CommandError",
    "ResultEncodingError",
    "StateMachine",
    "UnknownCommandError",
    "command",
    "connect",
]
# Where each name lives: the service's in fulmar.service, the client's in fulmar.consensus.
_LAZY = {
    name: "fulmar.service.state_machine" if name in ("StateMachine", "command") else "fulmar.consensus.call_client"
    for name in __all__
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fulmar' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
