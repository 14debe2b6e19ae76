"""An order-status desk: look orders up, cancel unshipped ones, show a card in the page.

    live serve --agent samples.orders:agent              # Gemini (needs GOOGLE_API_KEY)

`lookup_order` and `cancel_order` run on the server. `show_order_card` is a
client tool: the server sends it to the client as `tool.call` (runs_on
"client"), and the browser demo answers it by drawing the order on the page.
"""

from __future__ import annotations

import dataclasses
import threading

from google.genai import types

from live import Agent

MODEL = "gemini-3.1-flash-live-preview"


@dataclasses.dataclass
class Order:
    order_id: str
    item: str
    status: str  # "processing", "shipped", "delivered", "cancelled"
    eta: str | None = None
    carrier: str | None = None


class OrderBook:
    """A small in-memory order store, safe to use from tool threads."""

    def __init__(self, orders: list[Order]) -> None:
        self._orders = {o.order_id: o for o in orders}
        self._lock = threading.Lock()

    def get(self, order_id: str) -> Order | None:
        with self._lock:
            order = self._orders.get(order_id.strip().upper())
            return dataclasses.replace(order) if order else None

    def cancel(self, order_id: str) -> Order | None:
        with self._lock:
            order = self._orders.get(order_id.strip().upper())
            if order is not None and order.status == "processing":
                order.status = "cancelled"
            return dataclasses.replace(order) if order else None


BOOK = OrderBook(
    [
        Order("A1001", "espresso machine", "shipped", eta="Thursday", carrier="DHL"),
        Order("A1002", "noise-cancelling headphones", "processing", eta="next Monday"),
        Order("A1003", "hiking boots", "delivered"),
        Order("A1004", "desk lamp", "processing", eta="Friday"),
    ]
)


def lookup_order(order_id: str) -> dict:
    """Status of an order by its id (like A1001): item, status, delivery estimate, carrier."""
    order = BOOK.get(order_id)
    if order is None:
        return {"error": f"no order with id {order_id!r}; ids look like A1001"}
    return dataclasses.asdict(order)


def cancel_order(order_id: str) -> dict:
    """Cancel an order that has not shipped yet. Shipped or delivered orders cannot be cancelled."""
    order = BOOK.get(order_id)
    if order is None:
        return {"error": f"no order with id {order_id!r}"}
    if order.status != "processing":
        return {"cancelled": False, "reason": f"order {order.order_id} is already {order.status}"}
    BOOK.cancel(order_id)
    return {"cancelled": True, "order_id": order.order_id, "item": order.item}


show_order_card = types.FunctionDeclaration(
    name="show_order_card",
    description="Show the customer a card with an order's details on their screen.",
    parameters=types.Schema(
        type=types.Type.OBJECT,
        properties={
            "order_id": types.Schema(type=types.Type.STRING),
            "item": types.Schema(type=types.Type.STRING),
            "status": types.Schema(type=types.Type.STRING),
        },
        required=["order_id", "status"],
    ),
)

agent = Agent(
    name="orders",
    model=MODEL,
    instruction=(
        "You are the order-status desk of a small shop. Ask for the order id if you do not "
        "have it. Use lookup_order to answer, cancel_order only after the customer confirms, "
        "and show_order_card to put the order on their screen. Be brief and friendly."
    ),
    tools=[lookup_order, cancel_order],
    client_tools=[show_order_card],
)
