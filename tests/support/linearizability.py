"""A linearizability checker for histories recorded against the key-value sample service.

The model is ``KeyValueService`` (``service/samples.py``): a map from string keys to
JSON-like scalar values (``None`` = absent), with three operations per key:

- ``put(key, value)`` stores ``value`` and returns the previous value;
- ``get(key)`` returns the current value;
- ``cas(key, expected, value)`` swaps iff ``current == expected`` and returns
  ``swapped`` and the current value *after* the operation (``value`` when it swapped).

History format
--------------
A history is an iterable of :class:`Operation`, one per request a client issued, in any
order.  Each records:

- ``client``: the client's id (informational; a client may have several requests in flight);
- ``op``: ``"get"``, ``"put"`` or ``"cas"``; ``key``: the key;
- the inputs: ``value`` (put and cas: the value written) and ``expected`` (cas);
- ``invoke``: when the request was sent, ``complete``: when its reply was received
  (ints, e.g. ``time.monotonic_ns()``, or floats; one clock for the whole history);
- ``outcome``:

  - ``"ok"``: the reply was received.  ``output`` is the value read (get), the current
    value after the operation (cas) or the previous value (put); ``swapped`` is the cas
    result.  A put's ``output`` is optional: leave it :data:`UNRECORDED` to not check it;
    a cas's ``output`` may be left unrecorded too, a get's may not.  A cas that returned
    ``swapped=False`` is an "ok" operation (it observed ``current != expected`` and
    ``output == current``), not a "fail".
  - ``"fail"``: the request definitely did not take effect (e.g. rejected before it was
    appended to the log).  The checker drops it.
  - ``"unknown"``: no reply (timed out, connection lost).  It may have taken effect at any
    instant after ``invoke`` or not at all; ``complete`` and ``output`` are ignored.  An
    unknown ``get`` constrains nothing and is dropped; an unknown put or cas is searched
    with no completion time (as Knossos and Porcupine do: return at +infinity), so that it
    may be linearized anywhere after its invocation, or after every other operation, which
    is the same as never.  An unknown put or cas whose written value no check could see is
    dropped up front (it cannot change any check's outcome): "seen" values are the ok
    operations' outputs and every cas's expected value, and nothing is dropped from a
    partition holding a failed cas whose output was not recorded (it saw "anything but
    expected").

Real-time order: ``a`` precedes ``b`` iff ``a.complete < b.invoke``.  Equal timestamps are
treated as concurrent (calls are ordered before returns), which never reports a false
anomaly from a coarse clock.

Values are compared with ``==`` (as the service's cas does): ``1``, ``1.0`` and ``True``
are the same value.  Values must be hashable.

Algorithm
---------
The history is partitioned per key (the model's keys are independent) and each partition is
checked by the Wing & Gong / Lowe depth-first search (as in Porcupine): call and return
events in a doubly-linked list sorted by time; repeatedly linearize an operation whose call
precedes the first pending return, apply it to the model, lift its events out of the list,
and backtrack when a return is reached whose operation is not linearized.  Visited
(linearized set as an int bitset, model state) pairs are memoized, with subsumption over the
unknown operations (having applied more of them never opens a future that having applied
fewer lacks).  Unknown operations with the same effect are interchangeable, so they are only
linearized in invocation order (the one invoked first can stand wherever a later one could).
Written values that no check compares the state with are indistinguishable, so the search
writes one stand-in for all of them, which merges model states (reported states are replayed
with the real values).  A step budget per key and an optional overall time limit bound the
search: on exhaustion a key's result is ``ok=None`` ("unknown"), distinct from pass and fail.

Cost: a linearizable partition of a few hundred operations from ~10 clients checks in tens of
milliseconds.  A *non*-linearizable one must exhaust every ordering before the anomaly.  That
is cheap when written values are unique (write e.g. a per-run counter) and every output is
recorded (the service's replies carry put's previous value and cas's current value), since
unknown writes nobody saw are then dropped.  It can run out of the default budget (2 million
steps, about a second) when a few values are written over and over, or outputs are not
recorded, with many concurrent and unknown operations, or when dozens of operations are all
mutually concurrent.

Public API: :class:`Operation`, :data:`UNRECORDED`, :func:`check` (``DEFAULT_MAX_STEPS``),
and the result types :class:`CheckResult`, :class:`KeyResult`, :class:`Step`, :class:`Candidate`.
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

Value = None | bool | int | float | str
"""A JSON-like scalar; ``None`` is "absent"."""


class _Unrecorded(enum.Enum):
    UNRECORDED = "UNRECORDED"

    def __repr__(self) -> str:
        return "UNRECORDED"


UNRECORDED = _Unrecorded.UNRECORDED
"""The ``output`` of an operation whose output was not recorded (or is unknown)."""

OPS = ("get", "put", "cas")
OUTCOMES = ("ok", "fail", "unknown")

DEFAULT_MAX_STEPS = 2_000_000


@dataclass(frozen=True)
class Operation:
    """One client request and what came of it (see the module docstring)."""

    client: int
    op: str
    key: str
    invoke: float
    complete: float | None = None
    outcome: str = "ok"
    value: Value = None
    expected: Value = None
    output: Value | _Unrecorded = UNRECORDED
    swapped: bool | None = None

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"unknown op {self.op!r}")
        if self.outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {self.outcome!r}")
        if self.outcome == "ok":
            if self.complete is None:
                raise ValueError(f"an ok operation needs a completion time: {self}")
            if self.complete < self.invoke:
                raise ValueError(f"completed before it was invoked: {self}")
            if self.op == "get" and self.output is UNRECORDED:
                raise ValueError(f"an ok get needs its output: {self}")
            if self.op == "cas" and self.swapped is None:
                raise ValueError(f"an ok cas needs swapped: {self}")

    def describe(self) -> str:
        """E.g. ``client 3 cas('k', 1 -> 2) [10, 20] ok swapped=True value=2``."""
        if self.op == "get":
            call = f"get({self.key!r})"
        elif self.op == "put":
            call = f"put({self.key!r}, {self.value!r})"
        else:
            call = f"cas({self.key!r}, {self.expected!r} -> {self.value!r})"
        if self.outcome != "ok":
            return f"client {self.client} {call} [{self.invoke}, ...] {self.outcome}"
        text = f"client {self.client} {call} [{self.invoke}, {self.complete}] ok"
        if self.op == "cas":
            text += f" swapped={self.swapped}"
        if self.output is not UNRECORDED:
            name = {"get": "value", "put": "previous", "cas": "value"}[self.op]
            text += f" {name}={self.output!r}"
        return text


@dataclass(frozen=True)
class Step:
    """A linearized operation and the model's state (the key's value) after it."""

    operation: Operation
    state: Value


@dataclass(frozen=True)
class Candidate:
    """An operation that could be linearized next after the longest linearizable prefix.

    ``accepted`` says whether the model accepts its recorded output there (if it does,
    every continuation after it failed further on); ``model_output`` is what the model
    would return there (get: the value, put: the previous value, cas: the value after),
    ``model_swapped`` what a cas would return as swapped (None for get and put).
    """

    operation: Operation
    accepted: bool
    model_output: Value
    model_swapped: bool | None

    def describe(self) -> str:
        if self.operation.op == "cas":
            model = f"swapped={self.model_swapped} value={self.model_output!r}"
        elif self.operation.op == "put":
            model = f"previous={self.model_output!r}"
        else:
            model = f"value={self.model_output!r}"
        verdict = "consistent here, but a dead end later" if self.accepted else "model would give " + model
        return f"{self.operation.describe()}  -- {verdict}"


@dataclass(frozen=True)
class KeyResult:
    """The verdict for one key.

    ``ok``: True (linearizable), False (not), None (budget exhausted).
    ``linearization``: on success an order found (including the unknown operations it
    chose to apply); otherwise the longest linearizable prefix found.
    ``candidates``: on failure (and budget exhaustion), the operations that could have been
    linearized after that prefix, none of which led to a complete linearization.
    """

    key: str
    ok: bool | None
    operations: int
    dropped: int
    steps: int
    linearization: tuple[Step, ...] = ()
    candidates: tuple[Candidate, ...] = ()

    def explain(self, max_prefix: int = 20) -> str:
        verdict = {True: "linearizable", False: "NOT linearizable", None: "unknown (budget exhausted)"}[self.ok]
        lines = [
            f"key {self.key!r}: {verdict} ({self.operations} operations checked, "
            f"{self.dropped} dropped, {self.steps} search steps)"
        ]
        if self.ok:
            return lines[0]
        shown = self.linearization[-max_prefix:] if max_prefix > 0 else ()
        lines.append(
            f"  longest linearizable prefix: {len(self.linearization)} operations"
            + (f" (last {len(shown)} shown)" if len(shown) < len(self.linearization) else "")
        )
        first = len(self.linearization) - len(shown)
        for index, step in enumerate(shown, start=first + 1):
            lines.append(f"    {index}. {step.operation.describe()}  => {step.state!r}")
        state = self.linearization[-1].state if self.linearization else None
        lines.append(f"  state after the prefix: {state!r}; operations that could come next:")
        for candidate in self.candidates:
            lines.append(f"    {candidate.describe()}")
        return "\n".join(lines)


@dataclass(frozen=True)
class CheckResult:
    """``ok``: False if any key is not linearizable, else None if any key's budget ran out,
    else True.  ``keys``: the per-key results, sorted by key."""

    ok: bool | None
    keys: dict[str, KeyResult] = field(default_factory=dict)

    @property
    def failures(self) -> list[KeyResult]:
        return [result for result in self.keys.values() if result.ok is False]

    @property
    def undecided(self) -> list[KeyResult]:
        return [result for result in self.keys.values() if result.ok is None]

    def explain(self) -> str:
        if self.ok:
            return f"linearizable ({len(self.keys)} keys)"
        return "\n".join(result.explain() for result in self.failures + self.undecided)

    def __str__(self) -> str:
        return self.explain()


def check(
    history: Iterable[Operation],
    *,
    max_steps: int | None = DEFAULT_MAX_STEPS,
    timeout: float | None = None,
) -> CheckResult:
    """Check a key-value history for linearizability.

    ``max_steps`` bounds the search per key (None: unbounded); ``timeout`` (seconds) bounds
    the whole check.  Keys whose search runs out get ``ok=None``.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    partitions: dict[str, list[Operation]] = {}
    for operation in history:
        partitions.setdefault(operation.key, []).append(operation)
    results = {key: _check_key(key, partitions[key], max_steps, deadline) for key in sorted(partitions)}
    verdicts = [result.ok for result in results.values()]
    ok: bool | None = False if False in verdicts else None if None in verdicts else True
    return CheckResult(ok=ok, keys=results)


