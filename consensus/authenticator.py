"""Authenticating cluster clients (seed 003).

The interface and the two shipped authenticators live in ``fulmar.security``,
where the archive's control sessions use them too; this module keeps the
cluster's names for them.  The consensus module calls ``on_connect_request``
when a SessionConnectRequest arrives, ``on_connected_session`` once the
session's egress is connected, ``on_challenged_session`` while a challenge is
outstanding, and ``on_challenge_response`` when the client answers one.
"""

from __future__ import annotations

from fulmar.security import (
    AllowAllAuthenticator,
    Authenticator,
    CredentialsAuthenticator,
    NullAuthenticator,
    SessionProxy,
)

__all__ = [
    "AllowAllAuthenticator",
    "Authenticator",
    "CredentialsAuthenticator",
    "NullAuthenticator",
    "SessionProxy",
]
