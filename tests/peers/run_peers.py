"""Run AMQP client libraries' own integration suites ("peer suites") against one AMQP URL.

Usage (from the repository root; tests/peers/run.sh is the same thing):

    python3 -m tests.peers.run_peers amqp://guest:guest@127.0.0.1:5672/%2F
        [--suites amqp091-go,py-amqp,...] [--json results.json] [--timeout 1200]
    python3 -m tests.peers.run_peers --compare rabbitmq.json proxy.json

Each suite is fetched on first use into .cache/peers/ (ignored by git): the Go module from the
Go module proxy (`go mod download`), Python sdists from PyPI's simple index (sha256 checked),
installed with their test dependencies into the venv .cache/peers/venv. The suites run as
their authors run them, with three adaptations, all in this file or next to it:

- the broker address comes from the URL (AMQP_URL for amqp091-go, RABBITMQ_HOST and
  RABBITMQ_5672_TCP for py-amqp and kombu, whose tests always log in as guest/guest on "/");
- aiormq and aio-pika start RabbitMQ in Docker from their conftest; the copy under
  .cache/peers/src gets tests/peers/docker_free_conftest.py appended, which replaces only
  the container fixtures with the given broker;
- pytest suites load tests/peers/pytest_outcomes.py to record each test's outcome.

A suite whose tests no allowed source ships (pika's acceptance tests are only in its GitHub
repository; its sdists leave them out) is reported as unavailable, with the reason.

Some tests need what no AMQP URL gives: RabbitMQ's management HTTP API, a TLS listener, Docker
(to restart a broker), or check the server's product name. KNOWN_NEEDS classifies them by
test id so that a comparison can tell them apart from real differences.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("PEERS_CACHE_DIR", REPO / ".cache" / "peers"))
PYPI_SIMPLE = os.environ.get("PEERS_PYPI_SIMPLE", "https://pypi.org/simple")
DEFAULT_TIMEOUT = 20 * 60  # seconds per suite; amqp091-go takes ~4 min against RabbitMQ

OUTCOMES = ("passed", "failed", "skipped", "error")

# (test id regex, what the test needs that an AMQP URL does not give)
MANAGEMENT_API = "needs the management HTTP API"
TLS = "needs a TLS listener"
DOCKER = "needs Docker (restarts a broker of its own)"
PRODUCT = "checks the server's product name"


@dataclass(frozen=True)
class Broker:
    """The pieces of the AMQP URL that the suites take separately."""

    url: str
    host: str
    port: int
    user: str
    password: str
    vhost: str

    @classmethod
    def parse(cls, url: str) -> Broker:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "amqp":
            raise SystemExit(f"run_peers: give an amqp:// URL, not {url!r}")
        vhost = urllib.parse.unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
        return cls(
            url=url,
            host=parts.hostname or "localhost",
            port=parts.port or 5672,
            user=urllib.parse.unquote(parts.username or "guest"),
            password=urllib.parse.unquote(parts.password or "guest"),
            vhost=vhost,
        )


@dataclass
class SuiteResult:
    suite: str
    version: str
    status: str = "ran"  # ran | timeout | unavailable | broken
    note: str = ""
    seconds: float = 0.0
    tests: dict[str, str] = field(default_factory=dict)  # test id -> outcome

    def count(self, outcome: str) -> int:
        return sum(1 for o in self.tests.values() if o == outcome)


@dataclass(frozen=True)
class Suite:
    """One peer suite: how to fetch it, run it, and read its outcomes."""

    name: str
    version: str
    run: Callable[[Suite, Broker, int], SuiteResult]
    package: str = ""  # PyPI project or Go module
    test_paths: tuple[str, ...] = ()
    test_deps: tuple[str, ...] = ()
    env: Callable[[Broker], dict[str, str]] = lambda _broker: {}
    docker_free: bool = False  # append docker_free_conftest.py to tests/conftest.py
    known_needs: tuple[tuple[str, str], ...] = ()
    # pytest arguments that leave out tests needing what no AMQP URL gives, with the reason;
    # they would only fail (slowly: TLS connects retry) against any broker given by URL.
    not_run: tuple[tuple[tuple[str, ...], str], ...] = ()
    # Queues the suite's tests use by a fixed name and leave behind with messages: deleted
    # (with py-amqp, from the suite's venv) before it runs, so that a rerun against the
    # same broker starts as the first run did.
    leftover_queues: tuple[str, ...] = ()

    def need_of(self, test_id: str) -> str:
        for pattern, need in self.known_needs:
            if re.search(pattern, test_id):
                return need
        return ""


# --- fetching -------------------------------------------------------------------------------


def log(message: str) -> None:
    print(f"[peers] {message}", file=sys.stderr, flush=True)


def fetch_sdist(project: str, version: str) -> Path:
    """Download (once) and unpack project's sdist; return the unpacked folder."""
    normalized = re.sub(r"[-_.]+", "_", project).lower()
    target = CACHE / "src" / f"{normalized}-{version}"
    if target.is_dir():
        return target
    request = urllib.request.Request(
        f"{PYPI_SIMPLE}/{project}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        index = json.load(response)
    wanted = {f"{project}-{version}.tar.gz", f"{normalized}-{version}.tar.gz"}
    files = [f for f in index["files"] if f["filename"].lower() in {w.lower() for w in wanted}]
    if not files:
        raise RuntimeError(f"PyPI has no sdist {project}-{version}.tar.gz")
    found = files[0]
    archive = CACHE / "dl" / found["filename"]
    archive.parent.mkdir(parents=True, exist_ok=True)
    if not archive.exists():
        log(f"downloading {found['url']}")
        with urllib.request.urlopen(found["url"], timeout=300) as response:
            data = response.read()
        expected = found.get("hashes", {}).get("sha256")
        if expected and hashlib.sha256(data).hexdigest() != expected:
            raise RuntimeError(f"sha256 mismatch for {found['filename']}")
        archive.write_bytes(data)
    unpack = CACHE / "src" / ".unpack"
    shutil.rmtree(unpack, ignore_errors=True)
    with tarfile.open(archive) as tar:
        tar.extractall(unpack, filter="data")
    (top,) = list(unpack.iterdir())
    top.rename(target)
    unpack.rmdir()
    return target


def venv_python() -> Path:
    venv = CACHE / "venv"
    python = venv / "bin" / "python"
    if not python.exists():
        log(f"creating {venv}")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    return python


def install(suite: Suite, source: Path) -> Path:
    """Install the suite's library (from its sdist) and test deps into the venv, once."""
    python = venv_python()
    marker = CACHE / "venv" / f".installed-{suite.name}-{suite.version}"
    if not marker.exists():
        log(f"installing {suite.package} {suite.version} and {', '.join(suite.test_deps)}")
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", str(source), *suite.test_deps],
            check=True,
        )
        marker.touch()
    return python