# Operation kinds for the search, decided once per operation.
_GET = 0  # ok get: state must equal a
_PUT_CHECKED = 1  # ok put with recorded previous a; writes b
_PUT = 2  # put without a recorded previous (ok or unknown): writes b
_CAS_SWAPPED = 3  # ok cas, swapped: state must equal a (expected); writes b
_CAS_FAILED = 4  # ok cas, not swapped: state must differ from a; state must equal c if recorded
_CAS_UNKNOWN = 5  # unknown cas: writes b iff state equals a
_IMPOSSIBLE = 6  # an output no state can produce (a swapped cas reporting a value it did not write)


class _Unobserved:
    """Stands for every written value that no operation's check compares the state with."""

    def __repr__(self) -> str:
        return "<unobserved>"


_UNOBSERVED: Any = _Unobserved()
_Compiled = tuple[int, Any, Any, Any]


def _compile(operation: Operation, observed: set[Value]) -> _Compiled:
    # Values no check compares with are indistinguishable: writing any of them is the same
    # effect, which merges model states and makes such unknown writes interchangeable.
    written = operation.value if operation.value in observed else _UNOBSERVED
    if operation.op == "get":
        return (_GET, operation.output, None, UNRECORDED)
    if operation.op == "put":
        if operation.outcome == "ok" and operation.output is not UNRECORDED:
            return (_PUT_CHECKED, operation.output, written, UNRECORDED)
        return (_PUT, None, written, UNRECORDED)
    if operation.outcome == "unknown":
        return (_CAS_UNKNOWN, operation.expected, written, UNRECORDED)
    if operation.swapped:
        if operation.output is not UNRECORDED and not operation.output == operation.value:
            return (_IMPOSSIBLE, None, None, UNRECORDED)
        return (_CAS_SWAPPED, operation.expected, written, UNRECORDED)
    return (_CAS_FAILED, operation.expected, None, operation.output)


