"""GENERATED FILE - DO NOT EDIT. Codecs generated from codecs/schemas/ by fulmar.codecs.generate.

Import the module you need (``from fulmar.codecs.generated import cluster``); they are
not imported eagerly, so a process pays only for the protocols it speaks.
"""

__all__ = ["cluster", "archive", "driver", "archive_mark", "cluster_mark"]
