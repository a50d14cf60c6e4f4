"""``cluster-tool``: inspect and operate a node from outside, without joining it.

This is the one entry point; the commands live with the view they belong to,
as Aeron's tools are split:

- ``cli/aeron_stat.py``: the driver's view (AeronStat): ``counters``,
  ``errors``, ``driver``, ``loss``, read from the driver's cnc.dat;
- ``cli/cluster_commands.py``: the cluster's view (ClusterTool):
  ``cluster describe | list-members | snapshot | suspend | ...``, whose verbs
  are also at the top level (``cluster-tool describe --dir NODE``);
- ``cli/archive_tool.py``: the archive's view (ArchiveTool):
  ``archive describe | recordings | verify | errors``;
- ``cli/metrics_server.py``: ``metrics serve``, a node's metrics for
  Prometheus (``cli/node_metrics.py``) with ``/health`` and ``/leader``;
- ``cli/analytics_commands.py``: the Spark jobs ``analyze`` and ``replay``;
- ``cli/verify_log_commands.py``: ``verify-log``, every member's recorded log
  checked against the invariants of the Raft log.

Each module's docstring gives its exit codes.
"""

from __future__ import annotations

import click

from fulmar.cli import (
    aeron_stat,
    analytics_commands,
    archive_tool,
    cluster_commands,
    metrics_server,
    retention_commands,
    tool_common,
    verify_log_commands,
)


@click.group(
    context_settings={"help_option_names": ["-h", "--help"], "show_default": True}, epilog=tool_common.EXIT_CODES_HELP
)
def main() -> None:
    """Inspect a fulmar node through its media driver's cnc.dat.

    Works on a stopped node's leftover files too.  The archive commands
    (cluster-tool archive --help) read an archive directory the same way;
    the cluster commands (cluster-tool cluster --help) read a node's
    cluster directory and operate the cluster.  The cluster verbs also work
    at the top level (cluster-tool describe --dir NODE), and errors and
    counters given a node's or a local cluster's directory report on the
    cluster instead of a driver.
    """


for _command in (aeron_stat.counters, aeron_stat.errors, aeron_stat.driver, aeron_stat.loss):
    main.add_command(_command)
main.add_command(archive_tool.archive_group)
main.add_command(cluster_commands.cluster_group)
main.add_command(metrics_server.metrics_group)

# Aeron's ClusterTool verbs at the top level too (cluster-tool describe --dir NODE):
# the same commands as under ``cluster``; errors and counters tell a node's
# directory from a driver's.
for _name in (
    "describe",
    "pid",
    "list-members",
    "is-leader",
    "recording-log",
    "mark-file",
    "snapshot",
    "suspend",
    "resume",
    "shutdown",
    "abort",
    "standby-snapshot",
):
    main.add_command(cluster_commands.cluster_group.commands[_name], _name)

# Log retention: each member's log and snapshots before the newest it keeps.
cluster_commands.cluster_group.add_command(retention_commands.purge_log)
main.add_command(retention_commands.purge_log)

# Every member's recorded log against the Raft log's invariants.
cluster_commands.cluster_group.add_command(verify_log_commands.verify_log_command)
main.add_command(verify_log_commands.verify_log_command)

# The Spark jobs over archived logs (the spark extra; imported lazily inside).
main.add_command(analytics_commands.analyze)
main.add_command(analytics_commands.replay)


if __name__ == "__main__":
    main()
