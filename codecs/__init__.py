"""fulmar.codecs: SBE schemas, the generator, and the generated codecs.

- ``schemas/``: the XML schemas (cluster id 111 v12, archive id 101 v10, and
  fulmar's headerless driver command protocol).
- ``generate.py``: ``python -m fulmar.codecs.generate`` (``make codecs``) turns
  them into ``generated/cluster.py``, ``generated/archive.py`` and
  ``generated/driver.py``.
- ``runtime.py``: support code the generated modules share.
- ``CodecError``: the one exception every decoder raises for bad input.

Import the codecs themselves from ``fulmar.codecs.generated``; this package does
not import them eagerly so that the generator still runs when they are stale.
"""

from .errors import CodecError

__all__ = ["CodecError"]