def go_env() -> dict[str, str]:
    return {
        "GOMODCACHE": str(CACHE / "gomodcache"),
        "GOPATH": str(CACHE / "gopath"),
        "GOFLAGS": "-mod=mod",
    }


def fetch_go_module(module: str, version: str) -> Path:
    """Download module@version from the Go module proxy; return a writable copy."""
    target = CACHE / "src" / f"{module.rsplit('/', 1)[-1]}-{version.lstrip('v')}"
    if target.is_dir():
        return target
    log(f"go mod download {module}@{version}")
    out = subprocess.run(
        ["go", "mod", "download", "-json", f"{module}@{version}"],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, **go_env()},
        cwd=CACHE,
    )
    source = Path(json.loads(out.stdout)["Dir"])
    shutil.copytree(source, target)
    for path in [target, *target.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)
    return target


# --- running --------------------------------------------------------------------------------


def run_with_timeout(
    command: Sequence[str], cwd: Path, env: dict[str, str], timeout: int, stdout_path: Path
) -> bool:
    """Run command in its own process group; True if it finished within timeout."""
    with open(stdout_path, "w", encoding="utf-8") as out:
        process = subprocess.Popen(
            list(command),
            cwd=cwd,
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            process.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return False


def results_dir(broker: Broker) -> Path:
    """Where a run against broker keeps its logs (runs against two brokers may overlap)."""
    path = CACHE / "results" / f"{broker.host}-{broker.port}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def run_pytest_suite(suite: Suite, broker: Broker, timeout: int) -> SuiteResult:
    result = SuiteResult(suite.name, suite.version)
    source = fetch_sdist(suite.package, suite.version)
    missing = [p for p in suite.test_paths if not (source / p).exists()]
    if missing:
        result.status = "unavailable"
        result.note = (
            f"the {suite.package} {suite.version} sdist on PyPI has no {', '.join(missing)}; "
            "the tests are only in the project's source repository, which is not reachable "
            "from the allowed sources (PyPI, Go module proxy, ...)"
        )
        return result
    python = install(suite, source)
    if suite.docker_free:
        conftest = source / "tests" / "conftest.py"
        shim = (HERE / "docker_free_conftest.py").read_text(encoding="utf-8")
        if shim not in conftest.read_text(encoding="utf-8"):
            with open(conftest, "a", encoding="utf-8") as out:
                out.write(shim)
    if suite.leftover_queues:
        delete_leftover_queues(python, broker, suite.leftover_queues)
    outcomes = results_dir(broker) / f"{suite.name}.jsonl"
    outcomes.unlink(missing_ok=True)
    env = {
        "PEERS_OUTCOMES": str(outcomes),
        "PYTHONPATH": str(HERE),
        "PEERS_AMQP_HOST": broker.host,
        "PEERS_AMQP_PORT": str(broker.port),
        "PEERS_AMQP_USER": broker.user,
        "PEERS_AMQP_PASSWORD": broker.password,
        "PEERS_AMQP_VHOST": broker.vhost,
        **suite.env(broker),
    }
    command = [
        str(python),
        "-m",
        "pytest",
        "-p",
        "pytest_outcomes",
        "-p",
        "no:cacheprovider",
        "-q",
        *(arg for args, _need in suite.not_run for arg in args),
        *suite.test_paths,
    ]
    if suite.not_run:
        result.note = "not run: " + "; ".join(
            f"{' '.join(args)} ({need})" for args, need in suite.not_run
        )
    finished = run_with_timeout(
        command, source, env, timeout, results_dir(broker) / f"{suite.name}.log"
    )
    if not finished:
        result.status = "timeout"
        result.note = f"stopped after {timeout} s; counts are of the tests finished by then. " + (
            result.note
        )
    if outcomes.exists():
        for line in outcomes.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            result.tests[record["id"]] = record["outcome"]
    if not result.tests and finished:
        result.status = "broken"
        result.note = f"no test ran; see {results_dir(broker) / (suite.name + '.log')}"
    return result


DELETE_QUEUES = """
import sys, amqp
host, user, password, vhost, *names = sys.argv[1:]
with amqp.Connection(host, userid=user, password=password, virtual_host=vhost) as connection:
    channel = connection.channel()
    for name in names:
        print(name, channel.queue_delete(name), "messages deleted")
"""


def delete_leftover_queues(python: Path, broker: Broker, names: Sequence[str]) -> None:
    """Delete queues an earlier run of a suite left with messages (absent ones are fine)."""
    command = [
        str(python),
        "-c",
        DELETE_QUEUES,
        f"{broker.host}:{broker.port}",
        broker.user,
        broker.password,
        broker.vhost,
        *names,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    log(f"leftover queues {', '.join(names)}: {(done.stdout + done.stderr).strip()}")


def run_go_suite(suite: Suite, broker: Broker, timeout: int) -> SuiteResult:
    result = SuiteResult(suite.name, suite.version)
    source = fetch_go_module(suite.package, suite.version)
    output = results_dir(broker) / f"{suite.name}.json"
    command = [
        "go",
        "test",
        "-tags",
        "integration",
        "-json",
        "-count=1",
        f"-timeout={timeout}s",
        "./",
    ]
    env = {**go_env(), "AMQP_URL": broker.url}
    finished = run_with_timeout(command, source, env, timeout + 120, output)
    if not finished:
        result.status = "timeout"
        result.note = f"stopped after {timeout} s"
    running: set[str] = set()
    for line in output.read_text(encoding="utf-8").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        test = event.get("Test")
        # Subtests are counted through their parent test, which fails when one of them does.
        if not test or "/" in test:
            continue
        action = event.get("Action")
        if action == "run":
            running.add(test)
        elif action in ("pass", "fail", "skip"):
            running.discard(test)
            result.tests[test] = {"pass": "passed", "fail": "failed", "skip": "skipped"}[action]
    for test in running:  # a panic or the time limit ended the run inside this test
        result.tests[test] = "error"
    if not result.tests:
        result.status = "broken"
        result.note = f"no test ran; see {output}"
    return result


def run_unavailable(suite: Suite, broker: Broker, timeout: int) -> SuiteResult:
    return SuiteResult(suite.name, suite.version, status="unavailable", note=suite.package)


def rabbitmq_env(broker: Broker) -> dict[str, str]:
    return {"RABBITMQ_HOST": broker.host, "RABBITMQ_5672_TCP": str(broker.port)}


SUITES = (
    Suite(
        name="amqp091-go",
        version="v1.16.0",
        run=run_go_suite,
        package="github.com/rabbitmq/amqp091-go",
        known_needs=(
            # recovery_test.go closes connections through http://localhost:15672/api/...
            (r"^TestConnectionRecovery", MANAGEMENT_API),
        ),
    ),
    Suite(
        name="aiormq",
        version="7.2.4",
        run=run_pytest_suite,
        package="aiormq",
        test_paths=("tests",),
        test_deps=("pytest", "aiomisc-pytest>=2,<3", "yarl"),
        docker_free=True,
        known_needs=((r"amqps|ssl", TLS),),
        not_run=((("-k", "not amqps and not ssl"), TLS),),
    ),
    Suite(
        name="aio-pika",
        version="10.2.1",
        run=run_pytest_suite,
        package="aio-pika",
        test_paths=("tests",),
        test_deps=(
            "pytest",
            "aiomisc",
            "aiomisc-pytest",
            "shortuuid",
            "timeout-decorator",
            "yarl",
        ),
        docker_free=True,
        known_needs=((r"test_amqps\.py", TLS), (r"test_robust_recovery\.py", DOCKER)),
        not_run=(
            (("--ignore=tests/test_amqps.py",), TLS),
            (("--ignore=tests/test_robust_recovery.py",), DOCKER),
        ),
    ),
    Suite(
        name="pika",
        version="1.4.4",
        run=run_pytest_suite,
        package="pika",
        test_paths=("tests/acceptance",),
    ),
    Suite(
        name="kombu",
        version="5.7.0",
        run=run_pytest_suite,
        package="kombu",
        test_paths=("t/integration/test_py_amqp.py",),
        test_deps=("pytest", "pytest-rerunfailures"),
        env=rabbitmq_env,
        # test_PyAMQPPriority::test_publish_requeue_consume requeues its messages and
        # never deletes its queue: a second run would find the first one's and fail.
        leftover_queues=("priority_requeue_test",),
    ),
    Suite(
        name="py-amqp",
        version="5.4.2",
        run=run_pytest_suite,
        package="amqp",
        test_paths=("t/integration",),
        test_deps=("pytest", "pytest-rerunfailures"),
        env=rabbitmq_env,
        known_needs=((r"tls|ssl", TLS),),
        not_run=((("-k", "not tls"), TLS),),
    ),
)


# --- reporting ------------------------------------------------------------------------------


def print_table(results: Sequence[SuiteResult], url: str) -> None:
    print(f"peer suites against {url}")
    header = f"{'suite':<11} {'version':<8} {'passed':>6} {'failed':>6} {'skipped':>7} "
    print(header + f"{'errors':>6} {'secs':>5}  status")
    for r in results:
        counts = " ".join(f"{r.count(o):>{w}}" for o, w in zip(OUTCOMES, (6, 6, 7, 6), strict=True))
        status = r.status if not r.note else f"{r.status}: {r.note}"
        print(f"{r.suite:<11} {r.version:<8} {counts} {r.seconds:>5.0f}  {status}")
    suites = {s.name: s for s in SUITES}
    for r in results:
        bad = sorted(t for t, o in r.tests.items() if o in ("failed", "error"))
        if not bad:
            continue
        print(f"\n{r.suite}: {len(bad)} failed or errored")
        for test in bad:
            need = suites[r.suite].need_of(test) if r.suite in suites else ""
            print(f"  {r.tests[test]:<6} {test}" + (f"  ({need})" if need else ""))


def compare(reference_file: Path, candidate_file: Path) -> int:
    """Print the tests that pass in reference_file and do not pass in candidate_file."""
    reference = json.loads(reference_file.read_text(encoding="utf-8"))
    candidate = json.loads(candidate_file.read_text(encoding="utf-8"))
    suites = {s.name: s for s in SUITES}
    differences = 0
    for name, ref in reference["suites"].items():
        cand = candidate["suites"].get(name)
        if cand is None:
            print(f"{name}: not in {candidate_file}")
            continue
        lost = sorted(
            t for t, o in ref["tests"].items() if o == "passed" and cand["tests"].get(t) != "passed"
        )
        gained = sorted(
            t for t, o in cand["tests"].items() if o == "passed" and ref["tests"].get(t) != "passed"
        )
        print(
            f"{name}: {len(lost)} pass on {reference['url']} but not on {candidate['url']}; "
            f"{len(gained)} the other way"
        )
        for test in lost:
            need = suites[name].need_of(test) if name in suites else ""
            differences += not need
            outcome = cand["tests"].get(test, "not run")
            print(f"  {outcome:<7} {test}" + (f"  ({need})" if need else ""))
    print(f"{differences} difference(s) not explained by a known need")
    return 1 if differences else 0


def save(path: Path, url: str, results: Sequence[SuiteResult]) -> None:
    """Write results to path; suites of an earlier run against the same URL are kept."""
    saved = {"url": url, "suites": {}}
    if path.exists():
        earlier = json.loads(path.read_text(encoding="utf-8"))
        if earlier.get("url") == url:
            saved = earlier
    for r in results:
        saved["suites"][r.suite] = {**dataclasses.asdict(r), "date": time.strftime("%Y-%m-%d")}
    path.write_text(json.dumps(saved, indent=1, sort_keys=True), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tests/peers/run.sh", description=__doc__.split("\n")[0])
    parser.add_argument("url", nargs="?", help="amqp://user:password@host:port/vhost")
    parser.add_argument("--suites", help="comma-separated: " + ",".join(s.name for s in SUITES))
    parser.add_argument(
        "--json",
        type=Path,
        help="save the results to this file (suites saved there earlier for the same URL stay)",
    )
    parser.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT, help="seconds per suite")
    parser.add_argument(
        "--compare",
        nargs=2,
        type=Path,
        metavar=("REFERENCE_JSON", "CANDIDATE_JSON"),
        help="print the tests that pass in the first results file and not in the second",
    )
    args = parser.parse_args(argv)
    if args.compare:
        return compare(*args.compare)
    if not args.url:
        parser.error("give an AMQP URL (or --compare A.json B.json)")
    broker = Broker.parse(args.url)
    chosen = SUITES
    if args.suites:
        names = args.suites.split(",")
        unknown = set(names) - {s.name for s in SUITES}
        if unknown:
            parser.error(f"unknown suite(s): {', '.join(sorted(unknown))}")
        chosen = tuple(s for s in SUITES if s.name in names)
    CACHE.mkdir(parents=True, exist_ok=True)
    results = []
    for suite in chosen:
        log(f"{suite.name} {suite.version}: running against {broker.url}")
        started = time.monotonic()
        try:
            result = suite.run(suite, broker, args.timeout)
        except (OSError, RuntimeError, subprocess.CalledProcessError) as e:
            result = SuiteResult(suite.name, suite.version, status="broken", note=str(e))
        result.seconds = time.monotonic() - started
        results.append(result)
        log(f"{suite.name}: {result.status}, {result.count('passed')} passed")
    print_table(results, broker.url)
    if args.json:
        save(args.json, broker.url, results)
    failed = any(r.status in ("broken", "timeout") or r.count("failed") for r in results)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
