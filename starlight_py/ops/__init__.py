"""What operators watch: Prometheus metrics and the health endpoints."""
