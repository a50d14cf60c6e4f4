"""Three holders and one lease, on a running cluster: ``python lease_client.py [ENDPOINTS]``.

ENDPOINTS is every member's ingress, as ``cluster-node start`` prints them;
by default those of ``--ingress-port 9010``.
"""

import sys
import time

import fulmar

TTL_MS = 1000


def main(endpoints: str) -> None:
    with fulmar.connect(endpoints) as client:
        lease = client.call("acquire", "printer", "alice", TTL_MS)
        print(f"alice holds printer (token {lease['token']})")
        lease = client.call("acquire", "printer", "bob", TTL_MS)
        print(f"bob asks for it too: it stays {lease['holder']}'s")
        client.call("renew", "printer", "alice", TTL_MS)
        client.call("release", "printer", "alice")
        lease = client.call("acquire", "printer", "bob", TTL_MS)
        print(f"alice released it; bob holds it (token {lease['token']}) and stops renewing it")
        # As if bob had crashed: the lease is free once the log's time passes its expiry.
        while (lease := client.call("acquire", "printer", "carol", TTL_MS))["holder"] != "carol":
            time.sleep(0.1)
        print(f"carol holds it (token {lease['token']}): bob's lease expired")
        try:
            client.call("renew", "printer", "bob", TTL_MS)
        except fulmar.CommandError as error:
            print(f"bob is too late: {error.remote_type}: {error.remote_message}")
        client.call("release", "printer", "carol")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "0=127.0.0.1:9010,1=127.0.0.1:9011,2=127.0.0.1:9012")
