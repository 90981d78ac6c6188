"""basic.publish from admission to Pulsar: routing with the watched cache, where each copy
is written (exchange, binding and band topics), producers, pre-acknowledgements, length
limits and the first-use default-exchange binding."""
