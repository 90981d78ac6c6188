"""Delivering from Pulsar: each AMQP consumer's Pulsar consumers and what they read
(streams, priority bands, single active consumers), basic.get, requeues and the
redelivered flag, and the counts of unacked deliveries published for every proxy."""
