"""The one exception the codecs raise for bad input."""

from __future__ import annotations

from fulmar.errors import CodecError as _CodecError


class CodecError(_CodecError):
    """A buffer could not be decoded, or values could not be encoded.

    Raised for truncated or garbage input (short buffers, lengths that run past
    the end, negative lengths, absurd group counts, a wrong schema or template
    id, text that is not US-ASCII) and for values that do not fit their wire
    type or a buffer that is too small when encoding.  The message names the
    schema, the template and, where one is to blame, the field, e.g.
    ``cluster.SessionEvent(2).detail: length 4096 exceeds the 12 bytes left``.

    It is a kind of ``fulmar.errors.CodecError``, which the frame scanner and
    the file readers raise too, so one ``except`` covers every decoder.
    """

    def __init__(self, schema: str, template: str | None, field: str | None, reason: str) -> None:
        self.schema = schema
        self.template = template
        self.field = field
        self.reason = reason
        where = schema
        if template:
            where += "." + template
        if field:
            where += "." + field
        super().__init__(f"{where}: {reason}")
