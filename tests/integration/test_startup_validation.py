"""Start-up options that used to fail late or silently (issue 19, item 9), as an operator meets
them: the real launchers exit 2 at once naming the flag and the env var, before anything is
logged, frozen or announced; an option whose prerequisite is missing exits 2 when it is a flag
and is ignored with one WARNING naming both when it comes from the environment."""

from __future__ import annotations

import socket
import threading

import pytest

from dynamo_gc.configuration.values import MAX_WAIT_S
from tests.support.processes import start_frontend, start_worker

pytestmark = pytest.mark.integration

NOT_UTF8 = "model-\udcff"  # the byte 0xff, as Python hands it over from argv and environ
STARTED = ("Worker options", "Frontend starting", "GC heap frozen", "Serving phase", "Traceback")
REGISTERED_LINE = r"Model registered: model=(\S+)"


def assert_exit_2_naming(process, *names: str) -> str:
    code = process.exit_code(deadline_s=60)
    output = process.log()
    assert code == 2, output
    for name in names:
        assert name in output, output
    for line in STARTED:
        assert line not in output, output  # nothing ran: not even logging
    return output


def worker(tmp_path, *args: str, env=None):
    return start_worker("worker", tmp_path, tmp_path / "discovery", "m", *args, env=env)


# --- values that are not UTF-8: a traceback and exit 1 before -----------------------------


def test_a_non_utf8_flag_value_exits_2_naming_the_option(tmp_path):
    process = worker(tmp_path, "--served-model-name", NOT_UTF8)
    assert_exit_2_naming(
        process, "--served-model-name / DYN_VLLM_SERVED_MODEL_NAME", "not valid UTF-8"
    )


def test_a_non_utf8_env_value_exits_2_naming_the_option(tmp_path):
    process = start_worker(
        "worker", tmp_path, tmp_path / "discovery", None,
        env={"DYN_VLLM_SERVED_MODEL_NAME": NOT_UTF8},
    )  # fmt: skip
    assert_exit_2_naming(
        process, "--served-model-name / DYN_VLLM_SERVED_MODEL_NAME", "not valid UTF-8"
    )


def test_a_non_utf8_boolean_env_value_of_the_frontend_exits_2(tmp_path):
    process = start_frontend(
        "frontend", tmp_path, tmp_path / "discovery", env={"DYN_FREEZE_GC_HEAP": "\udcff"}
    )
    assert_exit_2_naming(process, "--dyn-freeze-gc-heap / DYN_FREEZE_GC_HEAP", "not valid UTF-8")


def test_a_non_utf8_argument_for_vllm_exits_2_before_vllm_is_imported(tmp_path):
    # Not one of the worker's options: named by the flag it follows.
    process = start_worker(
        "worker", tmp_path, tmp_path / "discovery", None,
        "--engine", "vllm", "--tokenizer", NOT_UTF8,
    )  # fmt: skip
    assert_exit_2_naming(process, "--tokenizer", "not valid UTF-8")


@pytest.mark.parametrize("name", ["ETCD_AUTH_USERNAME", "ETCD_AUTH_PASSWORD"])
def test_non_utf8_etcd_credentials_exit_2_without_echoing_them(tmp_path, name):
    env = {"ETCD_AUTH_USERNAME": "user", "ETCD_AUTH_PASSWORD": "secret-pw", name: "x\udcff"}
    process = start_frontend("frontend", tmp_path, None, "--discovery-backend", "etcd", env=env)
    output = assert_exit_2_naming(process, f"{name} is not valid UTF-8")
    assert "secret-pw" not in output and "x\\udcff" not in output


# --- durations beyond what threading can wait ----------------------------------------------


def test_a_freeze_interval_beyond_threading_timeout_max_exits_2(tmp_path):
    too_long = f"{threading.TIMEOUT_MAX * 2:g}"
    process = worker(
        tmp_path, "--self-benchmark-points", "5", "--fpm-gc-policy", "freeze",
        "--fpm-gc-freeze-interval-s", too_long,
    )  # fmt: skip
    output = assert_exit_2_naming(
        process, "--fpm-gc-freeze-interval-s / DYN_FPM_GC_FREEZE_INTERVAL_S", too_long
    )
    assert f"must be between 1 and {int(MAX_WAIT_S)}" in output  # the bound, as a whole number


@pytest.mark.parametrize("flag", ["--drain-timeout", "--mock-token-ms", "--gc-pause-log-ms"])
def test_every_duration_is_bounded_by_what_threading_accepts(tmp_path, flag):
    process = worker(tmp_path, flag, "1e300")
    assert_exit_2_naming(process, flag, "must be between")


# --- a worker extension that cannot be imported --------------------------------------------


@pytest.mark.parametrize(
    "name, reason",
    [("no_such_package.module.Extension", "No module named"), ("json.dumps", "not a class")],
)
def test_a_worker_extension_that_cannot_be_imported_exits_2(tmp_path, name, reason):
    process = worker(tmp_path, "--worker-extension-cls", name)
    assert_exit_2_naming(process, "--worker-extension-cls / DYN_VLLM_WORKER_EXTENSION_CLS", reason)


# --- a chat template that does not compile -------------------------------------------------


