"""The message core: the RabbitMQ semantics of a channel's messages, pure (no I/O, no
event loop, no Pulsar). See core/channel.py."""
