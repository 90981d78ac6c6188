"""/api/policies[/{vhost}[/{name}]]: list, show, set (PUT) and clear (DELETE) policies, in
RabbitMQ's JSON shape (model/policies.py; stored by metadata/policies.py, applied by every
proxy's topology cache). Setting and clearing need an administrator (RabbitMQ: the
`policymaker` tag)."""

from __future__ import annotations

from starlight_py.management.api import CREATED, NO_CONTENT, Answer, ApiCall
from starlight_py.management.errors import BadRequest, NotFoundError, ObjectNotFound
from starlight_py.management.shapes import listed
from starlight_py.management.vhost_access import (
    DEFAULT_VHOST,
    ensure_default_vhost,
    usable_vhost,
    visible_vhosts,
)
from starlight_py.metadata.policies import PolicyStore
from starlight_py.model.policies import PolicyInvalid, parse_policy


def _store(call: ApiCall) -> PolicyStore:
    services = call.context.services
    return PolicyStore(services.zookeeper, services.topology.paths)


def list_policies(call: ApiCall) -> Answer:
    vhosts = [r.name for r in visible_vhosts(call, call.params.get("vhost"))]
    items = [policy.to_json() for policy in _store(call).list(vhosts)]
    return Answer(200, listed(items, call.query))


def get_policy(call: ApiCall) -> Answer:
    record = usable_vhost(call, call.params["vhost"])
    policy = _store(call).get(record.name, call.params["name"])
    if policy is None:
        raise ObjectNotFound()
    return Answer(200, policy.to_json())


def put_policy(call: ApiCall) -> Answer:
    """201 when new, 204 when it replaced one; 400 with RabbitMQ's validation text."""
    call.user.require_administrator()
    vhost = call.params["vhost"]
    if vhost == DEFAULT_VHOST:
        ensure_default_vhost(call)
    record = call.context.services.topology.get_vhost(vhost)
    if record is None:
        raise NotFoundError("vhost_not_found")  # as RabbitMQ: not its usual 404 body
    call.user.require_vhost(vhost)
    try:
        policy = parse_policy(record.name, call.params["name"], call.body())
    except PolicyInvalid as e:
        # RabbitMQ's management plugin escapes its reasons' angle brackets (`<<"x">>`).
        raise BadRequest(str(e).replace("<", "&lt;").replace(">", "&gt;")) from e
    return CREATED if _store(call).set(policy) else NO_CONTENT


def delete_policy(call: ApiCall) -> Answer:
    call.user.require_administrator()
    record = usable_vhost(call, call.params["vhost"])
    if not _store(call).clear(record.name, call.params["name"]):
        raise ObjectNotFound()
    return NO_CONTENT
