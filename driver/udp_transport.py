"""A UDP socket for the media driver's sender and receiver: non-blocking,
moving batches of datagrams per system call (recvmmsg/sendmmsg in
``driver/native/udp.c``), IPv4 and IPv6, unicast and multicast.  The media
driver opens and binds its sockets here; its data plane then moves their
datagrams in C (and injects loss there, ``driver/native/loss.h``).

The socket is never blocked on: an agent polls ``receive`` in its duty cycle
and waits for readiness on ``fileno()`` (or its doorbell) when idle.  Linux is
the target; recvmmsg/sendmmsg exist there since 2.6.33/3.0, so there is no
pure-Python fallback.

Received datagrams land in one buffer of ``receive_batch`` slots of
``slot_length`` bytes each; a slot of 64 KiB holds any UDP datagram over IPv4
(at most 65507 bytes, more than Aeron's 65504 maximum) so nothing a peer
sends is cut.  The batch object returned by ``receive`` is reused: its views
are valid until the next ``receive``.
"""

from __future__ import annotations

import itertools
import mmap
import os
import socket
import struct
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeAlias

from fulmar._native import ffi, lib
from fulmar.buffers import AtomicBuffer
from fulmar.errors import FulmarError

DEFAULT_SLOT_LENGTH = 64 * 1024
DEFAULT_RECEIVE_BATCH = 64
MAX_BATCH = int(lib.FULMAR_UDP_MAX_BATCH)

Buffer = bytes | bytearray | memoryview
# (offset, length) pairs, or an array('i') of them flattened (no conversion).
Regions: TypeAlias = "Sequence[tuple[int, int]] | array[int]"


