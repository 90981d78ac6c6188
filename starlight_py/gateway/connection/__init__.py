"""One client connection's I/O shell and what it stands on: the socket and its tasks, TLS,
the PROXY protocol, heartbeats and timeouts, limits, login and permissions, the vhost,
and the report of connections the management API lists."""
