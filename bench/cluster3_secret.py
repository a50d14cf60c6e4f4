"""What authenticating the members costs (issue 48): the same 3-node cluster
as ``bench.cluster3`` (``cluster-node start --local 3``), started fresh
twice in this run, first without a secret, then with one
(``--consensus-authenticator-secret``): clients present it, every consensus
message a member sends carries the member trailer (signed and checked by the
agents and the native consensus threads alike), and every datagram of the log
between the members carries the drivers' MAC (``datagram-mac=true``).

On each: a warm-up, the one-at-a-time round trip (``bench.cluster.ping``:
p50 .. max) and the echo throughput of 32-byte messages with 1,000 in
flight.  Each row of the run with a secret has the same row of the run
without as its reference (ratio = with / without: above 1 costs in us,
below 1 costs in msgs/s).  Each member's consensus log is read afterwards:
the figures count only if the native consensus threads ran, signing (or
not) as the run says.
"""

from __future__ import annotations

import time
from typing import Any

from bench.cluster import ping, throughput
from bench.cluster3 import MEMBERS, LocalCluster
from bench.openloop import EchoSettings, ping_rows
from fulmar.aeron import Aeron

SECRET = "bench-cluster3-s3cret"
THROUGHPUT_SIZE = 32
THROUGHPUT_WINDOW = 1000


def _rows(label: str, secret: str | None, settings: EchoSettings) -> list[dict[str, Any]]:
    cluster = LocalCluster(secret=secret)
    try:
        assert cluster.client_driver is not None
        with Aeron.connect(cluster.client_driver_dir) as aeron:
            throughput(aeron, cluster, THROUGHPUT_SIZE, 64, 2_000)  # warm-up: imports, first terms, caches
            rows = ping_rows(f"cluster3 {label}", ping(aeron, cluster, settings.pings, settings.ping_max_s))
            tag = "secret" if secret else "plain"  # (file names of the histograms)
            rows[0]["histogram_id"] = f"ping-{tag}"
            rows[0]["histogram_system"] = f"cluster3-{tag}"
            count = settings.count
            seconds = throughput(aeron, cluster, THROUGHPUT_SIZE, THROUGHPUT_WINDOW, count)
            rows.append(
                {
                    "name": f"cluster3 {label} echo throughput {THROUGHPUT_SIZE} B window {THROUGHPUT_WINDOW}",
                    "value": count / seconds,
                    "unit": "msgs/s",
                    "reference": None,
                }
            )
        _check_armed(cluster, signed=secret is not None)
        return rows
    except Exception as error:
        raise RuntimeError(f"bench.cluster3_secret ({label}) failed: {error}\n{cluster.describe(30)}") from error
    finally:
        cluster.close()


def _check_armed(cluster: LocalCluster, signed: bool) -> None:
    """Each member's consensus log says which native threads were armed and
    whether they sign: the figures are theirs only if they ran so."""
    trailers = "member trailers signed and checked" if signed else "no member trailers"
    for member in range(MEMBERS):
        said = (cluster.base / f"node{member}" / "logs" / "consensus.log").read_text(errors="replace")
        armed = [line for line in said.splitlines() if " thread armed for term " in line]
        if not armed or not all(line.endswith(f"({trailers})") for line in armed):
            raise RuntimeError(f"node {member}: the native consensus threads did not run as expected: {armed}")


def run(quick: bool) -> list[dict[str, Any]]:
    settings = EchoSettings(quick, 2_000 if quick else 20_000)
    began = time.monotonic()
    plain = _rows("no secret", None, settings)
    secured = _rows("secret", SECRET, settings)
    for row, reference in zip(secured, plain, strict=True):
        row["reference"] = reference["value"]
        row["reference_kind"] = "no_secret"
    print(f"bench.cluster3_secret: two fresh 3-node clusters, {time.monotonic() - began:.0f} s", flush=True)
    return [*plain, *secured]


if __name__ == "__main__":
    import sys

    for row in run("--quick" in sys.argv):
        value = "n/a" if row["value"] is None else format(row["value"], ",.1f")
        print(f"{row['name']}: {value} {row['unit']} (without a secret: {row['reference']})")
