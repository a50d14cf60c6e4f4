"""The credentials authenticator on its own: its decisions, and that it lets
go of the credentials of sessions that never come back for a decision."""

from __future__ import annotations

from fulmar.consensus.authenticator import CredentialsAuthenticator


class Proxy:
    def __init__(self, session_id: int) -> None:
        self.session_id = session_id
        self.outcome: tuple[str, bytes] | None = None

    def challenge(self, encoded_challenge: bytes) -> bool:
        self.outcome = ("challenge", encoded_challenge)
        return True

    def authenticate(self, encoded_principal: bytes = b"") -> bool:
        self.outcome = ("authenticate", encoded_principal)
        return True

    def reject(self) -> None:
        self.outcome = ("reject", b"")


def test_the_secret_decides_and_a_decision_forgets_the_credentials() -> None:
    authenticator = CredentialsAuthenticator(b"s3cret")
    authenticator.on_connect_request(1, b"alice:s3cret", 0)
    authenticator.on_connect_request(2, b"wrong", 0)
    good, bad = Proxy(1), Proxy(2)
    authenticator.on_connected_session(good, 1)
    authenticator.on_connected_session(bad, 1)
    assert good.outcome == ("authenticate", b"alice") and bad.outcome == ("reject", b"")
    assert authenticator.pending_sessions == 0


def test_a_client_without_credentials_is_challenged_then_decided_on_its_answer() -> None:
    authenticator = CredentialsAuthenticator(b"s3cret")
    authenticator.on_connect_request(3, b"", 0)
    proxy = Proxy(3)
    authenticator.on_connected_session(proxy, 1)
    assert proxy.outcome == ("challenge", CredentialsAuthenticator.CHALLENGE)
    authenticator.on_challenged_session(proxy, 2)  # no answer yet: nothing decided
    assert proxy.outcome == ("challenge", CredentialsAuthenticator.CHALLENGE)
    authenticator.on_challenge_response(3, b"s3cret", 3)
    authenticator.on_challenged_session(proxy, 4)
    assert proxy.outcome == ("authenticate", b"")
    assert authenticator.pending_sessions == 0


def test_credentials_of_sessions_never_decided_are_let_go() -> None:
    # Sessions dropped before their decision (timed out, or closed by an
    # election at INIT) never come back: their credentials must not pile up.
    authenticator = CredentialsAuthenticator(b"s3cret")
    timeout_ms = CredentialsAuthenticator.PENDING_TIMEOUT_MS
    for session_id in range(100):
        authenticator.on_connect_request(session_id, b"user:s3cret", session_id)
    assert authenticator.pending_sessions == 100
    authenticator.on_challenge_response(50, b"user:s3cret", timeout_ms)  # an answer renews its time
    authenticator.on_connect_request(1000, b"user:s3cret", timeout_ms + 49)
    # Those a whole timeout old are gone (0..49); 50 (renewed), 51..99 and 1000 stay.
    assert authenticator.pending_sessions == 51
    proxy = Proxy(50)
    authenticator.on_connected_session(proxy, timeout_ms + 50)
    assert proxy.outcome == ("authenticate", b"user")
