"""Spark jobs over the Pulsar topics behind AMQP exchanges and queues (docs/spark.md).

- :mod:`.connector`: the pulsar-spark connector jar, fetched once from Maven Central.
- :mod:`.topics`: which Pulsar topics hold an exchange's or a queue's messages, resolved with
  the proxy's own naming and metadata code.
- :mod:`.rows`: one Pulsar message -> one row of AMQP columns (pure Python, runs on executors).
- :mod:`.frames`: the Spark side: sessions, readers, the DataFrame schema.
- :mod:`.jobs`: the batch and streaming jobs' command lines (`spark/*.py` call them).

pyspark is an optional dependency (`pip install 'starlight-py[spark]'`); nothing else in
the package imports this one.
"""
