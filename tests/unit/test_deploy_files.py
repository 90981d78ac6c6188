"""deploy/: the Dockerfile, the compose cluster and the Kubernetes manifests.

No container engine runs here, so these files are checked by reading them: every command
they run is parsed by the real `starlight-proxy` / `starlight-admin` argument parsers, every
configuration they carry is loaded by the real config loader (unknown keys and bad values
fail), every port agrees between the configuration, the Dockerfile, the Services, the probes
and HAProxy, and every file they name exists in the repository or is mounted by them.
The last section checks that these checkers reject what they should.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import io
import json
import re
import shlex
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from starlight_py import cli as proxy_cli
from starlight_py.admin import cli as admin_cli
from starlight_py.amqp.framing import PROTOCOL_HEADER
from starlight_py.auth.authenticator import build_authenticator
from starlight_py.config import (
    CONFIG_KEYS,
    ConfigError,
    StarlightConfig,
    env_var_for,
    load_config,
)
from starlight_py.gateway.connection.tls import TlsSettings, TlsSetupError, build_server_context
from starlight_py.local.distribution import PULSAR_VERSION
from starlight_py.local.haproxy import haproxy_config
from starlight_py.units import SECONDS

ROOT = Path(__file__).resolve().parents[2]
# What follows the drain on SIGTERM (docs/operations.md, "Shutdown and upgrades"): up to
# 10 s to settle publisher confirms, then close-ok waits and closing the Pulsar client and
# the ZooKeeper session. A process manager must wait this much longer than the drain.
AFTER_DRAIN = 25 * SECONDS
DEPLOY = ROOT / "deploy"
DOCKER = DEPLOY / "docker"
COMPOSE = DEPLOY / "compose"
KUBERNETES = DEPLOY / "kubernetes"
DOCKERFILE = DOCKER / "Dockerfile"


# ---- checkers -------------------------------------------------------------------------------


class Rejected(Exception):
    """A command line, configuration, port or path the project would not accept."""


def parse_proxy_argv(argv: list[str]) -> argparse.Namespace:
    """`starlight-proxy ARGV` through the real parser; raises Rejected."""
    return _parse(proxy_cli.build_parser(), argv)


def parse_admin_argv(argv: list[str]) -> argparse.Namespace:
    """`starlight-admin ARGV` through the real parser; raises Rejected."""
    return _parse(admin_cli.build_parser(), argv)


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
            return parser.parse_args(argv)
    except SystemExit as e:  # argparse's own error(): usage on stderr, exit 2
        raise Rejected(f"{parser.prog} {argv}: {errors.getvalue().strip()}") from e
    except Exception as e:  # the admin parser raises instead of exiting
        raise Rejected(f"{parser.prog} {argv}: {e}") from e


def load_conf_text(text: str, tmp_path: Path) -> StarlightConfig:
    """A conf file's text through the real loader, with no environment; raises Rejected."""
    path = tmp_path / "checked.conf"
    path.write_text(text, encoding="utf-8")
    try:
        return load_config(path, {}, {})
    except ConfigError as e:
        raise Rejected(str(e)) from e


def conf_keys(text: str) -> dict[str, str]:
    """The key=value pairs of a conf file (for what the config object does not echo)."""
    pairs = {}
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith(("#", "!")):
            key, _, value = stripped.partition("=")
            pairs[key.strip()] = value.strip()
    return pairs


def metrics_port(config: StarlightConfig) -> int:
    port = urlsplit(config.metrics_listener).port
    assert port is not None, "metricsListener must be set: the health checks need it"
    return port


def listener_ports(config: StarlightConfig) -> dict[str, int]:
    return {listener.scheme: listener.port for listener in config.listeners}


def files_named_by(config: StarlightConfig) -> list[str]:
    """Absolute paths of the files the proxy will open (TLS files, file: token keys)."""
    paths = [
        config.tls_certificate_file,
        config.tls_key_file,
        config.tls_trust_certs_file,
    ]
    for key_spec in (config.token_secret_key, config.token_public_key):
        if key_spec.startswith("file:"):
            paths.append(urlsplit(key_spec).path)
    return [path for path in paths if path]


