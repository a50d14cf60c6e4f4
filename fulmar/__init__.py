"""fulmar: fault-tolerant replicated state machines for Python.

The root package holds the pieces every process shares (shared-memory
buffers, log buffers, frames, counters); the component packages
``fulmar.driver``, ``fulmar.archive``, ``fulmar.consensus``,
``fulmar.service``, ``fulmar.codecs`` and ``fulmar.cli`` live in the
repository's top-level folders of the same names.
"""

__version__ = "0.1.0"
