"""The one failure every authentication path raises."""

from __future__ import annotations


class AuthenticationFailed(Exception):
    """The credentials were refused; the message is for logs, never for the client, and
    never contains the secret that was refused."""


class LoopbackOnly(AuthenticationFailed):
    """The right password of a user that may log in only from a loopback address
    (loopbackUsers), from elsewhere."""
