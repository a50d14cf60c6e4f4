"""Authenticating sessions: the shapes Aeron's ``io.aeron.security`` gives
them, shared by the cluster's ingress (seed 003) and the archive's control
sessions.

A server (a consensus module, an archive) calls its ``Authenticator``:
``on_connect_request`` when a session asks to connect, with the credentials it
sent (empty if none); ``on_connected_session`` once the session's response
stream is connected, until it is decided; ``on_challenged_session`` while a
challenge is outstanding; and ``on_challenge_response`` when the client
answers one.  The authenticator decides through the ``SessionProxy`` it is
handed: ``authenticate`` (with an encoded principal), ``challenge`` (bytes
sent to the client) or ``reject``.

A client presents credentials through a ``CredentialsSupplier``: what goes in
its connect request, and its answer to a challenge.

Two authenticators ship: ``NullAuthenticator`` (Aeron's default: everyone in)
and ``CredentialsAuthenticator`` (a shared secret, which ``cluster-node``
configures with ``--authenticator-secret``).
"""

from __future__ import annotations

import hmac
from typing import Protocol

NULL_ENCODED_PRINCIPAL = b""
NULL_CREDENTIALS = b""


class SessionProxy(Protocol):
    @property
    def session_id(self) -> int: ...

    def challenge(self, encoded_challenge: bytes) -> bool: ...

    def authenticate(self, encoded_principal: bytes = b"") -> bool: ...

    def reject(self) -> None: ...


class Authenticator(Protocol):
    def on_connect_request(self, session_id: int, encoded_credentials: bytes, now_ms: int) -> None: ...

    def on_challenge_response(self, session_id: int, encoded_credentials: bytes, now_ms: int) -> None: ...

    def on_connected_session(self, proxy: SessionProxy, now_ms: int) -> None: ...

    def on_challenged_session(self, proxy: SessionProxy, now_ms: int) -> None: ...


class CredentialsSupplier(Protocol):
    def encoded_credentials(self) -> bytes: ...

    def on_challenge(self, encoded_challenge: bytes) -> bytes: ...


class NullAuthenticator:
    """Aeron's default authenticator: every session is authenticated as soon
    as it is connected (and, should one ever be challenged, at once)."""

    def on_connect_request(self, session_id: int, encoded_credentials: bytes, now_ms: int) -> None:
        pass

    def on_challenge_response(self, session_id: int, encoded_credentials: bytes, now_ms: int) -> None:
        pass

    def on_connected_session(self, proxy: SessionProxy, now_ms: int) -> None:
        proxy.authenticate(NULL_ENCODED_PRINCIPAL)

    def on_challenged_session(self, proxy: SessionProxy, now_ms: int) -> None:
        proxy.authenticate(NULL_ENCODED_PRINCIPAL)


# The cluster's name for it (seed 003).
AllowAllAuthenticator = NullAuthenticator


class CredentialsAuthenticator:
    """Clients must present a shared secret, in the connect request or, if
    they sent none, in answer to a challenge ("secret?").  The principal is
    the part of the credentials before the last ':' (``user:secret``, or
    just ``secret`` with an empty principal)."""

    CHALLENGE = b"secret?"
    # A session dropped before its decision (its connect timed out, or an
    # election closed it at INIT) never comes back for its credentials: they
    # are let go once they are this old (far past any session timeout).
    PENDING_TIMEOUT_MS = 60_000

    def __init__(self, secret: bytes) -> None:
        if not secret:
            raise ValueError("the credentials authenticator needs a non-empty secret")
        self.secret = secret
        # Undecided sessions' credentials and when they came, oldest first.
        self._credentials: dict[int, tuple[bytes | None, int]] = {}

    @property
    def pending_sessions(self) -> int:
        """Sessions whose credentials wait for a decision."""
        return len(self._credentials)

    def _keep(self, session_id: int, credentials: bytes | None, now_ms: int) -> None:
        pending = self._credentials
        pending.pop(session_id, None)  # re-inserted last: the dict stays oldest first
        pending[session_id] = (credentials, now_ms)
        while pending:
            oldest, (_, since_ms) = next(iter(pending.items()))
            if now_ms - since_ms < self.PENDING_TIMEOUT_MS:
                break
            del pending[oldest]

    def _pending(self, session_id: int) -> bytes | None:
        entry = self._credentials.get(session_id)
        return entry[0] if entry is not None else None

    def _principal_if_valid(self, credentials: bytes | None) -> bytes | None:
        if credentials is None:
            return None
        principal, colon, secret = credentials.rpartition(b":")
        if not colon:
            principal, secret = b"", credentials
        return principal if hmac.compare_digest(secret, self.secret) else None

    def on_connect_request(self, session_id: int, encoded_credentials: bytes, now_ms: int) -> None:
        self._keep(session_id, bytes(encoded_credentials) if encoded_credentials else None, now_ms)

    def on_challenge_response(self, session_id: int, encoded_credentials: bytes, now_ms: int) -> None:
        self._keep(session_id, bytes(encoded_credentials), now_ms)

    def on_connected_session(self, proxy: SessionProxy, now_ms: int) -> None:
        credentials = self._pending(proxy.session_id)
        if credentials is None:
            proxy.challenge(self.CHALLENGE)
            return
        self._decide(proxy, credentials)

    def on_challenged_session(self, proxy: SessionProxy, now_ms: int) -> None:
        credentials = self._pending(proxy.session_id)
        if credentials is not None:
            self._decide(proxy, credentials)

    def _decide(self, proxy: SessionProxy, credentials: bytes) -> None:
        self._credentials.pop(proxy.session_id, None)
        principal = self._principal_if_valid(credentials)
        if principal is None:
            proxy.reject()
        else:
            proxy.authenticate(principal)


class NullCredentialsSupplier:
    """No credentials, and an empty answer to any challenge (Aeron's default)."""

    def encoded_credentials(self) -> bytes:
        return NULL_CREDENTIALS

    def on_challenge(self, encoded_challenge: bytes) -> bytes:
        return NULL_CREDENTIALS


class StaticCredentialsSupplier:
    """The same credentials in the connect request and in answer to a
    challenge: what a client of ``CredentialsAuthenticator`` needs."""

    def __init__(self, credentials: bytes) -> None:
        self.credentials = bytes(credentials)

    def encoded_credentials(self) -> bytes:
        return self.credentials

    def on_challenge(self, encoded_challenge: bytes) -> bytes:
        return self.credentials


def credentials_supplier(credentials: bytes | CredentialsSupplier | None) -> CredentialsSupplier:
    """A supplier for what a client was given: nothing, bytes, or a supplier."""
    if credentials is None:
        return NullCredentialsSupplier()
    if isinstance(credentials, (bytes, bytearray, memoryview)):
        return StaticCredentialsSupplier(bytes(credentials)) if credentials else NullCredentialsSupplier()
    return credentials


def secret_of(authenticator: object) -> bytes:
    """The shared secret of a ``CredentialsAuthenticator`` (b"" for any other):
    what the node's own clients present to the other members."""
    secret = getattr(authenticator, "secret", None)
    return secret if isinstance(secret, bytes) else b""