def read_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


# ---- the Dockerfile ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str

    def exec_form(self) -> list[str]:
        value = json.loads(self.arguments)
        assert isinstance(value, list), f"{self.keyword} must use the JSON (exec) form"
        return [str(item) for item in value]


def dockerfile_instructions(text: str) -> list[Instruction]:
    """Instructions with their line continuations joined and comments dropped."""
    instructions: list[Instruction] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = (pending + stripped).strip()
        pending = ""
        keyword, _, arguments = full.partition(" ")
        instructions.append(Instruction(keyword.upper(), arguments.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return instructions


def of_kind(instructions: list[Instruction], keyword: str) -> list[Instruction]:
    return [i for i in instructions if i.keyword == keyword]


def final_stage(instructions: list[Instruction]) -> list[Instruction]:
    starts = [n for n, i in enumerate(instructions) if i.keyword == "FROM"]
    return instructions[starts[-1] :]


def copy_sources(instruction: Instruction) -> tuple[list[str], str]:
    words = [w for w in shlex.split(instruction.arguments) if not w.startswith("--")]
    return words[:-1], words[-1]


def ignored_by(patterns: list[str], path: str) -> bool:
    """Docker's .dockerignore rule for one path: the last matching pattern wins, `!`
    re-includes, and a pattern that matches a folder matches everything under it."""
    ignored = False
    parts = PurePosixPath(path).parts
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    for raw in patterns:
        negated = raw.startswith("!")
        pattern = raw[1:] if negated else raw
        pattern = pattern.rstrip("/")
        if any(fnmatch.fnmatchcase(prefix, pattern) for prefix in prefixes):
            ignored = not negated
    return ignored


def dockerignore_patterns() -> list[str]:
    text = (DOCKER / "Dockerfile.dockerignore").read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


@pytest.fixture(scope="module")
def dockerfile() -> list[Instruction]:
    return dockerfile_instructions(DOCKERFILE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def image_config_path(dockerfile: list[Instruction]) -> str:
    argv = of_kind(dockerfile, "CMD")[-1].exec_form()
    return str(parse_proxy_argv(argv).config)


@pytest.fixture
def image_config(dockerfile: list[Instruction], image_config_path: str, tmp_path: Path) -> Any:
    """The configuration file baked into the image (the COPY that lands on --config)."""
    for instruction in of_kind(final_stage(dockerfile), "COPY"):
        sources, destination = copy_sources(instruction)
        if destination == image_config_path and "--from" not in instruction.arguments:
            (source,) = sources
            return load_conf_text((ROOT / source).read_text(encoding="utf-8"), tmp_path)
    raise AssertionError(f"nothing in the image is copied to {image_config_path}")


def test_dockerfile_builds_from_python_311_slim(dockerfile: list[Instruction]) -> None:
    images = [i.arguments.split()[0] for i in of_kind(dockerfile, "FROM")]
    assert images and all(image == "python:3.11-slim" for image in images)


def test_dockerfile_installs_the_project_with_pip(dockerfile: list[Instruction]) -> None:
    runs = " ".join(i.arguments for i in of_kind(dockerfile, "RUN"))
    assert re.search(r"pip install (\S+ )*\.(\s|$)", runs), runs


def test_dockerfile_builds_the_compiled_frame_codec_and_jemalloc(
    dockerfile: list[Instruction],
) -> None:
    """The image has the Rust sources and cargo, and its build fails without what they
    build: the frame codec and the jemalloc the proxy preloads."""
    copied = {
        source
        for i in of_kind(dockerfile, "COPY")
        if "--from=" not in i.arguments
        for source in copy_sources(i)[0]
    }
    formatting = {"native/rustfmt.toml", "native/jemalloc/rustfmt.toml"}
    assert set(tracked_files("native")) - formatting <= {
        f for source in copied for f in tracked_files(source)
    }
    runs = " ".join(i.arguments for i in of_kind(dockerfile, "RUN"))
    assert "sh.rustup.rs" in runs
    assert "from starlight_py.amqp import _native" in runs
    assert "a.built_library()" in runs
    assert re.search(r"apt-get install [^&]*\bmake\b", runs), runs  # jemalloc's build
    assert re.search(r"apt-get install [^&]*\bg\+\+", runs), runs  # acknowledge_list.cpp


def tracked_files(source: str) -> list[str]:
    """The files git keeps at or under `source` (what a clean checkout's build context has)."""
    listed = subprocess.run(
        ["git", "ls-files", "--", source], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return listed.stdout.split()


def test_dockerfile_copies_only_files_that_exist_and_are_not_ignored(
    dockerfile: list[Instruction],
) -> None:
    patterns = dockerignore_patterns()
    for instruction in of_kind(dockerfile, "COPY"):
        if "--from=" in instruction.arguments:
            continue
        sources, _ = copy_sources(instruction)
        for source in sources:
            path = ROOT / source
            assert path.exists(), f"COPY {source}: not in the repository"
            files = tracked_files(source)
            assert files, f"COPY {source}: nothing to copy"
            for relative in files:
                assert not ignored_by(patterns, relative), f"{relative} is dockerignored"


def test_dockerfile_runs_starlight_proxy_serve_as_a_non_root_user(
    dockerfile: list[Instruction],
) -> None:
    final = final_stage(dockerfile)
    entrypoint = of_kind(final, "ENTRYPOINT")[-1].exec_form()
    command = of_kind(final, "CMD")[-1].exec_form()
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "scripts"
    ]
    assert entrypoint == ["starlight-proxy"]
    assert scripts["starlight-proxy"] == "starlight_py.cli:main"
    assert parse_proxy_argv(command).command == "serve"

    user = of_kind(final, "USER")[-1].arguments
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "numeric, so Kubernetes can check runAsNonRoot"
    created = " ".join(i.arguments for i in of_kind(final, "RUN"))
    assert f"--uid {uid}" in created


def test_dockerfile_exposes_the_ports_of_the_configuration(
    dockerfile: list[Instruction], image_config: StarlightConfig, k8s_config: StarlightConfig
) -> None:
    exposed = {int(port) for i in of_kind(dockerfile, "EXPOSE") for port in i.arguments.split()}
    assert set(listener_ports(image_config).values()) | {metrics_port(image_config)} <= exposed
    # ...and the TLS port the Kubernetes configuration adds; nothing else.
    assert exposed == set(listener_ports(k8s_config).values()) | {metrics_port(k8s_config)}


def test_dockerfile_healthcheck_asks_healthz_on_the_metrics_port(
    dockerfile: list[Instruction], image_config: StarlightConfig
) -> None:
    (healthcheck,) = of_kind(dockerfile, "HEALTHCHECK")
    command = json.loads(healthcheck.arguments.split("CMD", 1)[1])
    assert command[:2] == ["python", "-c"]
    compile(command[2], "HEALTHCHECK", "exec")  # the Python it runs is valid
    (url,) = re.findall(r"http://[^'\"]+", command[2])
    assert urlsplit(url).path == "/healthz"
    assert urlsplit(url).port == metrics_port(image_config)


# ---- compose ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document = read_yaml(COMPOSE / "compose.yaml")
    assert isinstance(document, dict)
    return document


def proxy_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        name: service
        for name, service in compose["services"].items()
        if service.get("build", {}).get("dockerfile") == "deploy/docker/Dockerfile"
    }


def bind_mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> host path of a compose service's bind mounts."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            mounts[target] = (COMPOSE / source).resolve()
    return mounts


@pytest.fixture
def compose_config(compose: dict[str, Any], tmp_path: Path) -> StarlightConfig:
    configs = set()
    for service in proxy_services(compose).values():
        config_path = str(parse_proxy_argv(service["command"]).config)
        configs.add(bind_mounts(service)[config_path])
    (path,) = configs  # the three proxies share one file
    return load_conf_text(path.read_text(encoding="utf-8"), tmp_path)


def haproxy_lines() -> list[str]:
    text = (COMPOSE / "haproxy.cfg").read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip()[:1] not in ("", "#")]


def test_compose_runs_zookeeper_pulsar_three_proxies_and_haproxy(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    assert len(proxy_services(compose)) == 3
    assert services["pulsar"]["image"] == f"apachepulsar/pulsar:{PULSAR_VERSION}"
    assert "bin/pulsar standalone" in services["pulsar"]["command"]
    assert services["zookeeper"]["image"].startswith("zookeeper:")
    assert services["haproxy"]["image"].startswith("haproxy:")
    for name, service in services.items():
        for dependency in service.get("depends_on", []):
            assert dependency in services, f"{name} depends on unknown {dependency}"


def test_compose_builds_the_dockerfile_and_mounts_files_that_exist(
    compose: dict[str, Any],
) -> None:
    for name, service in proxy_services(compose).items():
        context = (COMPOSE / service["build"]["context"]).resolve()
        assert context == ROOT, f"{name}: the build context must be the repository root"
        assert (context / service["build"]["dockerfile"]).is_file()
    for name, service in compose["services"].items():
        for target, source in bind_mounts(service).items():
            assert source.is_file(), f"{name}: {source} (mounted at {target}) does not exist"


def test_compose_proxy_commands_and_configuration_are_valid(
    compose: dict[str, Any], compose_config: StarlightConfig
) -> None:
    for service in proxy_services(compose).values():
        assert parse_proxy_argv(service["command"]).command == "serve"
    services = compose["services"]
    zookeeper_host = compose_config.zookeeper_servers.split(",")[0].split(":")[0]
    assert zookeeper_host in services
    for url in (compose_config.pulsar_service_url, compose_config.pulsar_web_url):
        assert urlsplit(url).hostname == "pulsar"
    assert "-a pulsar" in services["pulsar"]["command"], "Pulsar must advertise that name"


def test_compose_metrics_ports_and_stop_grace_period(
    compose: dict[str, Any], compose_config: StarlightConfig
) -> None:
    port = metrics_port(compose_config)
    for name, service in proxy_services(compose).items():
        published = [str(p).rsplit(":", 1)[-1] for p in service.get("ports", [])]
        assert published == [str(port)], f"{name} publishes {published}, metrics on {port}"
        grace = service["stop_grace_period"]
        assert grace.endswith("s")
        assert int(grace[:-1]) * SECONDS >= compose_config.shutdown_drain + AFTER_DRAIN


def test_haproxy_sends_clients_to_every_proxy_on_its_amqp_port(
    compose: dict[str, Any], compose_config: StarlightConfig
) -> None:
    servers = {}
    for line in haproxy_lines():
        words = line.split()
        if words[0] == "server":
            host, port = words[2].rsplit(":", 1)
            servers[host] = (int(port), words[3:])
    assert set(servers) == set(proxy_services(compose))
    amqp_port = listener_ports(compose_config)["amqp"]
    for host, (port, options) in servers.items():
        assert port == amqp_port, f"{host}: HAProxy uses {port}, the proxy listens on {amqp_port}"
        assert "check" in options
        # PROXY protocol on both sides or on neither.
        assert ("send-proxy-v2" in options) == compose_config.proxy_protocol
        assert ("check-send-proxy" in options) == compose_config.proxy_protocol

    binds = [line.split()[1] for line in haproxy_lines() if line.startswith("bind ")]
    published = {str(p).split(":")[-1] for p in compose["services"]["haproxy"]["ports"]}
    assert {bind.rsplit(":", 1)[1] for bind in binds} <= published


def test_haproxy_checks_proxies_like_the_local_cluster(
    compose_config: StarlightConfig,
) -> None:
    local = haproxy_config(
        5672, [5672], Path("s.sock"), send_proxy=compose_config.proxy_protocol
    ).splitlines()
    local_checks = [line.strip() for line in local if line.strip().startswith("tcp-check")]
    ours = [line for line in haproxy_lines() if line.startswith(("tcp-check", "option tcp-check"))]
    assert ours == ["option tcp-check", *local_checks]
    assert f"tcp-check send-binary {PROTOCOL_HEADER.hex()}" in ours


def test_haproxy_accepts_the_configuration(tmp_path: Path) -> None:
    haproxy = shutil.which("haproxy") or shutil.which("/usr/sbin/haproxy")
    if haproxy is None:
        pytest.skip("haproxy is not installed; the other tests read the file")
    result = subprocess.run(
        [haproxy, "-c", "-f", str(COMPOSE / "haproxy.cfg")],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    # Warnings are expected: the proxies' names resolve only inside compose's network.
    assert result.returncode == 0, result.stdout + result.stderr


# ---- Kubernetes -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def k8s() -> dict[tuple[str, str], dict[str, Any]]:
    """Every object of deploy/kubernetes by (kind, name)."""
    objects = {}
    for path in sorted(KUBERNETES.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if document is None:
                continue
            name = document.get("metadata", {}).get("name", path.name)
            objects[(document["kind"], name)] = document
    return objects


def one(k8s: dict[tuple[str, str], dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [obj for (k, _), obj in k8s.items() if k == kind]
    return found


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def proxy_container(k8s: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    (container,) = pod_spec(one(k8s, "Deployment"))["containers"]
    return container


def container_argv(container: dict[str, Any], entrypoint: list[str]) -> list[str]:
    """What a container runs: `command` replaces the image's ENTRYPOINT, `args` its CMD."""
    return [*container.get("command", entrypoint), *container.get("args", [])]


def volume_file(
    k8s: dict[tuple[str, str], dict[str, Any]],
    pod: dict[str, Any],
    container: dict[str, Any],
    path: str,
) -> tuple[str, str]:
    """(kind, name) of the ConfigMap or Secret that provides the file `path` inside the
    container, through its volume mounts; raises Rejected when nothing provides it."""
    volumes = {volume["name"]: volume for volume in pod.get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        mount_path = mount["mountPath"].rstrip("/")
        volume = volumes[mount["name"]]
        if "subPath" in mount:
            if path != mount_path:
                continue
            key = mount["subPath"]
        elif path.startswith(mount_path + "/"):
            key = path[len(mount_path) + 1 :]
        else:
            continue
        if "configMap" in volume:
            kind, name = "ConfigMap", volume["configMap"]["name"]
        elif "secret" in volume:
            kind, name = "Secret", volume["secret"]["secretName"]
        else:
            raise Rejected(f"{path} is on a {sorted(volume)} volume, not a ConfigMap or Secret")
        source = k8s.get((kind, name))
        if source is None:
            raise Rejected(f"{path}: {kind} {name} is not in deploy/kubernetes")
        keys = {**source.get("data", {}), **source.get("stringData", {})}
        if key not in keys:
            raise Rejected(f"{path}: {kind} {name} has no key {key!r}")
        return kind, name
    raise Rejected(f"{path} is not mounted in container {container['name']}")


def named_port(container: dict[str, Any], port: int | str) -> int:
    """A probe's or Service's port (a name or a number) as the container's port number."""
    for declared in container.get("ports", []):
        if port in (declared["containerPort"], declared.get("name")):
            return int(declared["containerPort"])
    raise Rejected(f"container {container['name']} declares no port {port!r}")


@pytest.fixture
def k8s_config(k8s: dict[tuple[str, str], dict[str, Any]], tmp_path: Path) -> StarlightConfig:
    container = proxy_container(k8s)
    argv = container_argv(container, ["starlight-proxy"])[1:]
    config_path = str(parse_proxy_argv(argv).config)
    kind, name = volume_file(k8s, pod_spec(one(k8s, "Deployment")), container, config_path)
    text = k8s[(kind, name)]["data"]["starlight.conf"]
    return load_conf_text(text, tmp_path)


def test_kustomization_lists_files_that_exist(k8s: dict[tuple[str, str], dict[str, Any]]) -> None:
    kustomization = one(k8s, "Kustomization")
    listed = kustomization["resources"]
    for resource in listed:
        assert (KUBERNETES / resource).is_file(), resource
    not_listed = {p.name for p in KUBERNETES.glob("*.yaml")} - set(listed)
    # The admin Job is an example to adapt; everything else is applied.
    assert not_listed == {"kustomization.yaml", "job-admin.yaml"}
    (image,) = kustomization["images"]
    assert proxy_container(k8s)["image"].split(":")[0] == image["name"]


def test_deployment_runs_three_spread_proxies(k8s: dict[tuple[str, str], dict[str, Any]]) -> None:
    deployment = one(k8s, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]

    def selects_pods(selector: dict[str, str]) -> bool:
        return bool(selector) and selector.items() <= labels.items()

    assert deployment["spec"]["replicas"] == 3
    assert selects_pods(deployment["spec"]["selector"]["matchLabels"])
    anti = pod_spec(deployment)["affinity"]["podAntiAffinity"]
    terms = [
        *anti.get("requiredDuringSchedulingIgnoredDuringExecution", []),
        *(
            t["podAffinityTerm"]
            for t in anti.get("preferredDuringSchedulingIgnoredDuringExecution", [])
        ),
    ]
    assert any(
        term["topologyKey"] == "kubernetes.io/hostname"
        and selects_pods(term["labelSelector"]["matchLabels"])
        for term in terms
    )
    for kind, name in (("Service", "starlight"), ("Service", "starlight-metrics")):
        assert selects_pods(k8s[(kind, name)]["spec"]["selector"]), name
    pdb = one(k8s, "PodDisruptionBudget")
    assert selects_pods(pdb["spec"]["selector"]["matchLabels"])
    assert pdb["spec"]["maxUnavailable"] == 1


def test_deployment_command_and_configuration_are_valid(
    k8s: dict[tuple[str, str], dict[str, Any]], k8s_config: StarlightConfig
) -> None:
    argv = container_argv(proxy_container(k8s), ["starlight-proxy"])
    assert argv[0] == "starlight-proxy"
    assert parse_proxy_argv(argv[1:]).command == "serve"
    assert listener_ports(k8s_config).keys() == {"amqp", "amqps"}
    assert k8s_config.authentication_enabled


def test_every_file_the_configuration_names_is_mounted(
    k8s: dict[tuple[str, str], dict[str, Any]], k8s_config: StarlightConfig
) -> None:
    pod = pod_spec(one(k8s, "Deployment"))
    container = proxy_container(k8s)
    named = files_named_by(k8s_config)
    assert len(named) == 3  # certificate, key, token public key
    for path in named:
        kind, _ = volume_file(k8s, pod, container, path)
        assert kind == "Secret", f"{path} should come from a Secret"


def test_ports_agree_between_configuration_container_services_and_probes(
    k8s: dict[tuple[str, str], dict[str, Any]], k8s_config: StarlightConfig
) -> None:
    container = proxy_container(k8s)
    listeners = listener_ports(k8s_config)
    metrics = metrics_port(k8s_config)
    assert named_port(container, "amqp") == listeners["amqp"]
    assert named_port(container, "amqps") == listeners["amqps"]
    assert named_port(container, "metrics") == metrics

    service = k8s[("Service", "starlight")]
    assert service["spec"]["type"] == "LoadBalancer"
    exposed = {
        named_port(container, port["targetPort"]): port["port"] for port in service["spec"]["ports"]
    }
    assert exposed == {port: port for port in listeners.values()}
    metrics_service = k8s[("Service", "starlight-metrics")]
    (metrics_entry,) = metrics_service["spec"]["ports"]
    assert named_port(container, metrics_entry["targetPort"]) == metrics

    readiness = container["readinessProbe"]["httpGet"]
    liveness = container["livenessProbe"]["httpGet"]
    assert readiness["path"] == "/readyz"
    assert liveness["path"] == "/healthz"
    assert named_port(container, readiness["port"]) == metrics
    assert named_port(container, liveness["port"]) == metrics

    annotations = one(k8s, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == metrics
    assert annotations["prometheus.io/path"] == "/metrics"


def test_grace_period_outlasts_the_prestop_pause_and_the_drain(
    k8s: dict[tuple[str, str], dict[str, Any]], k8s_config: StarlightConfig
) -> None:
    text = k8s[("ConfigMap", "starlight-config")]["data"]["starlight.conf"]
    assert "shutdownDrainMillis" in CONFIG_KEYS
    assert "shutdownDrainMillis" in conf_keys(text), "the drain is set explicitly"
    pod = pod_spec(one(k8s, "Deployment"))
    pre_stop = proxy_container(k8s)["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    pause = float(pre_stop[1]) * SECONDS
    grace = pod["terminationGracePeriodSeconds"] * SECONDS
    assert grace >= pause + k8s_config.shutdown_drain + AFTER_DRAIN


def test_secrets_are_marked_placeholders_that_fail_closed(
    k8s: dict[tuple[str, str], dict[str, Any]], k8s_config: StarlightConfig, tmp_path: Path
) -> None:
    tls = k8s[("Secret", "starlight-tls")]
    jwt = k8s[("Secret", "starlight-jwt")]
    assert tls["type"] == "kubernetes.io/tls"
    for secret in (tls, jwt):
        for value in secret["stringData"].values():
            assert value.startswith("REPLACE-ME")
    # Left as they are, the placeholders stop the proxy at start instead of running with a
    # key anyone can read in this repository.
    (tmp_path / "tls.crt").write_text(tls["stringData"]["tls.crt"])
    (tmp_path / "tls.key").write_text(tls["stringData"]["tls.key"])
    (tmp_path / "public.key").write_text(jwt["stringData"]["public.key"])
    local = load_config(
        None,
        {},
        {
            "amqpListeners": "amqps://127.0.0.1:5671",
            "tlsCertificateFilePath": str(tmp_path / "tls.crt"),
            "tlsKeyFilePath": str(tmp_path / "tls.key"),
            "authenticationEnabled": "true",
            "authenticationProviders": ",".join(k8s_config.authentication_providers),
            "tokenPublicKey": f"file://{tmp_path / 'public.key'}",
            "tokenPublicAlg": k8s_config.token_public_alg,
        },
    )
    with pytest.raises(TlsSetupError):
        build_server_context(TlsSettings.from_config(local))
    with pytest.raises(ConfigError):
        build_authenticator(local)


def test_admin_job_runs_real_starlight_admin_commands(
    k8s: dict[tuple[str, str], dict[str, Any]], tmp_path: Path
) -> None:
    job = one(k8s, "Job")
    pod = pod_spec(job)
    containers = [*pod.get("initContainers", []), *pod["containers"]]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "scripts"
    ]
    commands = []
    for container in containers:
        assert container["image"] == proxy_container(k8s)["image"]
        argv = container_argv(container, ["starlight-proxy"])
        assert argv[0] == "starlight-admin" and argv[0] in scripts
        args = parse_admin_argv(argv[1:])
        kind, name = volume_file(k8s, pod, container, str(args.config))
        load_conf_text(k8s[(kind, name)]["data"]["starlight.conf"], tmp_path)
        commands.append(args.command)
        if args.command == "permissions":
            for pattern in (args.configure, args.write, args.read):
                re.compile(pattern)  # the regexes are checked like RabbitMQ's
    assert commands == ["vhost", "permissions"]


def test_environment_variables_named_in_deploy_files_are_real() -> None:
    known = {env_var_for(key) for key in CONFIG_KEYS}
    files = [p for p in DEPLOY.rglob("*") if p.is_file() and "local" not in p.parts]
    named = set()
    for path in files:
        named |= set(re.findall(r"\bSTARLIGHT_[A-Z_]+\b", path.read_text(encoding="utf-8")))
    assert named, "the deploy files show how to set keys from the environment"
    assert named <= known, sorted(named - known)


# ---- deploy/README.md ---------------------------------------------------------------------------


def test_deploy_readme_covers_every_file_and_its_links_resolve() -> None:
    readme = DEPLOY / "README.md"
    text = readme.read_text(encoding="utf-8")
    for folder in (DOCKER, COMPOSE, KUBERNETES):
        for path in folder.iterdir():
            assert path.name in text, f"deploy/README.md does not mention {path.name}"
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if "://" not in target:
            assert (readme.parent / target).exists(), target


# ---- the checkers themselves reject what they should ---------------------------------------------


def test_checkers_reject_made_up_commands_and_flags() -> None:
    with pytest.raises(Rejected):
        parse_proxy_argv(["serve", "--settings", "/etc/starlight/starlight.conf"])
    with pytest.raises(Rejected):
        parse_proxy_argv(["run"])
    with pytest.raises(Rejected):
        parse_admin_argv(["vhost", "frobnicate", "orders"])
    with pytest.raises(Rejected):
        parse_admin_argv(["vhost", "create", "orders", "--tenant", "acme"])


def test_checkers_reject_unknown_keys_and_bad_values(tmp_path: Path) -> None:
    with pytest.raises(Rejected, match="amqpListner"):
        load_conf_text("amqpListner=amqp://0.0.0.0:5672\n", tmp_path)
    with pytest.raises(Rejected, match="metricsListener"):
        load_conf_text("metricsListener=0.0.0.0:9101\n", tmp_path)


def test_checkers_reject_unmounted_files_and_undeclared_ports(
    k8s: dict[tuple[str, str], dict[str, Any]],
) -> None:
    pod = pod_spec(one(k8s, "Deployment"))
    container = proxy_container(k8s)
    with pytest.raises(Rejected, match="not mounted"):
        volume_file(k8s, pod, container, "/etc/starlight/ca/ca.crt")
    with pytest.raises(Rejected, match="no key"):
        volume_file(k8s, pod, container, "/etc/starlight/tls/ca.crt")
    with pytest.raises(Rejected):
        named_port(container, "amqp-tls")
    with pytest.raises(Rejected):
        named_port(container, 15672)


def test_dockerignore_check_is_not_vacuous() -> None:
    patterns = dockerignore_patterns()
    assert ignored_by(patterns, "tests/conftest.py")
    assert ignored_by(patterns, "starlight_py/__pycache__/cli.cpython-311.pyc")
    assert not ignored_by(patterns, "starlight_py/cli.py")


def _walk(value: Any) -> Iterator[Any]:
    yield value
    if isinstance(value, dict):
        for item in value.values():
            yield from _walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from _walk(item)


def test_manifests_name_no_flag_the_parsers_do_not_know(
    k8s: dict[tuple[str, str], dict[str, Any]],
) -> None:
    # Any `--flag` string anywhere in the manifests belongs to a parsed command line.
    parsed_flags = set()
    for workload in (one(k8s, "Deployment"), one(k8s, "Job")):
        pod = pod_spec(workload)
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            parsed_flags |= {a for a in container.get("args", []) if a.startswith("--")}
    every_flag = {
        value
        for document in k8s.values()
        for value in _walk(document)
        if isinstance(value, str) and value.startswith("--")
    }
    assert every_flag == parsed_flags
