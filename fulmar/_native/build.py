"""cffi (API mode) build of fulmar's native code: one extension, ``fulmar._native._fulmar_native``.

The C sits beside the Python of the process that runs it: the shared primitives
(atomics, term append and scan, ring buffer, broadcast, counters, doorbell, the
MAC both the driver and the consensus module compute) here in ``src/``, the
driver's data plane in ``driver/native/``, the consensus threads in
``consensus/native/``, the archive's recorder in ``archive/native/``, the log
decoder in ``analytics/native/``.  Every public header (a name not starting
with ``_``) holds plain declarations that cffi's cdef parser understands: no
include guards, no macros other than integer ``#define`` constants.

``python -m fulmar._native.build --check`` compiles every ``.c`` with the same
flags plus ``-Werror`` and writes nothing (``make test`` runs it): a warning
fails the project's tests, never a user's ``pip install`` with a newer compiler.
"""

import os
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path

from cffi import FFI

# This file is fulmar/_native/build.py; the process folders are fulmar's
# subpackages (symlinks in the repository, copies in an sdist), so they are
# found through the package whichever way it was laid out.
NATIVE = Path(__file__).resolve().parent
PACKAGE = NATIVE.parent

# cffi reads the headers in this order, and a header must come after every
# header whose types it names: the shared primitives first (the threads name
# term.h's log writer), then each process's folder.  Within a folder the
# headers are listed for the same reason (the consensus threads' arms name
# member_auth.h's context), so adding a header means adding it here.
FOLDERS: tuple[tuple[Path, tuple[str, ...]], ...] = (
    (NATIVE / "src", ("atomics.h", "broadcast.h", "counters.h", "doorbell.h", "mac.h", "ring_buffer.h", "term.h")),
    (
        PACKAGE / "driver" / "native",
        (
            "udp.h",
            "dataplane.h",
            "flow_control.h",
            "image_state.h",
            "loss.h",
            "rebuild.h",
            "retransmit.h",
            "sender_timing.h",
        ),
    ),
    (
        PACKAGE / "consensus" / "native",
        ("member_auth.h", "append_position.h", "leader_commit.h", "leader_ingress.h"),
    ),
    (PACKAGE / "archive" / "native", ("recorder.h",)),
    (PACKAGE / "analytics" / "native", ("log_decode.h",)),
)

COMPILE_ARGS = ["-O3", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter"]
# the multicast NAK delay's log and exp; the record checksum's CRC-32; the members' MACs (mac.c)
LIBRARIES = ["m", "z", "crypto"]


def _relative(path: Path) -> str:
    # setuptools wants source paths relative to the project root (the cwd of
    # the build); fall back to absolute when built from elsewhere.
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


def _public_headers() -> list[Path]:
    headers: list[Path] = []
    for folder, names in FOLDERS:
        found = {p.name for p in folder.glob("*.h") if not p.name.startswith("_")}
        # a header missing from the list would compile but leave its functions
        # out of lib without a word; say so at build time instead
        if found != set(names):
            raise SystemExit(f"{folder}: public headers {sorted(found)} but FOLDERS lists {sorted(names)}")
        headers.extend(folder / name for name in names)
    return headers


public_headers = _public_headers()
include_dirs = [folder for folder, _ in FOLDERS]
c_sources = [c for folder in include_dirs for c in sorted(folder.glob("*.c"))]

ffibuilder = FFI()
ffibuilder.cdef("\n".join(h.read_text() for h in public_headers))
# cffi wraps every call in Py_BEGIN/END_ALLOW_THREADS.  Releasing and
# re-taking the GIL costs more than most of these functions (an append is tens
# of nanoseconds), and none of them blocks except the doorbell wait, which
# releases the GIL itself.  So the wrappers of this module keep the GIL.
KEEP_THE_GIL = """
#undef Py_BEGIN_ALLOW_THREADS
#define Py_BEGIN_ALLOW_THREADS {
#undef Py_END_ALLOW_THREADS
#define Py_END_ALLOW_THREADS }
"""

# FULMAR_NATIVE_CFLAGS adds flags to the build (make test-native-asan's
# sanitizers); a plain install leaves it unset.
extra_flags = shlex.split(os.environ.get("FULMAR_NATIVE_CFLAGS", ""))

ffibuilder.set_source(
    "fulmar._native._fulmar_native",
    '#include "_common.h"\n' + "".join(f'#include "{h.name}"\n' for h in public_headers) + KEEP_THE_GIL,
    sources=[_relative(c) for c in c_sources],
    include_dirs=[_relative(d) for d in include_dirs],
    libraries=LIBRARIES,
    extra_compile_args=COMPILE_ARGS + extra_flags,
    extra_link_args=extra_flags,
)


def check() -> int:
    """Compile every source with -Werror into nothing; the exit status says whether all were clean."""
    cc = os.environ.get("CC", "cc")
    # doorbell.c takes Python.h (its wait releases the GIL itself)
    includes = [f"-I{d}" for d in include_dirs] + [f"-I{sysconfig.get_paths()['include']}"]
    failed = 0
    for source in c_sources:
        command = [cc, *COMPILE_ARGS, "-Werror", *includes, "-c", str(source), "-o", os.devnull]
        if subprocess.run(command).returncode != 0:
            failed += 1
    print(f"native check: {len(c_sources) - failed} of {len(c_sources)} C files compile cleanly with -Werror")
    return 1 if failed else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        sys.exit(check())
    ffibuilder.compile(verbose=True)
