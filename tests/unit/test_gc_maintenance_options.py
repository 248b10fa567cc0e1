"""The serving-time maintenance's options on both launchers and the mock engine's growth knob:
what they accept, and the refusals that name flag and env var (exit 2, nothing applied).
The generic checks every option gets (bad values, env vs command line, help, docs) are
tests/unit/test_configuration.py's; these are the rules of these options in particular."""

from __future__ import annotations

import pytest

from dynamo.common.configuration import prerequisites
from dynamo.frontend import frontend_args
from dynamo.vllm import backend_args

MOCK = {"DYN_VLLM_ENGINE": "mock", "DYN_VLLM_MODEL": "/models/m"}


def worker(argv, env=None):
    return backend_args.parse_args(argv, {**MOCK, **(env or {})})


def frontend(argv, env=None):
    return frontend_args.parse_args(argv, dict(env or {}))


WORKER = pytest.param(worker, "", "DYN_VLLM_", id="worker")
FRONTEND = pytest.param(frontend, "dyn-", "DYN_", id="frontend")


def exits_2(capsys, parse, argv, env=None) -> str:
    with pytest.raises(SystemExit) as stopped:
        parse(argv, env)
    assert stopped.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("parse,flag,env", [WORKER, FRONTEND])
def test_off_by_default_and_both_ways_of_turning_it_on(parse, flag, env):
    config = parse([])
    assert (config.gc_maintenance, config.gc_pause_budget_ms) == ("off", 50.0)
    assert not config.maintenance.enabled
    config = parse([f"--{flag}gc-maintenance", "idle", f"--{flag}gc-pause-budget-ms", "20"])
    assert config.maintenance.enabled and config.maintenance.pause_budget_ms == 20.0
    config = parse([], {f"{env}GC_MAINTENANCE": "idle", f"{env}GC_PAUSE_BUDGET_MS": "0.5"})
    assert (config.gc_maintenance, config.gc_pause_budget_ms) == ("idle", 0.5)


def test_withdraw_is_the_workers_only():
    assert worker(["--gc-maintenance", "withdraw"]).gc_maintenance == "withdraw"


def test_the_frontend_has_no_peer_to_withdraw_to(capsys):
    err = exits_2(capsys, frontend, ["--dyn-gc-maintenance", "withdraw"])
    assert "--dyn-gc-maintenance / DYN_GC_MAINTENANCE" in err and "choose one of off, idle" in err


@pytest.mark.parametrize("parse,flag,env", [WORKER, FRONTEND])
@pytest.mark.parametrize("source", ["flags", "env"])
def test_maintenance_with_the_freeze_off_exits_2_naming_both_options(
    parse, flag, env, source, capsys
):
    if source == "flags":
        argv, given = [f"--{flag}gc-maintenance", "idle", f"--no-{flag}freeze-gc-heap"], {}
    else:
        argv, given = [], {f"{env}GC_MAINTENANCE": "idle", f"{env}FREEZE_GC_HEAP": "0"}
    err = exits_2(capsys, parse, argv, given)
    for named in (
        f"--{flag}gc-maintenance / {env}GC_MAINTENANCE",
        f"--{flag}freeze-gc-heap / {env}FREEZE_GC_HEAP",
    ):
        assert named in err, err
    assert "needs the start-up GC freeze" in err


@pytest.mark.parametrize("parse,flag,env", [WORKER, FRONTEND])
@pytest.mark.parametrize("value", ["0", "0.0", "-0", "-5", "nan", "inf", "1e309", "abc"])
def test_a_budget_not_positive_and_finite_exits_2_naming_flag_and_env_var(
    parse, flag, env, value, capsys
):
    for argv, given in (
        ([f"--{flag}gc-maintenance", "idle", f"--{flag}gc-pause-budget-ms", value], {}),
        ([f"--{flag}gc-maintenance", "idle"], {f"{env}GC_PAUSE_BUDGET_MS": value}),
    ):
        err = exits_2(capsys, parse, argv, given)
        assert f"--{flag}gc-pause-budget-ms / {env}GC_PAUSE_BUDGET_MS" in err and repr(value) in err


@pytest.mark.parametrize("parse,flag,env", [WORKER, FRONTEND])
def test_a_budget_without_maintenance_follows_the_prerequisites_rule(parse, flag, env, capsys):
    err = exits_2(capsys, parse, [f"--{flag}gc-pause-budget-ms", "20"])
    assert f"--{flag}gc-pause-budget-ms / {env}GC_PAUSE_BUDGET_MS acts only with" in err
    assert f"--{flag}gc-maintenance / {env}GC_MAINTENANCE" in err
    # Through its env var only: the process starts, and one WARNING says it is ignored.
    given = {f"{env}GC_PAUSE_BUDGET_MS": "20"}
    config = parse([], given)
    module = backend_args if parse is worker else frontend_args
    (line,) = prerequisites.env_warnings(module.REQUIREMENTS, config, [], given)
    assert f"{env}GC_PAUSE_BUDGET_MS is set in the environment without it and is ignored" in line


def test_the_growth_knob_and_its_evictions():
    config = worker(["--mock-heap-growth", "100", "--mock-heap-evict-percent", "25"])
    assert (config.mock_heap_growth, config.mock_heap_evict_percent) == (100, 25)
    assert worker([]).mock_heap_growth == 0


@pytest.mark.parametrize(
    "argv,named",
    [
        (["--mock-heap-growth", "-1"], "--mock-heap-growth / DYN_VLLM_MOCK_HEAP_GROWTH"),
        (["--mock-heap-growth", "1e3"], "--mock-heap-growth / DYN_VLLM_MOCK_HEAP_GROWTH"),
        (
            ["--mock-heap-growth", "10", "--mock-heap-evict-percent", "101"],
            "--mock-heap-evict-percent / DYN_VLLM_MOCK_HEAP_EVICT_PERCENT",
        ),
        (
            ["--mock-heap-evict-percent", "10"],  # evicting nothing grown
            "--mock-heap-evict-percent / DYN_VLLM_MOCK_HEAP_EVICT_PERCENT acts only with "
            "--mock-heap-growth / DYN_VLLM_MOCK_HEAP_GROWTH above 0",
        ),
    ],
)
def test_bad_growth_values_exit_2_naming_flag_and_env_var(argv, named, capsys):
    assert named in exits_2(capsys, worker, argv)


def test_the_growth_knob_is_the_mock_engines(capsys):
    env = {"DYN_VLLM_MODEL": "/models/m"}
    with pytest.raises(SystemExit) as stopped:
        backend_args.parse_args(["--mock-heap-growth", "10"], env)
    assert stopped.value.code == 2
    assert "acts only with --engine / DYN_VLLM_ENGINE mock" in capsys.readouterr().err
