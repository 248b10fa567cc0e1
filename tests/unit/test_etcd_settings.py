"""etcd settings: the endpoint list, credentials from the environment, what is readable where."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dynamo.runtime.discovery import DiscoverySettings, open_discovery
from dynamo.runtime.discovery.etcd_backend import EtcdDiscovery
from dynamo.runtime.discovery.etcd_client import EtcdCredentials, EtcdSettingsError
from dynamo.runtime.discovery.etcd_endpoints import EtcdEndpoint, parse_endpoints


def test_endpoints_are_parsed_in_order_with_the_default_port():
    assert parse_endpoints("http://a:1, b ,http://[::1]:2,10.0.0.1:2379,b") == (
        EtcdEndpoint("a", 1),
        EtcdEndpoint("b", 2379),
        EtcdEndpoint("::1", 2),
        EtcdEndpoint("10.0.0.1", 2379),
    )
    assert parse_endpoints("http://[::1]:2")[0].target == "[::1]:2"


@pytest.mark.parametrize(
    "text,reason",
    [
        ("", "empty endpoint"),
        ("http://a:1,", "empty endpoint"),
        ("https://a:1", "TLS (https) is not supported"),
        ("unix:///run/etcd.sock", "scheme must be http"),
        ("http://a:1/v3", "no path"),
        ("http://u:p@a:1", "credentials do not belong in the URL"),
        ("http://a:0", "port must be between 1 and 65535"),
        ("http://a:70000", "port must be between 1 and 65535"),
        ("http://a:１２", "port must be"),
        ("http://" + "x" * 64 + ":1", "not a valid host name"),
        ("http://bad_host:1", "not a valid host name"),
        ("http://:1", "has no host"),
        # What the Host kind refuses, refused here too: resolvers read these as IPv4 addresses.
        ("http://1.2.3:2379", "no top-level domain is numeric"),
        ("0x7f.1:2379", "no top-level domain is numeric"),
        ("http://999.1.1.1:2379", "no top-level domain is numeric"),
        # urlsplit drops a tab or newline inside a URL; it would quietly mean "localhost".
        ("http://loc\nalhost:2379", "control characters"),
        ("http://local\thost:2379", "control characters"),
        ("http://a:1\x00", "control characters"),
    ],
)
def test_malformed_endpoints_say_why(text, reason):
    with pytest.raises(ValueError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        parse_endpoints(text)


def test_a_password_never_shows_in_a_repr_or_a_description():
    credentials = EtcdCredentials.from_env(
        {"ETCD_AUTH_USERNAME": "dyn", "ETCD_AUTH_PASSWORD": "s3cret"}
    )
    backend = EtcdDiscovery(parse_endpoints("http://a:1"), "ns", credentials)
    assert "s3cret" not in repr(credentials) + repr(backend) + backend.describe()
    assert "dyn" in backend.describe()


@pytest.mark.parametrize(
    "env,message",
    [
        ({"ETCD_AUTH_USERNAME": "u"}, "ETCD_AUTH_PASSWORD is not set"),
        ({"ETCD_AUTH_PASSWORD": "p"}, "ETCD_AUTH_USERNAME is not set"),
        ({"ETCD_AUTH_CLIENT_CERT": "/c"}, "ETCD_AUTH_CLIENT_CERT set, but"),
    ],
)
def test_credentials_that_cannot_work_are_refused(env, message):
    with pytest.raises(EtcdSettingsError, match=message):
        EtcdCredentials.from_env(env)


@pytest.mark.parametrize(
    "endpoints,beyond",
    [
        ("http://127.0.0.1:2379", False),
        ("http://localhost:2379,http://[::1]:2379", False),
        ("http://127.0.0.1:2379,http://etcd.svc:2379", True),
        ("http://10.1.2.3:2379", True),
    ],
)
def test_etcd_is_readable_beyond_this_host_unless_every_endpoint_is_loopback(endpoints, beyond):
    backend = EtcdDiscovery(parse_endpoints(endpoints), "ns")
    assert (backend.readable_beyond_host() is not None) is beyond


def test_the_backend_follows_the_option(tmp_path):
    settings = DiscoverySettings(
        backend="file", directory=str(tmp_path), ttl_s=7.0, etcd_endpoints=(), namespace="n"
    )
    file_store = open_discovery(settings)
    assert (file_store.backend, file_store.registration().interval_s) == ("file", 7.0 / 5)
    etcd_settings = replace(settings, backend="etcd", etcd_endpoints=parse_endpoints("http://a:1"))
    backend = open_discovery(etcd_settings)
    assert (backend.backend, backend.prefix) == ("etcd", "dynamo-gc/n/models/")
    assert backend.registration().lease_ttl_s == 7


@pytest.mark.parametrize("program", ["dynamo.frontend", "dynamo.vllm"])
def test_a_namespace_with_a_trailing_newline_is_the_same_namespace(program):
    """A ConfigMap's trailing newline is forgiven as for every option: without it, "dyn\n"
    became a key prefix of its own, and the frontend and its workers never met."""
    from dynamo.frontend import frontend_args
    from dynamo.vllm import backend_args

    parse = frontend_args.parse_args if program == "dynamo.frontend" else backend_args.parse_args
    extra = ["--engine", "mock", "--model", "/tmp"] if program == "dynamo.vllm" else []
    assert parse(extra, {"DYN_NAMESPACE": "dyn\n"}).namespace == "dyn"
    assert parse([*extra, "--namespace= dyn\t"], {}).namespace == "dyn"


@pytest.mark.parametrize("text", ["a\nb", "dyn\n\n x", "dyn\x00", "a/b", ""])
def test_a_namespace_with_a_character_inside_it_that_no_key_should_hold_exits_2(text, capsys):
    from dynamo.frontend import frontend_args

    with pytest.raises(SystemExit) as exc:
        frontend_args.parse_args([], {"DYN_NAMESPACE": text})
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--namespace" in err and "DYN_NAMESPACE" in err and "Traceback" not in err
