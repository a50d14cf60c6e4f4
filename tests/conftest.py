"""Shared fixtures: every process a test starts is reaped, even on failure."""

from __future__ import annotations

import multiprocessing
import multiprocessing.process
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from fulmar.aeron import Aeron
    from support.driver import DriverProcess

# Child processes are forked: they inherit the mapped files' paths and the
# imported native extension, and start in milliseconds.
FORK = multiprocessing.get_context("fork")


@pytest.fixture
def child_processes() -> Iterator[list[multiprocessing.process.BaseProcess]]:
    """A list to put started processes in; all are killed and joined afterwards."""
    processes: list[multiprocessing.process.BaseProcess] = []
    yield processes
    for process in processes:
        if process.is_alive():
            process.kill()
    for process in processes:
        process.join(timeout=10)
        if process.is_alive():  # pragma: no cover - a process that ignores SIGKILL
            raise RuntimeError(f"could not reap child process {process.pid}")


@pytest.fixture
def driver_dir() -> Iterator[Path]:
    """A fresh directory for a media driver under /dev/shm, removed afterwards."""
    from support.driver import new_driver_dir, remove_driver_dir

    directory = new_driver_dir()
    yield directory
    remove_driver_dir(directory)


@pytest.fixture
def start_driver(driver_dir: Path) -> Iterator[Callable[..., DriverProcess]]:
    """Start media driver processes (in driver_dir by default); all are stopped afterwards."""
    from support.driver import DriverProcess

    drivers: list[DriverProcess] = []

    def start(directory: Path | None = None, **options: object) -> DriverProcess:
        driver = DriverProcess(directory or driver_dir, **options)
        drivers.append(driver)
        return driver

    yield start
    for driver in drivers:
        driver.stop()


@pytest.fixture
def aeron(start_driver: Callable[..., DriverProcess]) -> Iterator[Aeron]:
    """A client of a fresh media driver, closed afterwards (the driver is stopped by start_driver)."""
    client = start_driver().connect()
    try:
        yield client
    finally:
        client.close()
