"""Crossing orders on the order book of a running cluster: ``python orderbook_client.py [ENDPOINTS]``.

ENDPOINTS is every member's ingress, as ``cluster-node start`` prints them;
by default those of ``--ingress-port 9010``.
"""

import sys

import fulmar

ORDERS = [  # trader, side, price (cents), quantity
    ("alice", "sell", 101, 5),
    ("alice", "sell", 102, 5),
    ("dave", "sell", 101, 3),  # behind alice's 101: hers came first
    ("bob", "buy", 102, 10),  # crosses: 5 from alice at 101, 3 from dave at 101, 2 from alice at 102
    ("carol", "buy", 100, 4),  # crosses nothing: it rests on the book
]


def main(endpoints: str) -> None:
    with fulmar.connect(endpoints) as client:
        traders = {}  # order id -> trader (an order left by an earlier run is known by its id)
        for trader, side, price, quantity in ORDERS:
            order = client.call("place", trader, side, price, quantity)
            traders[order["id"]] = trader
            print(f"order {order['id']}: {trader} {side}s {quantity} at {price}, {order['resting']} left on the book")
            for fill in order["fills"]:
                buyer, seller = (traders.get(fill[s], f"order {fill[s]}") for s in ("buy", "sell"))
                print(f"  trade: {buyer} buys {fill['quantity']} at {fill['price']} from {seller}")
        print("book:", client.call("book"))
        print("carol cancels; it had", client.call("cancel", order["id"]), "left")
        print("book:", client.call("book"))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "0=127.0.0.1:9010,1=127.0.0.1:9011,2=127.0.0.1:9012")
