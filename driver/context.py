"""Everything a media driver can be configured with, and its defaults."""

from __future__ import annotations

import getpass
import hashlib
import hmac
import os
from dataclasses import dataclass, field
from pathlib import Path

from fulmar.cnc import DEFAULT_CLIENT_LIVENESS_TIMEOUT_NS, CncLayout
from fulmar.driver.data_plane import INITIAL_WINDOW_LENGTH_DEFAULT


def default_driver_dir() -> Path:
    """``/dev/shm/fulmar-<user>`` (Aeron's ``/dev/shm/aeron-<user>`` convention)."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else os.environ.get("TMPDIR", "/tmp")
    return Path(base) / f"fulmar-{getpass.getuser()}"


# The secret the members' drivers share (datagram-mac=true channels).
MEMBER_SECRET_ENV = "FULMAR_MEMBER_SECRET"
# What the datagram key is derived for: a key of its own, so that a MAC of a
# datagram can never pass for any other use of the member secret.
DATAGRAM_KEY_LABEL = b"fulmar datagram v1"


def member_secret_from_environment() -> bytes | None:
    """``$FULMAR_MEMBER_SECRET`` (UTF-8), or None when unset or empty."""
    text = os.environ.get(MEMBER_SECRET_ENV)
    return text.encode("utf-8") if text else None


@dataclass
class DriverContext:
    directory: Path = field(default_factory=default_driver_dir)
    cnc_layout: CncLayout = field(default_factory=CncLayout)
    # A client that has not sent a keepalive for this long is closed.
    client_liveness_timeout_ns: int = DEFAULT_CLIENT_LIVENESS_TIMEOUT_NS
    # A client that declared its process (fulmar.client_liveness) and has sent
    # no keepalive for this long (two of fulmar's and Aeron's 500 ms keepalive
    # intervals) is closed at once if that process is gone; how often the
    # quiet clients are looked at.  A dead process's UDP ports are free again
    # within about a second, not after the liveness timeout.  Off: the
    # liveness timeout only (Aeron's driver).
    client_process_check: bool = True
    client_process_check_quiet_ns: int = 1_000_000_000
    client_process_check_interval_ns: int = 100_000_000
    # IPC log buffers (Aeron's defaults: 64 MiB terms, a window of half a term).
    ipc_term_length: int = 64 * 1024 * 1024
    ipc_mtu: int = 1408
    ipc_publication_term_window_length: int = 0  # 0: half the term length
    # UDP sockets' buffers (a channel's so-rcvbuf / so-sndbuf override them;
    # 0: the OS default).  Aeron's driver asks for 128 KiB each.  fulmar asks
    # for more to receive: the kernel charges every queued datagram its whole
    # buffer (about 1.2 KiB for a 350-byte one on loopback), so a receiver
    # window of 128 KiB in small datagrams overflows the OS default of 208 KiB
    # while two busy cores keep the data plane from reading (hundreds of drops
    # per 20,000-message echo run, each a NAK and a retransmit later).  The
    # kernel caps what it grants at net.core.rmem_max / wmem_max; the driver
    # says so at start when it gets less.
    socket_rcvbuf: int = 2 * 1024 * 1024
    socket_sndbuf: int = 0
    # The window a receiver grants a sender beyond what its subscribers have
    # read (a channel's rcv-wnd overrides it), at most half a term: Aeron's
    # aeron.rcv.initial.window.length.  It must fit in so-rcvbuf.
    initial_window_length: int = INITIAL_WINDOW_LENGTH_DEFAULT
    # A network image whose sender has been silent this long goes unavailable.
    image_liveness_timeout_ns: int = 10_000_000_000
    # A log whose slowest reader is stuck this long on a frame that was
    # claimed but never committed (its publisher died) is padded over.
    publication_unblock_timeout_ns: int = 15_000_000_000
    # How long a closed publication's log stays mapped for late readers.
    publication_linger_timeout_ns: int = 5_000_000_000
    # A freed counter id is not reused for this long, so readers notice.
    counter_free_to_reuse_timeout_ms: int = 1_000
    # Slow work (liveness checks, lingering resources) runs at this interval,
    # and an idle driver wakes at least this often while anything is in
    # flight (a reader behind its publication, a gap to NAK, a retransmit).
    timer_interval_ns: int = 1_000_000
    # With nothing in flight the idle data plane sleeps up to this long
    # unless a client or a datagram rings it: its timers (heartbeats every
    # 100 ms, status messages every 200 ms) tolerate that, and a dozen idle
    # processes on two cores stop waking a thousand times a second.
    idle_max_wait_ns: int = 20_000_000
    # After a duty cycle that did work, the data plane polls on for this long
    # before it sleeps (0: it sleeps at once).  A round trip's next datagram or
    # offer often comes within tens of microseconds, and a poll is cheaper than
    # a wake-up; but the poll holds a core, so it is for machines with cores to
    # spare: off by default.
    data_plane_spin_ns: int = 0
    # The conductor (Python: commands, liveness, lingering resources) sleeps
    # up to this long when idle: commands and the data plane's events ring
    # it, and its timers are in seconds.  It keeps the timer interval while a
    # closed publication drains, and the data plane's idle wait while an image
    # that reached its end of stream waits for its subscribers to read it
    # (their reading rings nobody).
    conductor_idle_max_wait_ns: int = 100_000_000
    # A new UDP publication sends SETUP again after this long while no
    # receiver has answered, doubling up to Aeron's 100 ms setup timeout: a
    # receiver that subscribes a moment after the publication (a follower
    # joining a new leader's log) connects within milliseconds.
    initial_setup_interval_ns: int = 5_000_000
    # A duty cycle longer than this counts as a stall.
    conductor_cycle_threshold_ns: int = 1_000_000_000
    # TERMINATE_DRIVER is honoured only with this token (None: never).
    terminate_token: bytes | None = None
    # Remove the directory on a clean shutdown.
    delete_dir_on_shutdown: bool = True
    # Sleep on the driver doorbell between duty cycles (woken by commands),
    # at most a timer interval: no spinning on a 2-core machine.
    idle_strategy: str = "doorbell"
    # Seed of the loss injector (rates are counters, zero unless set).
    loss_seed: int = 0
    # The secret of datagram-mac=true channels, shared by the drivers at both
    # ends (None: such a channel is refused).  The environment's by default,
    # so every way a driver starts (its command, an embedded driver, a test's
    # process) takes it from there.
    member_secret: bytes | None = field(default_factory=member_secret_from_environment, repr=False)
    file_mode: int = 0o600

    @property
    def publications_dir(self) -> Path:
        return self.directory / "publications"

    @property
    def images_dir(self) -> Path:
        return self.directory / "images"

    def datagram_key(self) -> bytes | None:
        """HMAC-SHA256(member secret, "fulmar datagram v1"): the key of the datagrams' MACs."""
        if not self.member_secret:
            return None
        return hmac.new(self.member_secret, DATAGRAM_KEY_LABEL, hashlib.sha256).digest()

    def term_window_length(self, term_length: int) -> int:
        window = self.ipc_publication_term_window_length
        return min(window, term_length // 2) if window > 0 else term_length // 2
