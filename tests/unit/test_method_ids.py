"""The method ids AMQP errors carry (amqp/method_ids.py) are the spec's numbers."""

from __future__ import annotations

from pamqp import commands

from starlight_py.amqp import method_ids
from starlight_py.amqp.framing import method_ids as ids_of

SPEC = {
    "CONNECTION_START_OK": (10, 11),
    "CONNECTION_OPEN": (10, 40),
    "EXCHANGE_DECLARE": (40, 10),
    "EXCHANGE_DELETE": (40, 20),
    "EXCHANGE_BIND": (40, 30),
    "EXCHANGE_UNBIND": (40, 40),
    "QUEUE_DECLARE": (50, 10),
    "QUEUE_BIND": (50, 20),
    "QUEUE_PURGE": (50, 30),
    "QUEUE_DELETE": (50, 40),
    "QUEUE_UNBIND": (50, 50),
    "BASIC_CONSUME": (60, 20),
    "BASIC_PUBLISH": (60, 40),
    "BASIC_GET": (60, 70),
    "BASIC_ACK": (60, 80),
    "BASIC_REJECT": (60, 90),
    "BASIC_RECOVER": (60, 110),
    "BASIC_NACK": (60, 120),
    "CONFIRM_SELECT": (85, 10),
    "TX_SELECT": (90, 10),
    "TX_COMMIT": (90, 20),
    "TX_ROLLBACK": (90, 30),
}


def test_every_constant_is_the_spec_number() -> None:
    defined = {name: getattr(method_ids, name) for name in dir(method_ids) if name.isupper()}
    assert defined == SPEC


def test_a_method_instance_has_its_class_ids() -> None:
    assert ids_of(commands.Basic.Get(queue="q")) == (60, 70)
    assert ids_of(commands.Queue.Declare(queue="q")) == (50, 10)
