"""The bytes of a ``StateMachine`` call and its reply (both sides use this module).

Each is one application message of a cluster session: the cluster's 32-byte
SessionMessageHeader, then one of these.  Integers are little-endian.

A request from a client (``REQUEST_HEADER``, 36 bytes, then the body)::

    0   u8      kind: REGISTER, CALL or TOUCH
    1   u8      version (PROTOCOL_VERSION)
    2   u16     0
    4   16 B    client id: random, chosen once per client
    20  u64     sequence: the call's number, from 1 (0 for REGISTER and TOUCH)
    28  u64     lowest unanswered: the client waits for no call below it
    36  ...     CALL only: msgpack ``[command name, [arguments...]]``

A reply from the service (``REPLY_HEADER``, 12 bytes, then the body)::

    0   u8      status (OK, RAISED, ...)
    1   u8      version
    2   u16     0
    4   u64     sequence of the call answered (0 for REGISTERED and a BAD_REQUEST
                that had none)
    12  ...     OK: msgpack of the result; REGISTERED: msgpack ``[client id,
                client expiry (ms)]``; every error status: msgpack ``[type name,
                message]``

What crosses in a body is what msgpack carries: None, bool, int (64-bit),
float, str, bytes, and lists and dicts of them.  A tuple goes as a list and
comes back as one; dict keys may be any of those scalars.
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import Any

import msgpack

PROTOCOL_VERSION = 1
REQUEST_HEADER = struct.Struct("<BBH16sQQ")
REPLY_HEADER = struct.Struct("<BBHQ")
CLIENT_ID_LENGTH = 16


class RequestKind(IntEnum):
    REGISTER = 1  # a new client: the service keeps a record of it from now on
    CALL = 2  # a command to apply, once
    TOUCH = 3  # nothing to apply: the client is alive, and waits for nothing below lowest unanswered


class ReplyStatus(IntEnum):
    OK = 0  # the command returned; the body is its result
    RAISED = 1  # the command raised; nothing to roll back (commands check, then change)
    UNKNOWN_COMMAND = 2  # no command of that name: nothing ran
    BAD_ARGUMENTS = 3  # the arguments do not fit the command's parameters: nothing ran
    UNENCODABLE_RESULT = 4  # the command ran (and changed what it changed), its result is not msgpack's
    BAD_REQUEST = 5  # the request did not decode: nothing ran
    EXPIRED = 6  # the service holds no record of this client (expired, or never registered): nothing ran
    FORGOTTEN = 7  # a call below the client's lowest unanswered: answered before, not applied again
    REGISTERED = 8  # the answer to REGISTER; the body is [client id, client expiry (ms)]


def pack(value: Any) -> bytes:
    """msgpack bytes of ``value`` (TypeError, OverflowError, ValueError for what msgpack cannot carry)."""
    return msgpack.packb(value, use_bin_type=True)


def unpack(data: bytes | memoryview) -> Any:
    """The value of msgpack bytes (str as str, bin as bytes, arrays as lists, any scalar map key)."""
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def encode_request(
    kind: RequestKind, client_id: bytes, sequence: int, lowest_unanswered: int, body: bytes = b""
) -> bytes:
    return REQUEST_HEADER.pack(kind, PROTOCOL_VERSION, 0, client_id, sequence, lowest_unanswered) + body


def encode_reply(status: ReplyStatus, sequence: int, body: bytes) -> bytes:
    return REPLY_HEADER.pack(status, PROTOCOL_VERSION, 0, sequence) + body


def encode_error(status: ReplyStatus, sequence: int, type_name: str, message: str) -> bytes:
    return encode_reply(status, sequence, pack([type_name, message]))


def exception_type_name(error: BaseException) -> str:
    """``ValueError`` for a built-in, ``module.Class`` for any other."""
    kind = type(error)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
