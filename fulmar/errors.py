"""Exceptions shared by every layer of fulmar."""


class FulmarError(Exception):
    """Base class of fulmar's own errors."""


class CodecError(FulmarError, ValueError):
    """Bytes that do not decode: truncated, garbage, or out of range.

    Raised by every decoder (SBE codecs, frame scanner, file readers) instead
    of reading out of bounds; the message says what was being decoded and
    which field or offset was wrong.
    """


class CorruptFrameError(CodecError):
    """A frame in a log buffer or datagram has an impossible header."""


class InvalidLogBufferError(FulmarError, ValueError):
    """A log buffer's parameters (term length, MTU, page size, file length) are invalid."""


class MessageTooLongError(FulmarError, ValueError):
    """A message is longer than the publication's maximum message length."""


class InvalidFrameBlockError(FulmarError, ValueError):
    """A block offered as whole frames is not: a frame's length, term offset
    or term id does not fit where the block would land in the term."""