def _retain(operations: Sequence[Operation]) -> tuple[list[Operation], set[Value]]:
    """Drop failed operations, unknown gets, and unknown writes no operation could observe;
    return the rest and the values some check compares the state with."""
    live = [op for op in operations if op.outcome != "fail" and not (op.outcome == "unknown" and op.op == "get")]
    observed: set[Value] = set()
    for op in live:
        if op.outcome == "ok" and not isinstance(op.output, _Unrecorded):
            observed.add(op.output)
        if op.op == "cas":
            observed.add(op.expected)
    if any(op.op == "cas" and op.outcome == "ok" and not op.swapped and op.output is UNRECORDED for op in live):
        return live, observed  # a failed cas whose output was not recorded sees "anything but expected"
    return [op for op in live if op.outcome == "ok" or op.value in observed], observed


def _replay(operation: Operation, state: Value) -> Value:
    """The state after an operation the search linearized at ``state`` (real values)."""
    if operation.op == "get" or (operation.op == "cas" and not state == operation.expected):
        return state
    return operation.value


def _model(kind: int, a: Any, b: Any, c: Any, state: Any) -> tuple[bool, Any]:
    """Apply a compiled operation: (accepted, new state).  The search inlines this."""
    if kind == _GET:
        return state == a, state
    if kind == _PUT_CHECKED:
        return state == a, b
    if kind == _PUT:
        return True, b
    if kind == _CAS_SWAPPED:
        return state == a, b
    if kind == _CAS_FAILED:
        return (not state == a) and (c is UNRECORDED or state == c), state
    if kind == _CAS_UNKNOWN:
        return True, (b if state == a else state)
    return False, state