class ChannelEndpointError(FulmarError):
    """A UDP endpoint cannot be opened or used: the message names the address
    and the system's reason; ``errno`` is the system error number (or None)."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


def _os_error(what: str, code: int) -> ChannelEndpointError:
    return ChannelEndpointError(f"{what}: [Errno {code}] {os.strerror(code)}", code)


def _format(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class UdpAddress:
    """A resolved UDP address, held in the native layout the send calls take,
    so that sending to it converts nothing."""

    __slots__ = ("family", "host", "port", "scope_id", "packed", "native")

    def __init__(self, family: int, packed: bytes, port: int, scope_id: int = 0) -> None:
        if family not in (socket.AF_INET, socket.AF_INET6):
            raise ValueError(f"not an IP address family: {family}")
        if len(packed) != (4 if family == socket.AF_INET else 16):
            raise ValueError(f"{len(packed)} address bytes for family {family}")
        if not 0 <= port <= 0xFFFF:
            raise ValueError(f"port {port} out of range")
        self.family = family
        self.packed = packed
        self.port = port
        self.scope_id = scope_id
        self.host = socket.inet_ntop(family, packed)
        self.native = ffi.new("fulmar_udp_address_t *")
        self.native.family = family
        self.native.port = port
        self.native.scope_id = scope_id
        ffi.memmove(self.native.address, packed, len(packed))

    @classmethod
    def resolve(cls, host: str, port: int, family: int = socket.AF_UNSPEC) -> UdpAddress:
        """Resolve ``host`` (a literal address or a name: a name may block on
        DNS, so resolve at setup time).  With ``family=AF_INET6`` an IPv4
        address becomes IPv4-mapped, as an IPv6 socket needs."""
        return _resolve(host, port, family)

    @property
    def socket_address(self) -> tuple[str, int] | tuple[str, int, int, int]:
        if self.family == socket.AF_INET6:
            return (self.host, self.port, 0, self.scope_id)
        return (self.host, self.port)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, UdpAddress):
            return NotImplemented
        return (self.family, self.packed, self.port, self.scope_id) == (
            other.family,
            other.packed,
            other.port,
            other.scope_id,
        )

    def __hash__(self) -> int:
        return hash((self.family, self.packed, self.port, self.scope_id))

    def __repr__(self) -> str:
        return f"UdpAddress({_format(self.host, self.port)})"


@lru_cache(maxsize=1024)
def _resolve(host: str, port: int, family: int) -> UdpAddress:
    # Bounded cache: senders name their destinations as (host, port) tuples
    # on every send, and re-resolving each time would cost a getaddrinfo.
    flags = socket.AI_V4MAPPED if family == socket.AF_INET6 else 0
    try:
        infos = socket.getaddrinfo(host, port, family, socket.SOCK_DGRAM, 0, flags)
    except (socket.gaierror, UnicodeError, OverflowError) as exc:
        raise ChannelEndpointError(f"cannot resolve UDP address {_format(host, port)}: {exc}") from None
    for info_family, _type, _proto, _name, sockaddr in infos:
        if info_family == socket.AF_INET:
            return UdpAddress(socket.AF_INET, socket.inet_pton(socket.AF_INET, str(sockaddr[0])), port)
        if info_family == socket.AF_INET6:
            literal = str(sockaddr[0]).split("%", 1)[0]
            scope_id = int(sockaddr[3])  # type: ignore[misc]
            return UdpAddress(socket.AF_INET6, socket.inet_pton(socket.AF_INET6, literal), port, scope_id)
    raise ChannelEndpointError(f"cannot resolve UDP address {_format(host, port)}: no IPv4 or IPv6 address")


# Source addresses of received datagrams, by (family, address, port, scope):
# the same few peers send every datagram, and building a UdpAddress (with its
# native copy) for each one showed in the receive path's profile.  Bounded:
# cleared when it grows past what any real set of peers needs.
_SOURCE_CACHE: dict[tuple[int, bytes, int, int], UdpAddress] = {}
_SOURCE_CACHE_LIMIT = 4096


def native_address(source: Any) -> UdpAddress:
    """The UdpAddress of a native ``fulmar_udp_address_t`` (cached: the same few peers recur)."""
    family = int(source.family)
    packed = bytes(ffi.buffer(source.address, 4 if family == socket.AF_INET else 16))
    key = (family, packed, int(source.port), int(source.scope_id))
    address = _SOURCE_CACHE.get(key)
    if address is None:
        if len(_SOURCE_CACHE) >= _SOURCE_CACHE_LIMIT:
            _SOURCE_CACHE.clear()
        address = _SOURCE_CACHE[key] = UdpAddress(*key)
    return address


class ReceivedBatch:
    """The datagrams of one ``receive`` call, in arrival order.

    Reused by its transport: valid until the next ``receive``.  Native
    consumers (the term rebuilder) take ``address`` + ``offset(i)`` and
    ``length(i)``; Python takes ``datagram(i)`` views.
    """

    __slots__ = ("count", "view", "address", "_descriptors")

    def __init__(self, view: memoryview, address: Any, descriptors: Any) -> None:
        self.count = 0
        self.view = view
        self.address = address
        self._descriptors = descriptors

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[memoryview]:
        for index in range(self.count):
            yield self.datagram(index)

    def _descriptor(self, index: int) -> Any:
        if not 0 <= index < self.count:
            raise IndexError(f"datagram {index} of a batch of {self.count}")
        return self._descriptors[index]

    def offset(self, index: int) -> int:
        return int(self._descriptor(index).offset)

    def length(self, index: int) -> int:
        return int(self._descriptor(index).length)

    def truncated(self, index: int) -> bool:
        """The datagram was longer than its slot and lost its tail (never for
        datagrams of Aeron's 65504-byte maximum with the default slots)."""
        return bool(self._descriptor(index).truncated)

    def datagram(self, index: int) -> memoryview:
        descriptor = self._descriptor(index)
        return self.view[descriptor.offset : descriptor.offset + descriptor.length]

    def source(self, index: int) -> tuple[str, int]:
        """The sender's (host, port); ("", 0) for a source that is not IP."""
        source = self._descriptor(index).source
        if source.family == socket.AF_INET:
            return socket.inet_ntop(socket.AF_INET, bytes(ffi.buffer(source.address, 4))), int(source.port)
        if source.family == socket.AF_INET6:
            return socket.inet_ntop(socket.AF_INET6, bytes(ffi.buffer(source.address, 16))), int(source.port)
        return ("", 0)

    def source_address(self, index: int) -> UdpAddress:
        """The sender's address, ready to reply to (status messages, NAKs)."""
        source = self._descriptor(index).source
        if source.family not in (socket.AF_INET, socket.AF_INET6):
            raise ChannelEndpointError(f"datagram {index} has no IP source address (family {source.family})")
        return native_address(source)


@dataclass(frozen=True)
class OsBufferLengths:
    """What the OS gives a UDP socket's buffers: its defaults, and what it
    grants when the driver's own lengths are asked for (at most
    net.core.rmem_max / wmem_max).  Linux reports twice what it was asked
    (room for its bookkeeping); like Aeron's driver, these are the lengths
    as the OS reports them, and a log buffer's metadata carries them."""

    default_rcvbuf: int
    default_sndbuf: int
    max_rcvbuf: int
    max_sndbuf: int

    @classmethod
    def probe(cls, rcvbuf: int, sndbuf: int) -> OsBufferLengths:
        """Read the defaults off a fresh socket, then ask it for ``rcvbuf`` and
        ``sndbuf`` (0: not asked, the default stands) and read what it got."""
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            default_rcvbuf = probe.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
            default_sndbuf = probe.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
            if rcvbuf > 0:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            if sndbuf > 0:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
            return cls(
                default_rcvbuf,
                default_sndbuf,
                probe.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF),
                probe.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
            )


