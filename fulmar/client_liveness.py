"""A client's process, declared in its heartbeat counter's label, so that its
driver can tell a dead client from a quiet one before the liveness timeout.

Aeron's driver learns that a client is gone only when its keepalives stop for
the whole client liveness timeout (10 s by default).  Until then everything
the dead client registered stays: its subscriptions keep their UDP ports
bound, so a process restarted in its place cannot take its own endpoints back
(``Address already in use``) for up to ten seconds.

fulmar's driver and its clients share one host (they share cnc.dat), so a
fulmar client says which process it is: it appends `` pid=<pid>
pidns=<inode of its pid namespace>`` to its heartbeat counter's label, the way
Aeron clients append their name and version to it.  When such a client has
been quiet for a while, the driver looks at that process: gone (or a zombie,
or a later process that reuses the pid) means the client is dead now, and it
is closed at once.  Nothing else changes: the label is free text to Aeron, a
real Aeron client (no declaration) keeps the liveness timeout, a client in
another pid namespace is never judged by a pid that is not its own, and a
stopped or busy client whose process lives keeps the liveness timeout too.
"""

from __future__ import annotations

import os
import re

import psutil

_DECLARATION = re.compile(r"(?:^| )pid=(\d+) pidns=(\d+)(?= |$)")
# psutil derives a process's start time from the boot time in whole seconds:
# a process may look up to a second older or younger than it is.
_CREATE_TIME_SLACK_MS = 2_000


def pid_namespace() -> int | None:
    """The inode of this process's pid namespace, or None where it cannot be known."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def process_declaration(pid: int | None = None, namespace: int | None = None) -> str | None:
    """What a client appends to its heartbeat counter's label, or None when
    its pid namespace cannot be known (then it declares nothing)."""
    namespace = pid_namespace() if namespace is None else namespace
    if namespace is None:
        return None
    return f" pid={os.getpid() if pid is None else pid} pidns={namespace}"


def declared_process(label: str) -> tuple[int, int] | None:
    """``(pid, pid namespace)`` declared in a heartbeat counter's label, or None."""
    # The last one: appended after anything else a label may hold.
    found = next(iter(reversed(list(_DECLARATION.finditer(label)))), None)
    if found is None:
        return None
    return int(found.group(1)), int(found.group(2))


def is_process_gone(pid: int, registered_ms: int) -> bool:
    """True when the process ``pid`` that registered a client at
    ``registered_ms`` (epoch ms) no longer runs: no such process, a zombie,
    or a process started after the registration (the pid was reused).  A
    process that cannot be inspected counts as alive."""
    try:
        process = psutil.Process(pid)
        with process.oneshot():
            if process.status() == psutil.STATUS_ZOMBIE:
                return True
            created_ms = int(process.create_time() * 1000)
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False
    return created_ms > registered_ms + _CREATE_TIME_SLACK_MS
