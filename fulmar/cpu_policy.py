"""How a node's processes ask Linux to schedule them.

A round trip through a cluster is a chain of processes waking one another:
a driver writes a datagram, the next driver wakes and reads it, rings its
archive, which rings its consensus module, and so on.  Under Linux's default
policy (SCHED_OTHER) a thread that is woken may preempt the thread that woke
it on the same core.  On loopback that happens in the middle of a
``sendmmsg``: the leader's driver hands a follower's socket the first
datagram of a burst, the follower's driver preempts it, reads that one
datagram, wakes its archive and module, and only then does the leader's
driver get its core back to send the next.  A burst of 40 datagrams then
costs 40 rounds of wake-ups instead of one, and a cluster falls into that
per-datagram pattern and stays there (measured: a follower restarted on a
fresh three-node cluster took the echo from 112,000 to 80,500 messages/s).

SCHED_BATCH is SCHED_OTHER without that wake-up preemption: a woken thread
runs on an idle core at once, or on a busy one when its thread sleeps or
its time slice ends.  Every fulmar process sleeps as soon as its work is
done, so nothing waits long, and bursts are read whole.  The same restarted
cluster under SCHED_BATCH echoed 162,700-170,000 messages/s, and one message
at a time went round in 556-562 us at the median instead of 611-615.

It needs no privilege (``sched_setscheduler(2)``: an unprivileged thread may
move between SCHED_OTHER and SCHED_BATCH), it leaves priorities (nice)
alone, and a thread inherits it from the thread that creates it, a process
from its parent.  ``normal`` keeps Linux's default.  A real-time or idle
policy the process was started under is left as it was.
"""

from __future__ import annotations

import os

BATCH = "batch"
NORMAL = "normal"
CPU_POLICIES = (BATCH, NORMAL)
DEFAULT_CPU_POLICY = BATCH
CPU_POLICY_ENV = "FULMAR_CPU_POLICY"


class CpuPolicyError(OSError):
    """Linux refused the scheduling policy."""


def _linux_policy(name: str) -> int:
    if name == BATCH:
        return os.SCHED_BATCH
    if name == NORMAL:
        return os.SCHED_OTHER
    raise ValueError(f"CPU policy {name!r}: one of {', '.join(CPU_POLICIES)}")


def apply_cpu_policy(name: str) -> None:
    """Put every thread of this process under ``name``'s policy (the threads
    started later inherit it from the one that starts them).  Only threads
    under one of the two policies this chooses between are moved: a policy an
    operator set on purpose (SCHED_FIFO or SCHED_RR for low latency,
    SCHED_IDLE for a background node, say by systemd's CPUSchedulingPolicy)
    is left as it is."""
    policy = _linux_policy(name)
    for entry in os.listdir("/proc/self/task"):
        tid = int(entry)
        try:
            if os.sched_getscheduler(tid) not in (os.SCHED_OTHER, os.SCHED_BATCH):
                continue
            os.sched_setscheduler(tid, policy, os.sched_param(0))
        except ProcessLookupError:
            continue  # the thread ended meanwhile
        except OSError as error:
            raise CpuPolicyError(
                error.errno, f"cannot put thread {entry} under the {name} CPU policy: {error.strerror}"
            ) from None


def cpu_policy_of(tid: int) -> str:
    """The policy thread ``tid`` runs under, by its name here (or Linux's number)."""
    policy = os.sched_getscheduler(tid)
    if policy == os.SCHED_BATCH:
        return BATCH
    if policy == os.SCHED_OTHER:
        return NORMAL
    return str(policy)
