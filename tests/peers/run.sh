#!/usr/bin/env bash
# Run the AMQP client libraries' own integration suites against one AMQP URL and print
# pass/fail per suite. See docs/testing.md ("Peer suites") and tests/peers/run_peers.py.
#   tests/peers/run.sh amqp://guest:guest@127.0.0.1:5672/%2F [--suites a,b] [--json FILE]
#   tests/peers/run.sh --compare rabbitmq.json proxy.json
set -euo pipefail
cd "$(dirname "$0")/../.."
exec "${PYTHON:-python3}" -m tests.peers.run_peers "$@"
