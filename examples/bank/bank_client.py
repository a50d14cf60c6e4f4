"""Calls the bank of a running cluster: ``python bank_client.py [ENDPOINTS]``.

ENDPOINTS is every member's ingress, as ``cluster-node start`` prints them;
by default those of ``--ingress-port 9010``.
"""

import sys

import fulmar


def main(endpoints: str) -> None:
    with fulmar.connect(endpoints) as client:  # finds the leader, and follows it through failovers
        print("alice has", client.call("deposit", "alice", 100))
        print("after sending bob 30, alice has", client.call("transfer", "alice", "bob", 30))
        try:
            client.call("transfer", "bob", "carol", 1000)
        except fulmar.CommandError as error:  # the service's exception, by name, and its message
            print(f"refused: {error.remote_type}: {error.remote_message}")
        print("balances:", client.call("balances"))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "0=127.0.0.1:9010,1=127.0.0.1:9011,2=127.0.0.1:9012")
