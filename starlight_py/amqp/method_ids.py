"""The (class id, method id) pairs by which AMQP errors name the method that failed
(`connection.close` and `channel.close` carry them), taken from pamqp's commands rather
than written as numbers."""

from __future__ import annotations

from pamqp import commands
from pamqp.base import Frame

MethodId = tuple[int, int]


def method_id(command: type[Frame]) -> MethodId:
    """(class id, method id) of a pamqp command class, e.g. commands.Basic.Get -> (60, 70)."""
    index: int = command.index
    return index >> 16, index & 0xFFFF


CONNECTION_START_OK = method_id(commands.Connection.StartOk)
CONNECTION_OPEN = method_id(commands.Connection.Open)
EXCHANGE_DECLARE = method_id(commands.Exchange.Declare)
EXCHANGE_DELETE = method_id(commands.Exchange.Delete)
EXCHANGE_BIND = method_id(commands.Exchange.Bind)
EXCHANGE_UNBIND = method_id(commands.Exchange.Unbind)
QUEUE_DECLARE = method_id(commands.Queue.Declare)
QUEUE_BIND = method_id(commands.Queue.Bind)
QUEUE_PURGE = method_id(commands.Queue.Purge)
QUEUE_DELETE = method_id(commands.Queue.Delete)
QUEUE_UNBIND = method_id(commands.Queue.Unbind)
BASIC_CONSUME = method_id(commands.Basic.Consume)
BASIC_PUBLISH = method_id(commands.Basic.Publish)
BASIC_GET = method_id(commands.Basic.Get)
BASIC_ACK = method_id(commands.Basic.Ack)
BASIC_REJECT = method_id(commands.Basic.Reject)
BASIC_RECOVER = method_id(commands.Basic.Recover)
BASIC_NACK = method_id(commands.Basic.Nack)
CONFIRM_SELECT = method_id(commands.Confirm.Select)
TX_SELECT = method_id(commands.Tx.Select)
TX_COMMIT = method_id(commands.Tx.Commit)
TX_ROLLBACK = method_id(commands.Tx.Rollback)
