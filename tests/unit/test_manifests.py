"""The examples under docs/ may only use what the option declarations accept.

Every Kubernetes manifest under docs/deploy/ is parsed; each container (or DynamoGraphDeployment
service) that starts ``python -m dynamo.frontend`` or ``python -m dynamo.vllm`` is checked against
that program's own options: an env var or flag no option declares fails, and so does a value the
option's kind would reject. The real parser then reads the same argv and env, so the check
cannot be laxer than the program. Every docs page may name only declared DYN_* env vars, and the
log lines the operator guide quotes must exist in the source.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from dynamo.common import logging_setup
from dynamo.common.configuration import Option, build_parser, parse_bool_word
from dynamo.common.configuration.docs import all_options, surfaces
from dynamo_gc.configuration.options import Surface

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
DEPLOY = DOCS / "deploy"
# Our launchers and the GC layer under them.
SOURCES = (REPO / "components" / "src" / "dynamo", REPO / "components" / "src" / "dynamo_gc")

# Env vars in the manifests that belong to other software, each with the reason it is there.
FOREIGN_ENV_VARS = {
    "PYTHONUNBUFFERED": "CPython: log lines reach `kubectl logs` as they are written",
    "POD_IP": "Kubernetes downward API, substituted into DYN_VLLM_REQUEST_PLANE_HOST",
}

# Which options each program reads (the worker also reads the self-benchmark's).
PROGRAM_SURFACES = {
    "dynamo.frontend": ("frontend",),
    "dynamo.vllm": ("vllm-worker", "vllm-self-benchmark"),
}


def program_options(program: str) -> list[Option]:
    by_name = {surface.name: surface for surface in surfaces()}
    return [o for name in PROGRAM_SURFACES[program] for o in by_name[name].options]


@dataclass
class Launch:
    """One container (or DGD service) that starts one of our programs."""

    where: str
    program: str
    argv: list[str]  # the program's own arguments, after ``-m dynamo.x``
    env: dict[str, str | None] = field(default_factory=dict)  # None: valueFrom (not literal)


# Upstream ai-dynamo's programs, with the adapter's options: tests/unit/test_manifests_ai_dynamo.py.
AI_DYNAMO_DEPLOY = DEPLOY / "ai-dynamo"


def manifest_files() -> list[Path]:
    return sorted(
        p
        for p in DEPLOY.rglob("*")
        if p.suffix in (".yaml", ".yml") and AI_DYNAMO_DEPLOY not in p.parents
    )


def _env_list(entries, where: str) -> dict[str, str | None]:
    env = {}
    for entry in entries or []:
        assert isinstance(entry, dict) and "name" in entry, f"{where}: odd env entry {entry!r}"
        value = entry.get("value")
        env[entry["name"]] = None if value is None and "valueFrom" in entry else str(value)
    return env


def _split_program(command: list[str]) -> tuple[str, list[str]] | None:
    tokens = [str(t) for t in command]
    for index, token in enumerate(tokens[:-1]):
        if token == "-m" and tokens[index + 1] in PROGRAM_SURFACES:
            return tokens[index + 1], tokens[index + 2 :]
    return None


def _launch(node: dict, env_entries, where: str) -> Launch | None:
    split = _split_program([*(node.get("command") or []), *(node.get("args") or [])])
    if split is None:
        return None
    program, argv = split
    return Launch(where=where, program=program, argv=argv, env=_env_list(env_entries, where))


def launches_in(path: Path) -> Iterator[Launch]:
    """Every launch of our programs in one file; fails on a DYN_ env list it cannot attribute."""
    documents = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    assert documents, f"{path}: no YAML document"
    seen_env_lists: set[int] = set()
    dgd_containers: set[int] = set()
    for number, document in enumerate(documents):
        name = f"{path.name}#{number} {document.get('kind')}"
        if document.get("kind") == "DynamoGraphDeployment":
            for service_name, service in document["spec"]["services"].items():
                container = (service.get("extraPodSpec") or {}).get("mainContainer") or {}
                dgd_containers.add(id(container))
                # The operator puts the service's `envs` and the container's own `env` together.
                envs = [*(service.get("envs") or []), *(container.get("env") or [])]
                seen_env_lists.update({id(service.get("envs")), id(container.get("env"))})
                launch = _launch(container, envs, f"{name} service {service_name}")
                assert launch is not None, f"{name} service {service_name}: no dynamo program"
                yield launch
        for container, where in _containers(document, name):
            seen_env_lists.add(id(container.get("env")))
            if id(container) in dgd_containers:
                continue
            launch = _launch(container, container.get("env"), where)
            if launch is not None:
                yield launch
            else:
                assert not [
                    n for n in _env_list(container.get("env"), where) if n.startswith("DYN_")
                ], f"{where}: sets DYN_* env vars but starts no dynamo program"
        for env_list, where in _env_lists(document, name):
            assert id(env_list) in seen_env_lists, f"{where}: env list outside a checked launch"


def _containers(node, where: str) -> Iterator[tuple[dict, str]]:
    if isinstance(node, dict):
        for key in ("containers", "initContainers"):
            for container in node.get(key) or []:
                yield container, f"{where} container {container.get('name')}"
        for value in node.values():
            yield from _containers(value, where)
    elif isinstance(node, list):
        for value in node:
            yield from _containers(value, where)


def _env_lists(node, where: str) -> Iterator[tuple[list, str]]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("env", "envs") and isinstance(value, list):
                yield value, f"{where} {key}"
            else:
                yield from _env_lists(value, where)
    elif isinstance(node, list):
        for value in node:
            yield from _env_lists(value, where)


def all_launches() -> list[Launch]:
    return [launch for path in manifest_files() for launch in launches_in(path)]


# What Kubernetes substitutes for a `$(VAR)` reference at run time: a value of the same shape,
# so the check parses (and, for hosts, resolves) what the program will really see.
KUBERNETES_SUBSTITUTIONS = {"$(POD_IP)": "10.1.2.3"}


def check_value(option: Option, value: str, source: str) -> list[str]:
    try:
        if option.kind is None:  # a negatable boolean
            parse_bool_word(value)
        else:
            option.kind.parse(KUBERNETES_SUBSTITUTIONS.get(value, value))
    except ValueError as exc:
        return [f"{source}={value!r} is rejected by {option.source_label()}: {exc}"]
    return []


def problems(launch: Launch) -> list[str]:
    options = program_options(launch.program)
    by_env = {o.env_var: o for o in options}
    found = []
    for name, value in launch.env.items():
        if name in FOREIGN_ENV_VARS:
            continue
        option = by_env.get(name)
        if option is None:
            found.append(f"env {name}: no option of {launch.program} declares it")
        elif value is not None:
            found.extend(check_value(option, value, f"env {name}"))
    by_flag = {}
    for option in options:
        by_flag[option.flag] = (option, True)
        if option.is_bool:
            by_flag["--no-" + option.name] = (option, False)
    tokens = iter(launch.argv)
    for token in tokens:
        flag, has_inline, inline = token.partition("=")
        if not flag.startswith("--"):
            found.append(f"argument {token!r} is not a flag")
            continue
        entry = by_flag.get(flag)
        if entry is None:
            found.append(f"flag {flag}: no option of {launch.program} declares it")
            continue
        option, _ = entry
        if option.is_bool:
            if has_inline:
                found.append(f"flag {token}: booleans take no value (use --x / --no-x)")
            continue
        value = inline if has_inline else next(tokens, None)
        if value is None:
            found.append(f"flag {flag}: missing its value")
        else:
            found.extend(check_value(option, value, f"flag {flag}"))
    return found


def parse_with_the_real_parser(launch: Launch):
    """What the program itself would do with this argv and env (exit 2 on anything bad); the
    namespace it parses."""
    surface = Surface(
        name=launch.program,
        title=launch.program,
        program=f"python -m {launch.program}",
        description="",
        options=program_options(launch.program),
    )
    env = {
        name: KUBERNETES_SUBSTITUTIONS.get(value, value)
        for name, value in launch.env.items()
        if value is not None
    }
    argv = [KUBERNETES_SUBSTITUTIONS.get(word, word) for word in launch.argv]
    return build_parser(surface).parse_args(argv, env_vars=env)


def test_there_are_manifests_for_both_programs_and_a_freeze_off_variant():
    launches = all_launches()
    assert {launch.program for launch in launches} == set(PROGRAM_SURFACES)
    freeze_off_flags = {"--no-dyn-freeze-gc-heap", "--no-freeze-gc-heap"}
    assert freeze_off_flags <= {token for launch in launches for token in launch.argv}


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: p.name)
def test_manifest_uses_only_declared_options_with_valid_values(path):
    launches = list(launches_in(path))
    for launch in launches:
        assert problems(launch) == [], launch.where
        parse_with_the_real_parser(launch)


@pytest.mark.parametrize(
    "launch, expected",
    [
        (Launch("t", "dynamo.vllm", [], {"DYN_VLLM_FREEZE_GC_HEAP": "maybe"}), "rejected"),
        (Launch("t", "dynamo.vllm", [], {"DYN_VLLM_FREEZ_GC_HEAP": "0"}), "no option"),
        (Launch("t", "dynamo.frontend", [], {"DYN_SYSTEM_PORT": "9090"}), "no option"),
        (Launch("t", "dynamo.vllm", ["--system-port", "70000"], {}), "rejected"),
        (Launch("t", "dynamo.vllm", ["--no-dyn-freeze-gc-heap"], {}), "no option"),
        (Launch("t", "dynamo.frontend", ["--dyn-gc-pause-log-ms=nan"], {}), "rejected"),
        (Launch("t", "dynamo.frontend", ["--dyn-freeze-gc-heap=0"], {}), "take no value"),
    ],
)
def test_the_manifest_check_catches_mistakes(launch, expected):
    assert any(expected in problem for problem in problems(launch)), problems(launch)


def test_the_walker_refuses_dyn_env_it_cannot_attribute(tmp_path):
    stray = tmp_path / "stray.yaml"
    stray.write_text(
        yaml.safe_dump(
            {
                "kind": "Deployment",
                "spec": {
                    "template": {
                        "spec": {
                            "containers": [
                                {
                                    "name": "sidecar",
                                    "command": ["sh"],
                                    "env": [{"name": "DYN_X", "value": "1"}],
                                }
                            ]
                        }
                    }
                },
            }
        )
    )
    with pytest.raises(AssertionError, match="starts no dynamo program"):
        list(launches_in(stray))


DYN_NAME = re.compile(r"\bDYN_[A-Z0-9_]*[A-Z0-9]\b|\bDYN_[A-Z0-9_]*_(?=\*|\b)")


def markdown_pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


@pytest.mark.parametrize("page", markdown_pages(), ids=lambda p: str(p.relative_to(DOCS)))
def test_docs_name_only_declared_env_vars(page):
    if page.name == "upstream.md":
        pytest.skip("names upstream's env vars on purpose: tests/unit/test_docs_upstream.py")
    if page.name == "ai-dynamo.md":
        pytest.skip("names upstream's env vars on purpose: tests/unit/test_manifests_ai_dynamo.py")
    declared = {option.env_var for option in all_options()} | {logging_setup.DYN_LOG}
    unknown = set()
    for name in DYN_NAME.findall(page.read_text(encoding="utf-8")):
        if name.endswith("_"):  # a prefix, as in DYN_VLLM_*
            if not any(env.startswith(name) for env in declared):
                unknown.add(name + "*")
        elif name not in declared:
            unknown.add(name)
    assert not unknown, f"{page}: undeclared env vars {sorted(unknown)}"


def _string_constants() -> list[str]:
    """Every string literal of the sources, implicit concatenations joined (as the AST has them)."""
    constants = []
    for path in (path for source in SOURCES for path in source.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        constants += [
            node.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
        ]
    return constants


@pytest.mark.parametrize("page", ["operator-guide.md", "security.md"])
def test_quoted_log_lines_exist(page):
    """A log format a page quotes (it has a %s/%d/%g placeholder) is in the source: each part of
    it between elisions ("..." or "…") within one string literal, in order."""
    text = (DOCS / page).read_text(encoding="utf-8")
    quoted = [q for q in re.findall(r"`([^`\n]+)`", text) if re.search(r"%[-.0-9]*[sdgf]", q)]
    assert len(quoted) >= 4, f"{page} should quote the log formats it explains"
    constants = _string_constants()

    def found(quote: str) -> bool:
        parts = [part.strip() for part in re.split(r"\.\.\.|…", quote) if part.strip()]
        for constant in constants:
            at = 0
            for part in parts:
                at = constant.find(part, at)
                if at < 0:
                    break
                at += len(part)
            else:
                return True
        return False

    missing = [q for q in quoted if not found(q)]
    assert not missing, f"log formats quoted in {page} but not in the source: {missing}"


# --- shutdown: what Kubernetes gives each program to drain --------------------------------

# Time a pod needs after its drain: the interpreter's exit, a vLLM engine's shutdown.
SHUTDOWN_MARGIN_S = 5


@dataclass
class PodLaunch:
    """A launch of one of our programs with the pod spec it runs in."""

    where: str
    program: str
    pod_spec: dict
    container: dict
    launch: Launch  # its argv and env, as the program reads them


def pod_launches_in(path: Path) -> Iterator[PodLaunch]:
    documents = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    for number, document in enumerate(documents):
        name = f"{path.name}#{number} {document.get('kind')}"
        if document.get("kind") == "DynamoGraphDeployment":
            for service_name, service in document["spec"]["services"].items():
                pod_spec = service.get("extraPodSpec") or {}
                container = pod_spec.get("mainContainer") or {}
                # Probes sit on the service in the CRD (as upstream's examples put them).
                probes = {k: v for k, v in service.items() if k.endswith("Probe")}
                container = {**container, **probes}
                # The operator puts the service's `envs` and the container's own `env` together.
                env_entries = [*(service.get("envs") or []), *(container.get("env") or [])]
                yield from _pod_launch(f"{name} {service_name}", pod_spec, container, env_entries)
        template = ((document.get("spec") or {}).get("template") or {}).get("spec")
        if template:
            for container in template.get("containers") or []:
                where = f"{name} {container.get('name')}"
                yield from _pod_launch(where, template, container, container.get("env"))


def _pod_launch(where: str, pod_spec: dict, container: dict, env_entries) -> Iterator[PodLaunch]:
    split = _split_program([*(container.get("command") or []), *(container.get("args") or [])])
    if split is not None:
        program, argv = split
        launch = Launch(where=where, program=program, argv=argv, env=_env_list(env_entries, where))
        yield PodLaunch(where, program, pod_spec, container, launch)


def prestop_sleep_s(container: dict) -> float:
    """Seconds a preStop hook sleeps (exec `sleep N`, or the `sleep` action); 0 without one."""
    pre_stop = (container.get("lifecycle") or {}).get("preStop") or {}
    if "sleep" in pre_stop:
        return float(pre_stop["sleep"]["seconds"])
    command = [str(token) for token in (pre_stop.get("exec") or {}).get("command") or []]
    if command[:1] == ["sleep"] and len(command) == 2:
        return float(command[1])
    assert not pre_stop, f"a preStop hook the check cannot read: {pre_stop}"
    return 0.0


def drain_timeout_s(pod_launch: PodLaunch) -> float:
    """The drain deadline this container runs with: the flag or env var the manifest sets, else
    the declared default, as the program's own parser reads them."""
    (option,) = [o for o in program_options(pod_launch.program) if o.dest == "drain_timeout"]
    assert pod_launch.launch.env.get(option.env_var, "") is not None, (
        f"{pod_launch.where}: {option.env_var} comes from valueFrom: the check cannot read it"
    )
    return float(parse_with_the_real_parser(pod_launch.launch).drain_timeout)


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: p.name)
def test_every_pod_has_time_to_drain_and_the_frontend_outlives_its_endpoints(path):
    """The grace period covers the preStop pause, the program's own drain and a margin (the
    default 30 s equals the drain: the pod would be SIGKILLed at the drain's deadline); the
    frontend, which closes its listener on SIGTERM, pauses first so its Service catches up."""
    launches = list(pod_launches_in(path))
    for launch in launches:
        pause_s = prestop_sleep_s(launch.container)
        if launch.program == "dynamo.frontend":
            assert pause_s >= 3, f"{launch.where}: no preStop pause before SIGTERM"
        grace_s = launch.pod_spec.get("terminationGracePeriodSeconds", 30)
        needed_s = pause_s + drain_timeout_s(launch) + SHUTDOWN_MARGIN_S
        assert grace_s >= needed_s, f"{launch.where}: grace {grace_s} s < {needed_s} s"
    if "-m dynamo" in path.read_text(encoding="utf-8"):
        assert launches, f"{path}: launches found by the other checks, but no pod spec"


