"""Spark's automatic registration of fulmar's data source.

When a Spark session first needs a Python data source, its Python worker
imports every top-level module named ``pyspark_*`` and registers the
``DefaultSource`` it finds under that source's name.  This module is that
hook (the name is Spark's convention, not a fulmar component): with
``fulmar[spark]`` installed in the executors' Python,
``spark.read.format("fulmar-log")`` works in any session, with no
``register(spark)`` first.
"""

from fulmar.analytics.spark_source import FulmarLogDataSource as DefaultSource

__all__ = ["DefaultSource"]
