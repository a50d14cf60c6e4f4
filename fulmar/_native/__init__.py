"""The compiled hot path (cffi, API mode), built by ``pip install``.

``ffi`` and ``lib`` are the raw cffi objects; the rest of the package wraps
them in small Python classes that turn return codes into exceptions.
"""

try:
    from fulmar._native._fulmar_native import ffi, lib
except ImportError as exc:  # pragma: no cover - only without a build
    raise ImportError(
        "fulmar's native extension is not built; install the package "
        "(make install, or pip install -e .) so cffi compiles it"
    ) from exc

__all__ = ["ffi", "lib"]
