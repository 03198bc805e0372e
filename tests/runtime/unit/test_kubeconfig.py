"""sdgruntime's own kubeconfig and in-cluster reader (sdgruntime.rest.kubeconfig), and that
a process using the client does not import the ``kubernetes`` package unless a kubeconfig
user needs it (auth-providers): that package's import costs ~32 MiB of RSS.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from sdgruntime.client import Client
from sdgruntime.rest.config import (
    RestConfig,
    authorization,
    incluster_configuration,
    kubeconfig_configuration,
)
from sdgruntime.rest.kubeconfig import (
    KubeconfigError,
    NeedsKubernetesPackage,
    incluster_rest_config,
    kubeconfig_rest_config,
)
from sdgruntime.securemetrics import self_signed_pair

ROOT = Path(__file__).resolve().parents[3]


def _pair(cn: str) -> tuple[bytes, bytes]:
    """A self-signed certificate and key, valid a day."""
    return self_signed_pair([cn], days=1)


@pytest.fixture(scope="module")
def pem() -> tuple[bytes, bytes]:
    return _pair("kubeconfig-test")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _write(path: Path, doc: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc))
    return path


def _config(
    clusters: dict[str, dict[str, Any]],
    users: dict[str, dict[str, Any]],
    contexts: dict[str, dict[str, Any]],
    current: str | None = None,
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": n, "cluster": c} for n, c in clusters.items()],
        "users": [{"name": n, "user": u} for n, u in users.items()],
        "contexts": [{"name": n, "context": c} for n, c in contexts.items()],
    }
    if current:
        doc["current-context"] = current
    return doc


def _simple(user: dict[str, Any], cluster: dict[str, Any] | None = None) -> dict[str, Any]:
    return _config(
        {"c": {"server": "https://10.0.0.1:6443", **(cluster or {})}},
        {"u": user},
        {"ctx": {"cluster": "c", "user": "u", "namespace": "team-a"}},
        "ctx",
    )


# --- contexts --------------------------------------------------------------------------


def test_current_context_or_the_named_one(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "config",
        _config(
            {"one": {"server": "https://one:6443/"}, "two": {"server": "http://two:8080"}},
            {"a": {"token": "tok-a"}, "b": {"token": "tok-b"}},
            {"first": {"cluster": "one", "user": "a"}, "second": {"cluster": "two", "user": "b"}},
            "first",
        ),
    )
    first = kubeconfig_rest_config(path)
    assert (first.host, first.token, first.namespace) == ("https://one:6443", "tok-a", None)
    second = kubeconfig_rest_config(path, "second")
    assert (second.host, second.token) == ("http://two:8080", "tok-b")
    assert authorization(second) == "Bearer tok-b"
    with pytest.raises(KubeconfigError, match=r"no context 'third' \(contexts: first, second\)"):
        kubeconfig_rest_config(path, "third")


def test_no_current_context_asks_for_one(tmp_path: Path) -> None:
    doc = _simple({"token": "t"})
    del doc["current-context"]
    path = _write(tmp_path / "config", doc)
    with pytest.raises(KubeconfigError, match="no current-context"):
        kubeconfig_rest_config(path)
    assert kubeconfig_rest_config(path, "ctx").namespace == "team-a"


def test_several_files_merge_like_the_kubernetes_package(tmp_path: Path) -> None:
    """First file wins for a name; the last current-context wins; missing files are skipped."""
    a = _write(
        tmp_path / "a" / "config",
        _config(
            {"c": {"server": "https://a:1"}},
            {"u": {"token": "from-a"}},
            {"x": {"cluster": "c", "user": "u"}},
            "x",
        ),
    )
    b = _write(
        tmp_path / "b" / "config",
        _config(
            {"c": {"server": "https://b:1"}, "d": {"server": "https://d:1"}},
            {"u": {"token": "from-b"}},
            {"y": {"cluster": "d", "user": "u"}},
            "y",
        ),
    )
    spec = os.pathsep.join([str(a), str(tmp_path / "missing"), str(b)])
    got = kubeconfig_rest_config(spec)
    assert (got.host, got.token) == ("https://d:1", "from-a")
    assert kubeconfig_rest_config(spec, "x").host == "https://a:1"
    with pytest.raises(KubeconfigError, match="no kubeconfig file found"):
        kubeconfig_rest_config(str(tmp_path / "missing"))


# --- inline data vs files --------------------------------------------------------------


def test_relative_files_resolve_against_the_kubeconfig_directory(
    tmp_path: Path, pem: tuple[bytes, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = pem
    kdir = tmp_path / "kube"
    (kdir / "pki").mkdir(parents=True)
    (kdir / "pki" / "ca.crt").write_bytes(cert)
    (kdir / "pki" / "me.crt").write_bytes(cert)
    (kdir / "pki" / "me.key").write_bytes(key)
    path = _write(
        kdir / "config",
        _simple(
            {"client-certificate": "pki/me.crt", "client-key": "pki/me.key"},
            {"certificate-authority": "pki/ca.crt", "tls-server-name": "api.example"},
        ),
    )
    monkeypatch.chdir(tmp_path)  # not the kubeconfig's directory
    got = kubeconfig_rest_config(path)
    assert got.ca_file == str(kdir / "pki" / "ca.crt")
    assert (got.cert_file, got.key_file) == (
        str(kdir / "pki" / "me.crt"),
        str(kdir / "pki" / "me.key"),
    )
    assert got.tls_server_name == "api.example"
    assert got.authorization() is None


def test_inline_data_wins_and_goes_to_private_files(
    tmp_path: Path, pem: tuple[bytes, bytes]
) -> None:
    cert, key = pem
    path = _write(
        tmp_path / "config",
        _simple(
            {
                "client-certificate-data": _b64(cert),
                "client-key-data": _b64(key),
                "client-certificate": "does-not-exist.crt",
            },
            {"certificate-authority-data": _b64(cert), "certificate-authority": "nope.crt"},
        ),
    )
    got = kubeconfig_rest_config(path)
    assert got.ca_file and got.cert_file and got.key_file
    assert Path(got.ca_file).read_bytes() == cert
    assert Path(got.cert_file).read_bytes() == cert
    assert Path(got.key_file).read_bytes() == key
    assert stat.S_IMODE(os.stat(got.key_file).st_mode) == 0o600
    ssl.create_default_context(cafile=got.ca_file).load_cert_chain(got.cert_file, got.key_file)


def test_http_server_ignores_certificates_and_insecure_skips_verification(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "config",
        _config(
            {
                "plain": {"server": "http://h:8080", "certificate-authority": "missing.crt"},
                "insecure": {"server": "https://h:6443", "insecure-skip-tls-verify": True},
            },
            {"u": {"username": "admin", "password": "pw"}},
            {"plain": {"cluster": "plain", "user": "u"}, "insecure": {"cluster": "insecure"}},
            "plain",
        ),
    )
    plain = kubeconfig_rest_config(path)
    assert plain.ca_file is None and plain.verify
    assert plain.authorization() == "Basic " + _b64(b"admin:pw")
    insecure = kubeconfig_rest_config(path, "insecure")
    assert not insecure.verify and insecure.authorization() is None


# --- tokens ----------------------------------------------------------------------------


def test_token_wins_over_token_file(tmp_path: Path) -> None:
    (tmp_path / "tok").write_text("from-file\n")
    path = _write(tmp_path / "config", _simple({"token": "inline", "tokenFile": "tok"}))
    got = kubeconfig_rest_config(path)
    assert (got.token, got.token_file) == ("inline", None)


@pytest.mark.anyio
async def test_token_file_is_read_relative_and_re_read_when_rotated(tmp_path: Path) -> None:
    token = tmp_path / "secrets" / "token"
    token.parent.mkdir()
    token.write_text("one\n")
    path = _write(tmp_path / "config", _simple({"tokenFile": "secrets/token"}))
    cfg = kubeconfig_configuration(path)
    assert isinstance(cfg, RestConfig)
    assert cfg.token_file == str(token) and cfg.token == "one"
    async with Client(cfg, auth_refresh_interval=0) as client:
        assert client._headers["Authorization"] == "Bearer one"
        token.write_text("two")
        await client.refresh_auth()  # not due: read a moment ago
        assert client._headers["Authorization"] == "Bearer one"
        await client.refresh_auth(force=True)  # a 401 answer
        assert client._headers["Authorization"] == "Bearer two"
        token.write_text("three")
        cfg.token_period = 0  # the period has passed
        await client.refresh_auth()
        assert client._headers["Authorization"] == "Bearer three"
        token.unlink()  # a failed re-read keeps the token in use
        await client.refresh_auth(force=True)
        assert client._headers["Authorization"] == "Bearer three"


def test_missing_or_empty_token_file_is_an_error(tmp_path: Path) -> None:
    path = _write(tmp_path / "config", _simple({"tokenFile": "absent"}))
    with pytest.raises(KubeconfigError, match="cannot read token file"):
        kubeconfig_rest_config(path)
    (tmp_path / "absent").write_text("\n")
    with pytest.raises(KubeconfigError, match="is empty"):
        kubeconfig_rest_config(path)


# --- what is missing gives a clear error -----------------------------------------------


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (_config({"c": {}}, {}, {"x": {"cluster": "c"}}, "x"), "its cluster has no server"),
        (_config({}, {}, {"x": {"cluster": "c"}}, "x"), "names cluster 'c', which is not defined"),
        (_config({}, {}, {"x": {}}, "x"), "context 'x' names no cluster"),
        (
            _config({"c": {"server": "https://h"}}, {}, {"x": {"cluster": "c", "user": "u"}}, "x"),
            "names user 'u', which is not defined",
        ),
        (
            _simple({}, {"certificate-authority": "missing.crt"}),
            "certificate-authority .*missing.crt does not exist",
        ),
        ({"clusters": [{"cluster": {}}]}, "an entry of clusters has no name"),
        ({"clusters": {"c": {}}}, "clusters is not a list"),
        (["not", "a", "mapping"], "is not a mapping"),
    ],
)
def test_unusable_kubeconfigs_say_why(tmp_path: Path, doc: Any, message: str) -> None:
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(KubeconfigError, match=message):
        kubeconfig_configuration(path)


def test_empty_kubeconfig_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "config").write_text("")
    with pytest.raises(KubeconfigError, match="is empty"):
        kubeconfig_configuration(tmp_path / "config")


# --- auth-providers: the kubernetes package; exec plugins: our own -----------------------


def _exec_user(tmp_path: Path) -> dict[str, Any]:
    script = tmp_path / "plugin.py"
    script.write_text(
        "import json\n"
        "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1beta1',\n"
        "  'kind': 'ExecCredential', 'status': {'token': 'exec-token'}}))\n"
    )
    return {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": sys.executable,
            "args": [str(script)],
        }
    }


def _two_users(tmp_path: Path, current: str) -> Path:
    return _write(
        tmp_path / "config",
        _config(
            {"c": {"server": "https://h:6443", "insecure-skip-tls-verify": True}},
            {"ex": _exec_user(tmp_path), "ap": {"auth-provider": {"name": "custom"}, "token": "t"}},
            {"ex": {"cluster": "c", "user": "ex"}, "ap": {"cluster": "c", "user": "ap"}},
            current,
        ),
    )


def test_exec_users_are_ours_and_auth_providers_fall_back_to_kubernetes(tmp_path: Path) -> None:
    path = _two_users(tmp_path, "ex")
    assert kubeconfig_rest_config(path).authorization() == "Bearer exec-token"
    with pytest.raises(NeedsKubernetesPackage, match="auth-provider"):
        kubeconfig_rest_config(path, "ap")
    import kubernetes.client

    cfg = kubeconfig_configuration(path, "ap")
    assert isinstance(cfg, kubernetes.client.Configuration)
    assert authorization(cfg) == "Bearer t"
    assert cfg.refresh_api_key_hook is not None


def test_only_an_auth_provider_client_imports_kubernetes(tmp_path: Path) -> None:
    path = _two_users(tmp_path, "ex")
    probe = (
        "import sys\n"
        "import sdgruntime.manager, sdgruntime.securemetrics, sdgruntime.webhook.server\n"
        "from sdgruntime.client import Client\n"
        f"Client.from_kubeconfig({str(path)!r}, sys.argv[1])\n"
        "heavy = ('kubernetes', 'requests', 'urllib3', 'oauthlib', 'websocket')\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & set(heavy)))\n"
    )

    def loaded(context: str) -> list[str]:
        out = subprocess.run(
            [sys.executable, "-c", probe, context],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        result: list[str] = json.loads(out.stdout.strip().replace("'", '"'))
        return result

    assert loaded("ex") == []
    assert "kubernetes" in loaded("ap")


# --- in-cluster ------------------------------------------------------------------------


def _service_account(tmp_path: Path, token: str = "sa-token\n") -> Path:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text(token)
    (sa / "ca.crt").write_bytes(_pair("cluster-ca")[0])
    (sa / "namespace").write_text("deviceshare-system")
    return sa


def test_in_cluster_reads_the_service_account(tmp_path: Path) -> None:
    sa = _service_account(tmp_path)
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    got = incluster_rest_config(env, sa)
    assert got.host == "https://10.96.0.1:443"
    assert (got.ca_file, got.token_file) == (str(sa / "ca.crt"), str(sa / "token"))
    assert (got.authorization(), got.namespace) == ("Bearer sa-token", "deviceshare-system")
    assert not got.token_due()
    assert got.token_due(got._token_read_at + 60)  # type: ignore[operator]
    v6 = incluster_rest_config({**env, "KUBERNETES_SERVICE_HOST": "fd00::1"}, sa)
    assert v6.host == "https://[fd00::1]:443"


@pytest.mark.parametrize(
    ("env", "remove", "message"),
    [
        ({}, None, "not in a cluster"),
        ({"KUBERNETES_SERVICE_HOST": "", "KUBERNETES_SERVICE_PORT": "443"}, None, "set but empty"),
        ({"KUBERNETES_SERVICE_HOST": "h", "KUBERNETES_SERVICE_PORT": "1"}, "token", "token file"),
        ({"KUBERNETES_SERVICE_HOST": "h", "KUBERNETES_SERVICE_PORT": "1"}, "ca.crt", "CA file"),
    ],
)
def test_in_cluster_errors(
    tmp_path: Path, env: dict[str, str], remove: str | None, message: str
) -> None:
    sa = _service_account(tmp_path)
    if remove:
        (sa / remove).unlink()
    with pytest.raises(KubeconfigError, match=message):
        incluster_rest_config(env, sa)


def test_incluster_configuration_outside_a_cluster_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubeconfigError, match="not in a cluster"):
        incluster_configuration()
