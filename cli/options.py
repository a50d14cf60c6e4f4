"""Option types and shared options of the fulmar commands.

Durations and sizes are parsed with the same helpers as channel URIs, so
``--publication-linger 5s`` means what ``linger=5s`` means on a channel, and
defaults are printed back in that notation (``--help`` shows ``10s``, not
``10000000000``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from fulmar.buffers import AtomicBuffer
from fulmar.channel_uri import parse_duration_ns, parse_size
from fulmar.driver.context import MEMBER_SECRET_ENV as DRIVER_MEMBER_SECRET_ENV
from fulmar.driver.context import default_driver_dir
from fulmar.idle import IDLE_STRATEGY_NAMES, Doorbell, idle_strategy_from_name

DRIVER_DIR_ENV = "FULMAR_DRIVER_DIR"
# The node's secret: clients of its cluster and of its archive present it.
CLUSTER_SECRET_ENV = "FULMAR_CLUSTER_SECRET"
# What a node's consensus module and services present to archives, when it
# differs from the cluster's secret (cluster-node start sets it from the
# archive's secret; nobody else needs to).
ARCHIVE_SECRET_ENV = "FULMAR_ARCHIVE_SECRET"
# What the members prove to each other that they are members with (the
# consensus stream's trailers, the MACs of the log's datagrams), when it is
# not to be derived from the cluster's secret: clients hold that one.  The
# driver reads it as well (its datagram MACs): its context names it.
MEMBER_SECRET_ENV = DRIVER_MEMBER_SECRET_ENV

_DURATION_UNITS = (("s", 1_000_000_000), ("ms", 1_000_000), ("us", 1_000), ("ns", 1))
_SIZE_UNITS = (("g", 1 << 30), ("m", 1 << 20), ("k", 1 << 10))


def format_duration(duration_ns: int) -> str:
    """The largest unit that shows ``duration_ns`` exactly: ``10s``, ``1500ms``."""
    for suffix, multiplier in _DURATION_UNITS:
        if duration_ns % multiplier == 0:
            return f"{duration_ns // multiplier}{suffix}"
    raise AssertionError("unreachable: every integer is a whole number of ns")


def format_size(length: int) -> str:
    """The largest binary unit that shows ``length`` exactly: ``64m``, ``1408``."""
    for suffix, multiplier in _SIZE_UNITS:
        if length and length % multiplier == 0:
            return f"{length // multiplier}{suffix}"
    return str(length)


class Duration(click.ParamType):
    """A duration with a unit (``10s``, ``500ms``, ``100us``), converted to ns.

    The channel-URI parser reads a bare number as nanoseconds (Aeron's rule);
    on a command line ``--client-liveness-timeout 10`` would then silently
    mean 10 ns, so a unit is required here.
    """

    name = "duration"

    def __init__(self, min_ns: int = 0) -> None:
        self.min_ns = min_ns

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            duration_ns = value
        else:
            text = str(value).strip()
            try:
                if not text[-1:].isalpha():
                    raise ValueError("a unit is required (ns, us, ms or s)")
                duration_ns = parse_duration_ns(text)
            except ValueError as error:
                self.fail(f"{value!r} is not a duration such as 10s or 500ms: {error}", param, ctx)
        if duration_ns < self.min_ns:
            self.fail(f"{value!r} is below the minimum of {format_duration(self.min_ns)}", param, ctx)
        return duration_ns


class Size(click.ParamType):
    """A byte count with an optional binary suffix (``64k``, ``16m``, ``1g``).

    ``power_of_two`` and ``multiple_of`` carry the constraint of the buffer the
    size is for, so a bad value is refused here, naming the option, instead
    of failing inside the driver.
    """

    name = "size"

    def __init__(self, low: int, high: int, power_of_two: bool = False, multiple_of: int = 1) -> None:
        self.low = low
        self.high = high
        self.power_of_two = power_of_two
        self.multiple_of = multiple_of

    def describe(self) -> str:
        shape = "a power of two" if self.power_of_two else "a size"
        if self.multiple_of > 1:
            shape += f" and a multiple of {self.multiple_of}"
        return f"{shape} from {format_size(self.low)} to {format_size(self.high)}"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            length = value
        else:
            try:
                length = parse_size(str(value).strip())
            except ValueError as error:
                self.fail(f"{value!r} is not a size such as 64k or 16m: {error}", param, ctx)
        if (
            not self.low <= length <= self.high
            or (self.power_of_two and length & (length - 1))
            or length % self.multiple_of
        ):
            self.fail(f"{value!r} must be {self.describe()}", param, ctx)
        return length


class IdleStrategyName(click.ParamType):
    """An idle strategy name as the driver's ``idle_strategy_from_name`` reads it."""

    name = "strategy"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value).strip()
        # Parse with the driver's own function so the command line accepts
        # exactly what the driver will; ``doorbell`` needs a doorbell to
        # build, and a throwaway one over private memory serves for that.
        try:
            idle_strategy_from_name(text, doorbell=Doorbell(AtomicBuffer(bytearray(8))))
        except ValueError as error:
            self.fail(str(error), param, ctx)
        return text

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "[" + "|".join(IDLE_STRATEGY_NAMES) + "]"


def resolve_driver_dir(directory: str | None) -> Path:
    """``--dir`` if given (or ``$FULMAR_DRIVER_DIR``, which click fills in), else the driver's default."""
    return Path(directory) if directory else default_driver_dir()


F = TypeVar("F", bound=Callable[..., Any])


def driver_dir_option(function: F) -> F:
    """``--dir``: the media driver directory, shared by every command."""
    return click.option(
        "--dir",
        "directory",
        type=click.Path(file_okay=False, dir_okay=True),
        envvar=DRIVER_DIR_ENV,
        default=None,
        # Described, not computed: the default depends on the user running the command.
        show_default="/dev/shm/fulmar-<user>",
        show_envvar=True,
        help="Media driver directory (holds cnc.dat).",
    )(function)
