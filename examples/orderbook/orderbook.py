"""A limit order book, replicated: orders match by price, then by time.

Prices are whole ticks (cents, say) and quantities whole units.  Order ids
come from a counter in the state, so every member gives each order the same
id, and a lower id is an earlier order.
"""

import bisect
from dataclasses import dataclass
from typing import Any

from fulmar import StateMachine, command


class UnknownOrder(Exception):
    pass


@dataclass
class Order:
    id: int
    trader: str
    side: str  # "buy" or "sell"
    price: int
    quantity: int  # what is left of it

    def key(self) -> tuple[int, int]:
        """Its place in its side's queue, best first: the highest bid, the lowest offer, then the earliest."""
        return (-self.price if self.side == "buy" else self.price, self.id)


class OrderBook(StateMachine):
    def __init__(self) -> None:
        self.next_id = 1
        self.orders: dict[int, Order] = {}  # the resting orders, by id
        self.queues: dict[str, list[tuple[int, int]]] = {"buy": [], "sell": []}  # their keys, sorted

    @command
    def place(self, trader: str, side: str, price: int, quantity: int) -> dict[str, Any]:
        """A limit order; its id, its fills (each at the resting order's price) and what rests of it."""
        if side not in self.queues:
            raise ValueError(f"side must be 'buy' or 'sell', not {side!r}")
        if not (isinstance(price, int) and price > 0 and isinstance(quantity, int) and quantity > 0):
            raise ValueError(f"price and quantity must be positive whole numbers, not {price!r} and {quantity!r}")
        order = Order(self.next_id, trader, side, price, quantity)
        self.next_id += 1
        fills = []
        makers = self.queues["sell" if side == "buy" else "buy"]
        while order.quantity and makers:
            maker = self.orders[makers[0][1]]  # the best resting order of the other side
            if not (maker.price <= price if side == "buy" else maker.price >= price):
                break  # beyond the limit, and so is every order behind it
            traded = min(order.quantity, maker.quantity)
            buy, sell = (order, maker) if side == "buy" else (maker, order)
            fills.append({"buy": buy.id, "sell": sell.id, "price": maker.price, "quantity": traded})
            order.quantity -= traded
            maker.quantity -= traded
            if maker.quantity == 0:
                del self.orders[maker.id]
                makers.pop(0)
        if order.quantity:
            self.orders[order.id] = order
            bisect.insort(self.queues[side], order.key())
        return {"id": order.id, "fills": fills, "resting": order.quantity}

    @command
    def cancel(self, order_id: int) -> int:
        """Take a resting order off the book; the quantity it still had."""
        order = self.orders.pop(order_id, None)
        if order is None:
            raise UnknownOrder(f"no resting order {order_id} (filled, cancelled, or never placed)")
        self.queues[order.side].remove(order.key())
        return order.quantity

    @command(read_only=True)
    def book(self, depth: int = 5) -> dict[str, list[list[int]]]:
        """The ``depth`` best price levels of each side, best first: [price, total quantity]."""
        levels: dict[str, list[list[int]]] = {"buy": [], "sell": []}
        for side, queue in self.queues.items():
            for _, order_id in queue:
                order = self.orders[order_id]
                if levels[side] and levels[side][-1][0] == order.price:
                    levels[side][-1][1] += order.quantity
                elif len(levels[side]) < depth:
                    levels[side].append([order.price, order.quantity])
                else:
                    break
        return levels