@pytest.mark.parametrize(
    "source",
    ["{% for m in messages %}{{ m.content }", "{{ messages | no_such_filter }}", "{% endif %}"],
)
def test_a_chat_template_that_does_not_compile_exits_2(tmp_path, source):
    template = tmp_path / "broken.jinja"
    template.write_text(source, encoding="utf-8")
    process = worker(tmp_path, "--chat-template", str(template))
    assert_exit_2_naming(
        process, "--chat-template / DYN_VLLM_CHAT_TEMPLATE", str(template), "does not compile"
    )
    assert not (tmp_path / "discovery").exists() or not any((tmp_path / "discovery").iterdir())


# --- options that act only with another ----------------------------------------------------


@pytest.mark.parametrize(
    "args, option, prerequisite",
    [
        (["--debug-gc-endpoint"], "--debug-gc-endpoint", "--system-port / DYN_SYSTEM_PORT"),
        (["--system-host", "127.0.0.1"], "--system-host", "--system-port / DYN_SYSTEM_PORT"),
        (["--fpm-gc-policy", "freeze"], "--fpm-gc-policy", "--self-benchmark-points"),
        (["--self-benchmark-output", "x.jsonl"], "--self-benchmark-output",
         "--self-benchmark-points"),
        (["--self-benchmark-points", "3", "--fpm-gc-freeze-interval-s", "5"],
         "--fpm-gc-freeze-interval-s", "--fpm-gc-policy / DYN_FPM_GC_POLICY freeze"),
        (["--discovery-backend", "etcd"], "--discovery-dir", "DYN_DISCOVERY_BACKEND file"),
        (["--namespace", "other"], "--namespace", "DYN_DISCOVERY_BACKEND etcd"),
    ],
)  # fmt: skip
def test_a_flag_whose_prerequisite_is_missing_exits_2_naming_both(
    tmp_path, args, option, prerequisite
):
    assert_exit_2_naming(worker(tmp_path, *args), option, prerequisite)


def test_a_mock_option_with_the_vllm_engine_exits_2_before_vllm_is_imported(tmp_path):
    process = start_worker(
        "worker", tmp_path, tmp_path / "discovery", None,
        "--engine", "vllm", "--mock-token-ms", "3",
    )  # fmt: skip
    assert_exit_2_naming(
        process, "--mock-token-ms / DYN_VLLM_MOCK_TOKEN_MS", "--engine / DYN_VLLM_ENGINE mock"
    )


def test_the_frontend_refuses_an_etcd_flag_with_the_file_backend(tmp_path):
    process = start_frontend(
        "frontend", tmp_path, tmp_path / "discovery", "--etcd-endpoints", "http://127.0.0.1:2379"
    )
    assert_exit_2_naming(process, "--etcd-endpoints / ETCD_ENDPOINTS", "DYN_DISCOVERY_BACKEND etcd")


def test_an_env_var_whose_prerequisite_is_missing_is_one_warning_naming_both(tmp_path):
    process = worker(tmp_path, env={"DYN_VLLM_DEBUG_GC_ENDPOINT": "1", "DYN_NAMESPACE": "x"})
    try:
        process.wait_for_log(REGISTERED_LINE, deadline_s=60)
        output = process.log()
        warnings = [line for line in output.splitlines() if " WARNING " in line]
        for option, prerequisite in [
            ("--debug-gc-endpoint / DYN_VLLM_DEBUG_GC_ENDPOINT", "--system-port"),
            ("--namespace / DYN_NAMESPACE", "--discovery-backend"),
        ]:
            named = [line for line in warnings if option in line and prerequisite in line]
            assert len(named) == 1, output
    finally:
        assert process.stop() == 0


# --- a listener that cannot bind: before the freeze and before "serving" --------------------


@pytest.mark.parametrize(
    "program, flag, label",
    [
        ("frontend", "--http-port", "--http-port / DYN_HTTP_PORT"),
        ("worker", "--request-plane-port", "--request-plane-port / DYN_VLLM_REQUEST_PLANE_PORT"),
        ("worker", "--system-port", "--system-port / DYN_SYSTEM_PORT"),
    ],
)
def test_a_taken_port_fails_before_the_freeze_and_before_serving_is_logged(
    tmp_path, program, flag, label
):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        if program == "frontend":
            # start_frontend's own --http-port 0 comes first: the later one wins
            process = start_frontend("frontend", tmp_path, tmp_path / "discovery", flag, port)
        else:
            extra = ["--system-host", "127.0.0.1"] if flag == "--system-port" else []
            process = worker(tmp_path, *extra, flag, port)
        # The option's value cannot be used here, found at the earliest point that can know
        # (the bind): exit 2 naming the flag and the env var, as for any bad input.
        assert process.exit_code(deadline_s=60) == 2
    output = process.log()
    errors = [line for line in output.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and label in errors[0] and port in errors[0], output
    for line in ("GC heap frozen", "Serving phase", "serving model", "listening on", "Traceback"):
        assert line not in output, output


# --- usage errors: the error line first and alone ------------------------------------------


@pytest.mark.parametrize("program", ["frontend", "worker"])
def test_a_usage_error_is_not_hidden_below_the_usage_text(tmp_path, program):
    """argparse printed 30 lines of usage before the one line that says what is wrong."""
    if program == "frontend":
        process = start_frontend("frontend", tmp_path, tmp_path / "discovery", "--no-such-flag")
    else:
        process = worker(tmp_path, "--no-such-flag")
    output = assert_exit_2_naming(process, "--no-such-flag")
    lines = output.splitlines()
    prog = f"python -m dynamo.{'frontend' if program == 'frontend' else 'vllm'}"
    assert lines[0] == f"{prog}: error: unrecognized arguments: --no-such-flag", output
    assert lines[1:] == [f"(run {prog} --help for the options)"], output
