"""Structured Streaming job: the messages of one AMQP exchange or queue, appended to Parquet
as they arrive in Pulsar, with a checkpoint folder so a restart resumes where it stopped.

    python3 spark/amqp_stream.py --vhost / --exchange orders \\
        --output /data/orders --checkpoint /data/orders-checkpoint
    spark-submit --jars pulsar-spark-connector_2.12-3.1.1.4.jar spark/amqp_stream.py ...

Stops on SIGTERM or Ctrl-C (or after --run-seconds). Options and schema: spark/README.md.
"""

import sys

from starlight_py.spark.jobs import stream_main

if __name__ == "__main__":
    sys.exit(stream_main())
