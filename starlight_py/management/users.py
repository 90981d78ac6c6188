"""/api/users: the password users in ZooKeeper (model/users.py), in RabbitMQ 3.10's shapes.

Principals that are not stored users (a token's subject, a certificate's name) but have
permissions, or are managementAdministrators, are listed too, with an empty hash and
algorithm, so the list shows everyone permissions were set for, as RabbitMQ's does.
"""

from __future__ import annotations

from typing import Any

from starlight_py.management.api import CREATED, NO_CONTENT, Answer, ApiCall
from starlight_py.management.errors import BadRequest, ObjectNotFound
from starlight_py.management.shapes import listed
from starlight_py.metadata.permissions import PermissionStore
from starlight_py.metadata.users import NoSuchUser, UserStore, delete_user
from starlight_py.model.users import ADMINISTRATOR_TAG, SHA256, InvalidUser, User, parse_tags


def _store(call: ApiCall) -> UserStore:
    services = call.context.services
    return UserStore(services.zookeeper, services.topology.paths)


def _users(call: ApiCall) -> list[dict[str, Any]]:
    call.user.require_administrator()
    services = call.context.services
    stored = {user.name: user.to_json() for user in _store(call).list()}
    principals = {
        principal
        for _, principal, _ in PermissionStore(services.zookeeper, services.topology.paths).list()
    }
    administrators = set(services.config.management_administrators)
    for name in (principals | administrators) - stored.keys():
        stored[name] = {
            "name": name,
            "password_hash": "",
            "hashing_algorithm": "",
            "tags": [ADMINISTRATOR_TAG] if name in administrators else [],
            "limits": {},
        }
    return [stored[name] for name in sorted(stored)]


def list_users(call: ApiCall) -> Answer:
    return Answer(200, listed(_users(call), call.query))


def get_user(call: ApiCall) -> Answer:
    for user in _users(call):
        if user["name"] == call.params["user"]:
            return Answer(200, user)
    raise ObjectNotFound()


def user_from_body(name: str, body: dict[str, Any]) -> User:
    """RabbitMQ's PUT /api/users/{name}: `tags` required; `password` or `password_hash`
    (with `hashing_algorithm`), or neither (the user then has no password). Raises
    BadRequest with RabbitMQ's reasons."""
    if "tags" not in body:
        raise BadRequest("tags_not_present")
    if "password" in body and "password_hash" in body:
        raise BadRequest("both_password_and_password_hash_are_provided")
    try:
        tags = parse_tags(body["tags"])
        password = body.get("password")
        if password is not None:
            if not isinstance(password, str):
                raise InvalidUser("password must be a string")
            return User.with_password(name, password, tags)
        password_hash = body.get("password_hash", "")
        algorithm = body.get("hashing_algorithm") or SHA256
        if not isinstance(password_hash, str) or not isinstance(algorithm, str):
            raise InvalidUser("password_hash and hashing_algorithm must be strings")
        return User(name, password_hash, algorithm, tags)
    except InvalidUser as e:
        raise BadRequest(str(e)) from e


def put_user(call: ApiCall) -> Answer:
    call.user.require_administrator()
    user = user_from_body(call.params["user"], call.body())
    return CREATED if _store(call).put(user) else NO_CONTENT


def remove_user(call: ApiCall) -> Answer:
    """As RabbitMQ: the user's permissions go with it."""
    call.user.require_administrator()
    services = call.context.services
    permissions = PermissionStore(services.zookeeper, services.topology.paths)
    try:
        delete_user(_store(call), permissions, call.params["user"])
    except NoSuchUser:
        raise ObjectNotFound() from None
    return NO_CONTENT
