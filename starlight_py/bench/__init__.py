"""Side-by-side benchmark: the proxy, RabbitMQ and a direct pulsar-client baseline.

``python -m starlight_py.bench --help``; see docs/performance.md for what it measures and
how. The package is a script, not a library: ``cli`` orchestrates, ``infra`` starts and
stops the servers, ``runner`` runs one case with producer and consumer processes started
from ``worker``, ``report`` turns the results into the table.

The clients (pika, aio-pika) come with the ``test`` extra: ``pip install -e '.[test]'``.
"""


def main(argv: list[str] | None = None) -> int:
    """``python -m starlight_py.bench``; returns the exit code (see ``cli.main``)."""
    # Imported here so that `python -m starlight_py.bench.worker` loads only the worker.
    from starlight_py.bench.cli import main as cli_main  # noqa: PLC0415

    return cli_main(argv)


__all__ = ["main"]
