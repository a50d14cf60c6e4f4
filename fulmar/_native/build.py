"""cffi (API mode) build of fulmar's native hot path.

Every public header in ``src/`` (a name not starting with ``_``) holds plain
declarations that cffi's cdef parser understands: no include guards, no
macros other than integer ``#define`` constants.  Each component adds one
header and one ``.c`` file; this script picks them all up, so adding a
component never means editing the build.
"""

import os
from pathlib import Path

from cffi import FFI

SRC = Path(__file__).resolve().parent / "src"


def _relative(path: Path) -> str:
    # setuptools wants source paths relative to the project root (the cwd of
    # the build); fall back to absolute when built from elsewhere.
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


# cffi reads the headers in order, so a header whose types others use comes
# first (the rest alphabetically): the consensus threads' arms name the
# members' auth context.
FOUNDATIONS = ("term.h", "udp.h", "member_auth.h")
public_headers = sorted(
    (p for p in SRC.glob("*.h") if not p.name.startswith("_")),
    key=lambda p: (p.name not in FOUNDATIONS, p.name),
)
c_sources = sorted(SRC.glob("*.c"))

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

ffibuilder.set_source(
    "fulmar._native._fulmar_native",
    '#include "_common.h"\n' + "".join(f'#include "{h.name}"\n' for h in public_headers) + KEEP_THE_GIL,
    sources=[_relative(c) for c in c_sources],
    include_dirs=[_relative(SRC)],
    # the multicast NAK delay's log and exp; the record checksum's CRC-32; the members' MACs (mac.c)
    libraries=["m", "z", "crypto"],
    extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
