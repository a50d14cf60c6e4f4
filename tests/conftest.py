"""Shared fixtures: every process a test starts is reaped, even on failure."""

from __future__ import annotations

import multiprocessing
import multiprocessing.process
from collections.abc import Iterator

import pytest

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