def _check_key(key: str, operations: list[Operation], max_steps: int | None, deadline: float | None) -> KeyResult:
    ops, observed = _retain(operations)
    dropped = len(operations) - len(ops)
    n = len(ops)
    compiled = [_compile(op, observed) for op in ops]
    finite = [op.outcome == "ok" for op in ops]

    # Events sorted by time, calls before returns at equal times; unknown ops have no return.
    events: list[tuple[float, int, int]] = []
    for index, op in enumerate(ops):
        events.append((op.invoke, 0, index))
        if finite[index]:
            assert op.complete is not None
            events.append((op.complete, 1, index))
    events.sort()
    m = len(events)
    tail = m + 1
    nxt = list(range(1, m + 2)) + [tail]
    prv = [0] + list(range(0, m + 1))
    node_op = [-1] * (m + 2)
    is_call = [False] * (m + 2)
    call_of = [0] * n
    return_of = [-1] * n
    for position, (_, kind, index) in enumerate(events, start=1):
        node_op[position] = index
        if kind == 0:
            is_call[position] = True
            call_of[index] = position
        else:
            return_of[index] = position

    # Symmetry: unknown operations with the same effect are interchangeable, and the one invoked
    # first can stand wherever a later one could; so they are linearized in invocation order.
    need = [0] * n
    last_of_class: dict[tuple[int, Any, Any], int] = {}
    for index in sorted(range(n), key=lambda i: (ops[i].invoke, i)):
        if not finite[index]:
            kind, a, b, _ = compiled[index]
            effect = (kind, a, b)
            if effect in last_of_class:
                need[index] = 1 << last_of_class[effect]
            last_of_class[effect] = index

    remaining = sum(finite)
    state: Any = None
    linearized = 0
    stack: list[tuple[int, Any]] = []  # (op index, state before it)
    # Memo.  Without unknown operations: the visited (linearized set, state) pairs.  With them,
    # per (linearized ok operations, state), the sets of linearized unknown operations seen: a
    # configuration that applied a superset of a seen one's unknown operations has no future the
    # seen one lacks (it may leave those out), so it is pruned too.
    cache: set[tuple[int, Any]] = set()
    subsumed: dict[tuple[int, Any], list[int]] = {}
    unknown_mask = sum(1 << index for index in range(n) if not finite[index])
    finite_mask = ((1 << n) - 1) ^ unknown_mask
    best: list[tuple[int, Any]] = []
    steps = 0
    limit = max_steps if max_steps is not None else math.inf
    verdict: bool | None = None
    # Each node's candidates are tried in two passes: ok operations first, then unknown ones,
    # so that configurations with fewer unknown operations applied are seen (and subsume the
    # others) first.
    second = False
    node = nxt[0]
    while True:
        if remaining == 0:
            verdict = True
            break
        if steps >= limit or (deadline is not None and steps & 1023 == 1023 and time.monotonic() > deadline):
            verdict = None
            break
        steps += 1
        if is_call[node]:
            index = node_op[node]
            if finite[index] == second:
                node = nxt[node]
                continue
            kind, a, b, c = compiled[index]
            # The model, inlined (see _model).
            if kind == _GET:
                accepted, new_state = state == a, state
            elif kind == _PUT:
                accepted, new_state = True, b
            elif kind == _PUT_CHECKED or kind == _CAS_SWAPPED:
                accepted, new_state = state == a, b
            elif kind == _CAS_FAILED:
                accepted, new_state = (not state == a) and (c is UNRECORDED or state == c), state
            elif kind == _CAS_UNKNOWN:
                accepted, new_state = True, (b if state == a else state)
            else:
                accepted, new_state = False, state
            if accepted and (linearized & need[index]) == need[index]:
                bits = linearized | (1 << index)
                if unknown_mask:
                    memo = (bits & finite_mask, new_state)
                    applied = bits & unknown_mask
                    seen = subsumed.get(memo)
                    if seen is None:
                        subsumed[memo] = [applied]
                        fresh = True
                    else:
                        fresh = not any((other & ~applied) == 0 for other in seen)
                        if fresh:
                            seen[:] = [other for other in seen if (applied & ~other) != 0]
                            seen.append(applied)
                else:
                    memo = (bits, new_state)
                    fresh = memo not in cache
                    if fresh:
                        cache.add(memo)
                if fresh:
                    stack.append((index, state))
                    # Lift the call and its return out of the list.
                    p, q = prv[node], nxt[node]
                    nxt[p], prv[q] = q, p
                    ret = return_of[index]
                    if ret >= 0:
                        p, q = prv[ret], nxt[ret]
                        nxt[p], prv[q] = q, p
                        remaining -= 1
                    linearized, state = bits, new_state
                    if len(stack) > len(best):
                        best = list(stack)
                    second = False
                    node = nxt[0]
                    continue
            node = nxt[node]
        elif not second and unknown_mask:
            second = True
            node = nxt[0]
        else:
            # A return whose operation is not linearized: nothing before it works; backtrack.
            if not stack:
                verdict = False
                break
            index, state = stack.pop()
            linearized &= ~(1 << index)
            ret = return_of[index]
            if ret >= 0:
                nxt[prv[ret]] = ret
                prv[nxt[ret]] = ret
                remaining += 1
            call = call_of[index]
            nxt[prv[call]] = call
            prv[nxt[call]] = call
            node = nxt[call]
            second = not finite[index]

    if verdict:
        best = stack
    # The search's states may hold the <unobserved> stand-in: replay the real values.
    steps_after: list[Step] = []
    real: Value = None
    for index, _ in best:
        real = _replay(ops[index], real)
        steps_after.append(Step(ops[index], real))
    candidates: tuple[Candidate, ...] = ()
    if not verdict:
        candidates = _candidates(ops, compiled, {index for index, _ in best}, real)
    return KeyResult(
        key=key,
        ok=verdict,
        operations=n,
        dropped=dropped,
        steps=steps,
        linearization=tuple(steps_after),
        candidates=candidates,
    )


def _candidates(
    ops: list[Operation],
    compiled: list[_Compiled],
    done: set[int],
    state: Value,
) -> tuple[Candidate, ...]:
    """The operations that could be linearized right after a prefix, with the model's view."""
    pending = [index for index in range(len(ops)) if index not in done]
    horizon: float = math.inf
    for index in pending:
        complete = ops[index].complete
        if ops[index].outcome == "ok" and complete is not None and complete < horizon:
            horizon = complete
    result = []
    for index in pending:
        op = ops[index]
        if op.invoke > horizon:
            continue
        accepted, after = _model(*compiled[index], state)
        if op.op == "get":
            result.append(Candidate(op, accepted, state, None))
        elif op.op == "put":
            result.append(Candidate(op, accepted, state, None))
        else:
            swapped = state == op.expected
            result.append(Candidate(op, accepted, op.value if swapped else state, swapped))
    result.sort(key=lambda candidate: (candidate.accepted, candidate.operation.invoke))
    return tuple(result)
