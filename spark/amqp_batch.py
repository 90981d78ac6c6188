"""Batch job: the messages of one AMQP exchange or queue, read from Pulsar, as Parquet.

    python3 spark/amqp_batch.py --vhost / --exchange orders --output /data/orders.parquet
    spark-submit --jars pulsar-spark-connector_2.12-3.1.1.4.jar spark/amqp_batch.py ...

Options, schema and cluster setup: spark/README.md.
"""

import sys

from starlight_py.spark.jobs import batch_main

if __name__ == "__main__":
    sys.exit(batch_main())