def test_the_shutdown_check_catches_a_default_grace_period_and_a_missing_prestop(tmp_path):
    manifest = tmp_path / "bare.yaml"
    manifest.write_text(
        yaml.safe_dump(
            {
                "kind": "Deployment",
                "spec": {"template": {"spec": {"containers": [
                    {"name": "frontend", "command": ["python", "-m", "dynamo.frontend"]}
                ]}}},
            }
        )
    )  # fmt: skip
    with pytest.raises(AssertionError, match="no preStop pause"):
        test_every_pod_has_time_to_drain_and_the_frontend_outlives_its_endpoints(manifest)
    document = yaml.safe_load(manifest.read_text())
    container = document["spec"]["template"]["spec"]["containers"][0]
    container["lifecycle"] = {"preStop": {"sleep": {"seconds": 5}}}
    manifest.write_text(yaml.safe_dump(document))
    with pytest.raises(AssertionError, match="grace 30 s < 40.0 s"):
        test_every_pod_has_time_to_drain_and_the_frontend_outlives_its_endpoints(manifest)


def test_the_shutdown_check_reads_the_drain_each_manifest_sets(tmp_path):
    """The drain is the one the container runs with: its env var or flag (a DGD service's
    `envs` too), else the declared default, never a constant of the test."""
    frontend = {
        "name": "frontend",
        "command": ["python", "-m", "dynamo.frontend"],
        "lifecycle": {"preStop": {"sleep": {"seconds": 5}}},
    }
    worker = {"name": "worker", "command": ["python", "-m", "dynamo.vllm"], "args": []}
    pod = {"terminationGracePeriodSeconds": 45, "containers": [frontend, worker]}
    manifest = tmp_path / "drains.yaml"

    def check(**changes):
        frontend.update(changes.get("frontend", {}))
        worker.update(changes.get("worker", {}))
        manifest.write_text(
            yaml.safe_dump({"kind": "Deployment", "spec": {"template": {"spec": pod}}})
        )
        test_every_pod_has_time_to_drain_and_the_frontend_outlives_its_endpoints(manifest)

    check()  # the declared defaults: 5 + 30 + 5 <= 45
    with pytest.raises(AssertionError, match="frontend: grace 45 s < 70.0 s"):
        check(frontend={"env": [{"name": "DYN_DRAIN_TIMEOUT", "value": "60"}]})
    check(frontend={"env": [{"name": "DYN_DRAIN_TIMEOUT", "value": "10"}]})
    with pytest.raises(AssertionError, match="worker: grace 45 s < 46.0 s"):
        check(worker={"args": ["--drain-timeout=41"]})
    with pytest.raises(AssertionError, match="worker: grace 45 s < 46.0 s"):
        check(worker={"args": [], "env": [{"name": "DYN_VLLM_DRAIN_TIMEOUT", "value": "41"}]})
    # The flag wins over the env var, as in the program.
    check(worker={"args": ["--drain-timeout", "20"]})
    with pytest.raises(AssertionError, match="comes from valueFrom"):
        ref = {"configMapKeyRef": {"name": "c", "key": "k"}}
        check(worker={"env": [{"name": "DYN_VLLM_DRAIN_TIMEOUT", "valueFrom": ref}]})

    graph = tmp_path / "graph.yaml"
    graph.write_text(
        yaml.safe_dump(
            {
                "kind": "DynamoGraphDeployment",
                "spec": {"services": {"Frontend": {
                    "envs": [{"name": "DYN_DRAIN_TIMEOUT", "value": "40"}],
                    "extraPodSpec": {"terminationGracePeriodSeconds": 45, "mainContainer": {
                        "command": ["python3", "-m", "dynamo.frontend"],
                        "lifecycle": {"preStop": {"sleep": {"seconds": 5}}},
                    }},
                }}},
            }
        )
    )  # fmt: skip
    with pytest.raises(AssertionError, match="Frontend: grace 45 s < 50.0 s"):
        test_every_pod_has_time_to_drain_and_the_frontend_outlives_its_endpoints(graph)


