"""starlight-py: an AMQP 0-9-1 proxy that stores every message in Apache Pulsar."""

__version__ = "0.1.0"
