"""How many client connections one proxy holds: in all, and per client address.

A connection over a limit is not dropped silently: it is let through the handshake and
refused at `connection.open` with 530 NOT_ALLOWED and a reason, as RabbitMQ refuses
connections over its node, vhost and user limits. While it is being refused it still holds
a socket, so only a few refusals run at once (`REFUSING_AT_ONCE`); past that, new sockets
over a limit are closed at once without a byte sent, which is what a flood gets.

The client address is the real one when the PROXY protocol is on (the load balancer's
address otherwise, which is why per-address limits need the PROXY protocol behind a
load balancer).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, auto

REFUSING_AT_ONCE = 32


class Admission(Enum):
    ADMITTED = auto()
    REFUSE = auto()  # handshake, then 530 at connection.open
    DROP = auto()  # close the socket at once


@dataclass(slots=True)
class Ticket:
    """One accepted socket's place in the counts; give it back with `release` (once;
    later calls change nothing)."""

    address: str
    admission: Admission
    reason: str = ""
    released: bool = False


@dataclass
class ConnectionLimits:
    """`max_connections` / `max_per_address`: 0 means no limit."""

    max_connections: int = 0
    max_per_address: int = 0
    admitted: int = 0
    refusing: int = 0
    per_address: dict[str, int] = field(default_factory=dict)

    def admit(self, address: str) -> Ticket:
        held = self.per_address.get(address, 0)
        reason = ""
        if self.max_connections and self.admitted >= self.max_connections:
            reason = (
                f"connection refused: proxy connection limit ({self.max_connections}) is reached"
            )
        elif self.max_per_address and held >= self.max_per_address:
            reason = (
                f"connection refused: connection limit per client address "
                f"({self.max_per_address}) is reached for {address}"
            )
        if not reason:
            self.admitted += 1
            self.per_address[address] = held + 1
            return Ticket(address, Admission.ADMITTED)
        if self.refusing >= REFUSING_AT_ONCE:
            return Ticket(address, Admission.DROP, reason)
        self.refusing += 1
        return Ticket(address, Admission.REFUSE, reason)

    def release(self, ticket: Ticket) -> None:
        if ticket.released:
            return
        ticket.released = True
        if ticket.admission is Admission.REFUSE:
            self.refusing -= 1
        elif ticket.admission is Admission.ADMITTED:
            self.admitted -= 1
            left = self.per_address.get(ticket.address, 1) - 1
            if left > 0:
                self.per_address[ticket.address] = left
            else:
                self.per_address.pop(ticket.address, None)