def test_the_etcd_pair_uses_etcd_and_no_shared_volume():
    """The etcd example: both programs on etcd, pointed at the etcd Service the file defines
    (a one-replica StatefulSet), with the same namespace and TTL, and no ReadWriteMany volume."""
    path = DEPLOY / "frontend-worker-etcd.yaml"
    documents = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    launches = list(launches_in(path))
    assert {launch.program for launch in launches} == set(PROGRAM_SURFACES)
    (etcd,) = [d for d in documents if d["kind"] == "StatefulSet"]
    assert etcd["spec"]["replicas"] == 1
    services = {d["metadata"]["name"]: d for d in documents if d["kind"] == "Service"}
    client_port = next(
        p["port"]
        for p in services[etcd["spec"]["serviceName"]]["spec"]["ports"]
        if p["name"] == "client"
    )
    expected = f"http://{etcd['spec']['serviceName']}:{client_port}"
    for launch in launches:
        assert launch.env["DYN_DISCOVERY_BACKEND"] == "etcd", launch.where
        assert launch.env["ETCD_ENDPOINTS"] == expected, launch.where
        assert "DYN_DISCOVERY_DIR" not in launch.env, launch.where
    assert (
        len({(launch.env["DYN_NAMESPACE"], launch.env["DYN_DISCOVERY_TTL"]) for launch in launches})
        == 1
    )
    assert "ReadWriteMany" not in path.read_text(encoding="utf-8")
    assert "3-node" in path.read_text(encoding="utf-8")  # the production note


# --- probes: liveness from /live, readiness from /health ----------------------------------


def _probe_path(container: dict, kind: str) -> str | None:
    probe = container.get(kind) or {}
    return (probe.get("httpGet") or {}).get("path")


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: p.name)
def test_launchers_are_live_on_live_and_ready_on_health(path):
    """A liveness probe on /health would restart a worker in a long engine init, or a frontend
    waiting for its first model (503 there); /live answers 200 in every phase. Every frontend
    and worker container has both probes."""
    for launch in pod_launches_in(path):
        liveness = _probe_path(launch.container, "livenessProbe")
        readiness = _probe_path(launch.container, "readinessProbe")
        assert (liveness, readiness) == ("/live", "/health"), launch.where


def test_every_example_probes_both_launchers():
    programs = {
        launch.program
        for path in manifest_files()
        for launch in pod_launches_in(path)
        if _probe_path(launch.container, "livenessProbe") == "/live"
    }
    assert programs == {"dynamo.vllm", "dynamo.frontend"}