class UdpTransport:
    """One non-blocking UDP socket with batched send and receive; see the module doc."""

    def __init__(
        self,
        sock: socket.socket,
        receive_batch: int = DEFAULT_RECEIVE_BATCH,
        slot_length: int = DEFAULT_SLOT_LENGTH,
    ) -> None:
        if not 1 <= receive_batch <= MAX_BATCH:
            raise ValueError(f"receive_batch {receive_batch} outside 1..{MAX_BATCH}")
        if slot_length <= 0 or receive_batch * slot_length >= 2**31:
            # Slot offsets travel as int32.
            raise ValueError(f"slot_length {slot_length} must be positive and the buffer under 2 GiB")
        sock.setblocking(False)
        self._socket = sock
        self._fd = sock.fileno()
        self.family = sock.family
        self.receive_batch = receive_batch
        self.slot_length = slot_length
        # An anonymous mapping, not a bytearray (which zero-fills every page):
        # pages no datagram reaches are never faulted in, so 64 KiB slots for
        # 1408-byte datagrams cost address space, not memory.
        self._receive_memory = mmap.mmap(-1, receive_batch * slot_length)
        self._receive_array = ffi.from_buffer("char[]", self._receive_memory, require_writable=True)
        self._descriptors = ffi.new("fulmar_udp_datagram_t[]", receive_batch)
        self._batch = ReceivedBatch(
            memoryview(self._receive_memory), ffi.cast("char *", self._receive_array), self._descriptors
        )

    @classmethod
    def open(
        cls,
        bind: tuple[str, int] | None = None,
        *,
        family: int | None = None,
        interface: str | None = None,
        reuse_address: bool = False,
        multicast_group: str | None = None,
        multicast_ttl: int | None = None,
        multicast_loop: bool | None = None,
        so_sndbuf: int = 0,
        so_rcvbuf: int = 0,
        receive_batch: int = DEFAULT_RECEIVE_BATCH,
        slot_length: int = DEFAULT_SLOT_LENGTH,
    ) -> UdpTransport:
        """Open a socket, bound to ``bind`` (port 0: an ephemeral port; None:
        unbound until the first send).  The family follows ``bind`` or
        ``multicast_group``, else ``family`` (IPv4 by default).

        Multicast: ``multicast_group`` is joined on ``interface`` (a local
        address, IPv4 or IPv6; default: the kernel's choice), which also
        becomes the outgoing multicast interface; ``multicast_ttl`` and
        ``multicast_loop`` set the hop limit and local loopback of sent
        multicast.  ``so_sndbuf``/``so_rcvbuf`` (0: system default) are set
        before binding.  Failures raise ``ChannelEndpointError``.
        """
        bind_address = None
        if bind is not None:
            bind_address = UdpAddress.resolve(bind[0], bind[1], family or socket.AF_UNSPEC)
            family = bind_address.family
        elif multicast_group is not None:
            family = UdpAddress.resolve(multicast_group, 0, family or socket.AF_UNSPEC).family
        family = family or socket.AF_INET
        where = _format(bind_address.host, bind_address.port) if bind_address else "an unbound socket"

        try:
            sock = socket.socket(family, socket.SOCK_DGRAM)
        except OSError as exc:
            raise _os_error(f"cannot open a UDP socket for {where}", exc.errno or 0) from None
        try:
            step = "set options on"
            if reuse_address:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if so_sndbuf:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, so_sndbuf)
            if so_rcvbuf:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, so_rcvbuf)
            if bind_address is not None:
                step = "bind UDP socket to"
                sock.bind(bind_address.socket_address)
            _configure_multicast(sock, family, interface, multicast_group, multicast_ttl, multicast_loop)
            return cls(sock, receive_batch, slot_length)
        except OSError as exc:
            sock.close()
            raise _os_error(f"cannot {step} {where}", exc.errno or 0) from None
        except BaseException:
            sock.close()
            raise

    # Socket ---------------------------------------------------------------

    def fileno(self) -> int:
        return self._fd

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def close(self) -> None:
        if self._fd >= 0:
            self._fd = -1
            self._socket.close()

    def __enter__(self) -> UdpTransport:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def local_address(self) -> tuple[str, int]:
        """The bound (host, port): the ephemeral port chosen for port 0."""
        name = self._socket.getsockname()
        return str(name[0]), int(name[1])

    @property
    def so_sndbuf(self) -> int:
        """The send buffer size the kernel uses (Linux reports double what
        was asked, capped by net.core.wmem_max)."""
        return int(self._socket.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF))

    @so_sndbuf.setter
    def so_sndbuf(self, size: int) -> None:
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)

    @property
    def so_rcvbuf(self) -> int:
        return int(self._socket.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))

    @so_rcvbuf.setter
    def so_rcvbuf(self, size: int) -> None:
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)

    def getsockopt(self, level: int, option: int, buflen: int = 0) -> int | bytes:
        """A socket option's value, for diagnostics (the socket stays owned here)."""
        if buflen:
            return self._socket.getsockopt(level, option, buflen)
        return self._socket.getsockopt(level, option)

    def address(self, host: str, port: int) -> UdpAddress:
        """Resolve a destination for this socket's family."""
        return UdpAddress.resolve(host, port, self.family)

    def _destination(self, destination: UdpAddress | tuple[str, int]) -> UdpAddress:
        if isinstance(destination, UdpAddress):
            return destination
        return _resolve(destination[0], destination[1], self.family)

    # Receive --------------------------------------------------------------

    def receive(self, max_datagrams: int | None = None) -> ReceivedBatch:
        """Take the datagrams waiting on the socket, up to ``max_datagrams``
        (default and limit: ``receive_batch``); an empty batch when none is."""
        self._check_open()
        limit = self.receive_batch if max_datagrams is None else min(max_datagrams, self.receive_batch)
        batch = self._batch
        if limit <= 0:
            batch.count = 0
            return batch
        received = lib.fulmar_udp_receive_batch(self._fd, batch.address, self.slot_length, limit, self._descriptors)
        if received < 0:
            batch.count = 0
            raise _os_error(f"receive on {self._describe()}", -received)
        batch.count = received
        return batch

    # Send -----------------------------------------------------------------

    def send(self, buffer: AtomicBuffer | Buffer, regions: Regions, destination: UdpAddress | tuple[str, int]) -> int:
        """Send each (offset, length) region of ``buffer`` as one datagram to
        ``destination``.  Returns how many went, in order: fewer than asked
        when the socket's send buffer is full (send the rest later).  A
        failure before anything went raises ``ChannelEndpointError``."""
        self._check_open()
        target = self._destination(destination)
        pointer, length = self._pointer(buffer)
        return self._send_native(pointer, length, _flat_regions(regions), target)

    def send_datagrams(self, datagrams: Iterable[Buffer], destination: UdpAddress | tuple[str, int]) -> int:
        """Send each buffer as one datagram (copies them into one; for
        control frames and tests, not the data path)."""
        parts = [bytes(d) for d in datagrams]
        payload = b"".join(parts)
        offsets = itertools.accumulate((len(p) for p in parts), initial=0)
        flat = array("i", itertools.chain.from_iterable(zip(offsets, (len(p) for p in parts))))
        return self.send(payload, flat, destination)

    def send_to_many(
        self,
        buffer: AtomicBuffer | Buffer,
        regions: Regions,
        destinations: Sequence[UdpAddress | tuple[str, int]],
    ) -> list[int | ChannelEndpointError]:
        """Send the same datagrams to each destination (multi-destination-
        cast).  Per destination: the number sent, or the error that stopped
        it; one unreachable destination does not stop the others.  A full
        send buffer stops the rest (they report what they got, maybe 0)."""
        self._check_open()
        targets = [self._destination(d) for d in destinations]
        pointer, length = self._pointer(buffer)
        flat = _flat_regions(regions)
        natives = ffi.new("fulmar_udp_address_t[]", len(targets))
        for index, target in enumerate(targets):
            natives[index] = target.native[0]
        counts = ffi.new("int32_t[]", len(targets))
        total = lib.fulmar_udp_send_batch_to_many(
            self._fd, pointer, length, ffi.from_buffer("int32_t[]", flat), len(flat) // 2, natives, len(targets), counts
        )
        if total == lib.FULMAR_UDP_REGION_OUT_OF_BOUNDS:
            raise ValueError(f"a region lies outside the {length}-byte buffer")
        if total < 0:
            raise _os_error(f"send from {self._describe()}", -total)
        return [
            counts[i] if counts[i] >= 0 else _os_error(f"send to {targets[i]!r}", -counts[i])
            for i in range(len(targets))
        ]

    def _send_native(self, pointer: Any, length: int, flat: array[int], target: UdpAddress) -> int:
        # no trailers: the media driver's data plane adds the datagrams' MACs, not this path
        sent = lib.fulmar_udp_send_batch(
            self._fd, pointer, length, ffi.from_buffer("int32_t[]", flat), len(flat) // 2, ffi.NULL, 0, target.native
        )
        if sent == lib.FULMAR_UDP_REGION_OUT_OF_BOUNDS:
            raise ValueError(f"a region lies outside the {length}-byte buffer")
        if sent < 0:
            raise _os_error(f"send to {target!r} from {self._describe()}", -sent)
        return int(sent)

    @staticmethod
    def _pointer(buffer: AtomicBuffer | Buffer) -> tuple[Any, int]:
        if isinstance(buffer, AtomicBuffer):
            return buffer.address, buffer.capacity
        array_ = ffi.from_buffer(buffer)
        return array_, len(array_)

    def _check_open(self) -> None:
        if self._fd < 0:
            raise ChannelEndpointError("UDP transport is closed")

    def _describe(self) -> str:
        try:
            return _format(*self.local_address)
        except OSError:
            return "a UDP socket"


