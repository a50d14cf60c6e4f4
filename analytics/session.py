"""A SparkSession for fulmar's jobs, with ``fulmar-log`` registered.

Embedded ``local[*]`` by default; any master URL (``spark://host:7077``,
``yarn``...) when one machine is not enough; the executors then need fulmar
installed, as any PySpark data source does.  In local mode everything binds
to 127.0.0.1 and the web UI is off: a job started by a CLI or a test opens
no port that outlives it on another interface.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

DEFAULT_MASTER = "local[*]"
JVM_EXIT_TIMEOUT_S = 10
_scratch_dirs: dict[int, str] = {}  # id(session) -> its scratch directory


def spark_session(master: str = DEFAULT_MASTER, app_name: str = "fulmar", **config: str) -> Any:
    """A new (or the running) session for ``master``, quiet, with the data source registered."""
    from pyspark.sql import SparkSession

    from .spark_source import register

    # The executors' Python is this one (the one fulmar is installed in).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app_name)
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "8",
        # Decoded batches are Arrow already; keep them so end to end.
        "spark.sql.execution.arrow.pyspark.enabled": "true",
    }
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        settings.update(
            {
                "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1",
            }
        )
    # Spark's scratch files (block manager, artifacts, shuffle) go to a
    # directory of this session's, removed by stop_spark: left to itself the
    # JVM leaves spark-*, blockmgr-* and artifacts-* directories in /tmp.
    scratch = tempfile.mkdtemp(prefix="fulmar-spark-")
    settings["spark.local.dir"] = scratch
    java_options = [f"-Djava.io.tmpdir={scratch}"]
    log_config = Path(__file__).resolve().parent / "log4j2.properties"
    if log_config.exists():
        java_options.append(f"-Dlog4j2.configurationFile=file:{log_config}")
    settings["spark.driver.extraJavaOptions"] = " ".join(java_options)
    settings.update(config)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if spark.conf.get("spark.local.dir") != scratch:  # an existing session was returned
        shutil.rmtree(scratch, ignore_errors=True)
    else:
        _scratch_dirs[id(spark)] = scratch
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def stop_spark(spark: Any) -> None:
    """Stop the session and its JVM.

    ``spark.stop()`` leaves the py4j gateway's JVM running until this Python
    process exits; a test module or a long-lived program that starts Spark
    should not leave a JVM behind it, so the gateway is shut down and its
    process reaped (the next session starts a new one).
    """
    from pyspark import SparkContext

    scratch = _scratch_dirs.pop(id(spark), None)
    try:
        spark.stop()
        gateway = SparkContext._gateway
        if gateway is None:
            return
        process = getattr(gateway, "proc", None)
        try:
            gateway.shutdown()
        finally:
            if process is not None:
                # The JVM PySpark starts exits when its stdin closes, running
                # its shutdown hooks; it is killed if it does not.
                if process.stdin is not None:
                    process.stdin.close()
                try:
                    process.wait(JVM_EXIT_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            SparkContext._gateway = None
            SparkContext._jvm = None
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
