"""The PySpark data source ``fulmar-log`` (Spark 4's Python Data Source API).

::

    df = spark.read.format("fulmar-log").load("/var/fulmar/node0/archive")

(Spark finds it through the top-level module ``pyspark_fulmar``; where that
is not on Spark's Python path, e.g. an editable install, call
``register(spark)`` first.)

::

    df = spark.read.format("fulmar-log").option("messageTypes", "TimerEvent").load([dir0, dir1, dir2])

Each segment file of each log recording is one partition, read by an
executor with :mod:`fulmar.analytics.log_decoder` and handed to Spark as
Arrow batches.  Options (all optional):

- ``recordingIds``: ``"3,7"``: these recordings (whatever their stream)
  instead of every recording of the log stream;
- ``fromPosition`` / ``toPosition``: only messages whose ``log_position``
  is in ``[from, to)``; segments outside are not read;
- ``messageTypes``: ``"SessionMessageHeader,TimerEvent"``;
- ``mode``: ``FAILFAST`` (default: corrupt data fails the query with an
  error naming the file and position) or ``PERMISSIVE`` (each corrupt
  region is skipped and becomes one row of type ``Corrupt`` whose
  ``corrupt_record`` says what was skipped, and a warning is logged).

The options, unlike ``df.filter(...)``, narrow what is read: segments
outside the position range are never opened.  (No ``pushFilters``: in
Spark 4.1 a filter pushed into one scan of a source leaked into another
scan of the same DataFrame in one plan, e.g. a self-join; seen here.)
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from .log_decoder import SCHEMA_DDL, DecodeStats, LogSegment, ReadOptions, split_paths

FORMAT_NAME = "fulmar-log"
_log = logging.getLogger("fulmar.analytics")


class FulmarLogDataSource(DataSource):
    """``spark.read.format("fulmar-log").load(ARCHIVE_DIR)``: see the module doc."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: Any) -> FulmarLogReader:
        return FulmarLogReader(dict(self.options))


def archive_dirs_of(options: dict[str, str]) -> list[str]:
    """The directories ``load()`` was given: ``path`` (one, or comma-separated) or ``paths`` (a JSON list)."""
    lowered = {key.lower(): value for key, value in options.items()}
    if lowered.get("paths"):
        return split_paths(json.loads(lowered["paths"]))
    return split_paths(lowered.get("path", ""))


class FulmarLogReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.archive_dirs = archive_dirs_of(options)
        self.options = ReadOptions.parse(options)

    def partitions(self) -> Sequence[InputPartition]:
        # One per segment file.  (With none, Spark reads one partition whose
        # value is None: an empty result.)
        return [InputPartition(segment) for segment in self.options.segments(self.archive_dirs)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        segment: LogSegment | None = partition.value
        if segment is None:
            return
        stats = DecodeStats()
        yield from self.options.record_batches(segment, stats)
        for problem in stats.problems:
            _log.warning("fulmar-log (PERMISSIVE): skipped corrupt data: %s", problem)


def register(spark: Any) -> None:
    """Make ``spark.read.format("fulmar-log")`` available in this session."""
    spark.dataSource.register(FulmarLogDataSource)