def _flat_regions(regions: Regions) -> array[int]:
    if isinstance(regions, array):
        if regions.typecode != "i" or len(regions) % 2:
            raise ValueError("regions array must be array('i') of offset, length pairs")
        return regions
    return array("i", itertools.chain.from_iterable(regions))


def _interface_address(interface: str, family: int) -> tuple[bytes, int]:
    """The packed address and interface index of the local interface that
    has the address ``interface``."""
    import psutil

    try:
        target = socket.inet_pton(family, interface.split("%", 1)[0])
    except OSError:
        raise ChannelEndpointError(f"multicast interface {interface!r} is not an address of family {family}") from None
    for name, addresses in psutil.net_if_addrs().items():
        for entry in addresses:
            if entry.family != family:
                continue
            try:
                if socket.inet_pton(family, entry.address.split("%", 1)[0]) == target:
                    return target, socket.if_nametoindex(name)
            except OSError:
                continue
    raise ChannelEndpointError(f"multicast interface {interface}: no local interface has that address")


def _configure_multicast(
    sock: socket.socket,
    family: int,
    interface: str | None,
    group: str | None,
    ttl: int | None,
    loop: bool | None,
) -> None:
    v6 = family == socket.AF_INET6
    level = socket.IPPROTO_IPV6 if v6 else socket.IPPROTO_IP
    if_address, if_index = (b"\0" * 4, 0) if interface is None else _interface_address(interface, family)
    step = f"set multicast interface {interface}"
    try:
        if interface is not None:
            if v6:
                sock.setsockopt(level, socket.IPV6_MULTICAST_IF, if_index)
            else:
                sock.setsockopt(level, socket.IP_MULTICAST_IF, if_address)
        step = f"set multicast TTL {ttl}"
        if ttl is not None:
            sock.setsockopt(level, socket.IPV6_MULTICAST_HOPS if v6 else socket.IP_MULTICAST_TTL, ttl)
        step = "set multicast loop"
        if loop is not None:
            sock.setsockopt(level, socket.IPV6_MULTICAST_LOOP if v6 else socket.IP_MULTICAST_LOOP, int(loop))
        step = f"join multicast group {group} on interface {interface or 'default'}"
        if group is not None:
            group_address = socket.inet_pton(family, group)
            if v6:
                sock.setsockopt(level, socket.IPV6_JOIN_GROUP, group_address + struct.pack("@I", if_index))
            else:
                sock.setsockopt(level, socket.IP_ADD_MEMBERSHIP, group_address + if_address)
    except OSError as exc:
        raise _os_error(f"cannot {step}", exc.errno or 0) from None
