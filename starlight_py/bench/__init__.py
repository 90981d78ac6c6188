"""Side-by-side benchmark: the proxy, RabbitMQ and Pulsar, on the same machine in one run.

``python -m starlight_py.bench --help``; see docs/performance.md for what it measures and
how. The package is a script, not a library: ``cli`` orchestrates (its options in
``options``), ``infra`` starts and stops the servers.

The default suite (``java_suite``) drives the servers with Java load generators: RabbitMQ
PerfTest (fetched once by ``perftest_install``, run and read by ``perftest``) against the
proxy and RabbitMQ, ``pulsar-perf`` (``pulsar_perf``) against Pulsar. Their per-interval
lines make the measured window (``window``), /proc gives each server's CPU over it
(``cpu``), ``targets`` judges the figures against the performance targets
(docs/performance.md) and ``java_report`` prints them.

``--clients python`` runs the older suite: ``runner`` runs one case with pika, aio-pika or
pulsar-client producer and consumer processes started from ``worker``, ``report`` turns the
results into its table; ``soak`` and ``churn`` use the same workers. Those clients come with
the ``test`` extra: ``pip install -e '.[test]'``.
"""


def main(argv: list[str] | None = None) -> int:
    """``python -m starlight_py.bench``; returns the exit code (see ``cli.main``)."""
    # Imported here so that `python -m starlight_py.bench.worker` loads only the worker.
    from starlight_py.bench.cli import main as cli_main  # noqa: PLC0415

    return cli_main(argv)


__all__ = ["main"]
