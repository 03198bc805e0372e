"""Kubeconfig exec credential plugins, run by sdgruntime itself (no kubernetes package):
what a plugin is told, what it may answer, and every way it can fail, said clearly."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from sdgruntime.client import Client
from sdgruntime.rest.execplugin import ExecPlugin, ExecPluginError
from sdgruntime.rest.kubeconfig import KubeconfigError, RestConfig, kubeconfig_rest_config

ROOT = Path(__file__).resolve().parents[3]
V1 = "client.authentication.k8s.io/v1"


def plugin(tmp_path: Path, body: str, **exec_extra: Any) -> dict[str, Any]:
    """An exec stanza running ``body`` (Python; ``info`` is the request it was given)."""
    script = tmp_path / "plugin.py"
    script.write_text(
        "import json, os, sys\ninfo = json.loads(os.environ['KUBERNETES_EXEC_INFO'])\n" + body
    )
    return {
        "apiVersion": V1,
        "command": sys.executable,
        "args": [str(script)],
        "interactiveMode": "Never",
        **exec_extra,
    }


def answer(status: dict[str, Any], api_version: str = V1) -> str:
    doc = {"apiVersion": api_version, "kind": "ExecCredential", "status": status}
    return f"print(json.dumps({doc!r}))\n"


def kubeconfig(tmp_path: Path, exec_: dict[str, Any], **cluster: Any) -> Path:
    path = tmp_path / "config"
    path.write_text(
        yaml.safe_dump(
            {
                "clusters": [{"name": "c", "cluster": {"server": "https://h:6443", **cluster}}],
                "users": [{"name": "u", "user": {"exec": exec_}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


def test_a_token_plugin_is_run_at_load_and_told_it_is_not_interactive(tmp_path: Path) -> None:
    request = {"apiVersion": V1, "kind": "ExecCredential", "spec": {"interactive": False}}
    body = (
        f"assert info == {request!r}, info\n"
        "assert os.environ['FROM_KUBECONFIG'] == 'yes'\n"
        "assert sys.stdin.read() == ''\n"
    ) + answer({"token": "t-1"})
    exec_ = plugin(tmp_path, body, env=[{"name": "FROM_KUBECONFIG", "value": "yes"}])
    cfg = kubeconfig_rest_config(kubeconfig(tmp_path, exec_, **{"insecure-skip-tls-verify": True}))
    assert isinstance(cfg, RestConfig)
    assert cfg.authorization() == "Bearer t-1"
    assert not cfg.exec_due()  # no expiry: used until the server answers 401


def test_provide_cluster_info_sends_the_server_and_the_plugins_config(tmp_path: Path) -> None:
    body = (
        "c = info['spec']['cluster']\n"
        "assert c['server'] == 'https://h:6443' and c['insecure-skip-tls-verify'] is True, c\n"
        "assert c['config'] == {'audience': 'sdg'}, c\n"
    ) + answer({"token": "t"})
    exec_ = plugin(tmp_path, body, provideClusterInfo=True)
    ext = [{"name": "client.authentication.k8s.io/exec", "extension": {"audience": "sdg"}}]
    path = kubeconfig(tmp_path, exec_, **{"insecure-skip-tls-verify": True, "extensions": ext})
    assert kubeconfig_rest_config(path).authorization() == "Bearer t"


def test_an_expiring_credential_is_due_before_it_expires(tmp_path: Path) -> None:
    soon = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 5))
    later = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
    for stamp, due in ((soon, True), (later, False)):
        exec_ = plugin(tmp_path, answer({"token": "t", "expirationTimestamp": stamp}))
        cfg = kubeconfig_rest_config(kubeconfig(tmp_path, exec_))
        assert cfg.exec_due() is due, stamp  # renewed 10 s early


def test_a_client_certificate_is_written_for_ssl_to_load(tmp_path: Path) -> None:
    status = {"clientCertificateData": "CERT PEM", "clientKeyData": "KEY PEM"}
    cfg = kubeconfig_rest_config(kubeconfig(tmp_path, plugin(tmp_path, answer(status))))
    assert cfg.token is None and cfg.cert_file and cfg.key_file
    assert Path(cfg.cert_file).read_text() == "CERT PEM"
    assert Path(cfg.key_file).read_text() == "KEY PEM"


@pytest.mark.parametrize(
    ("body", "extra", "message"),
    [
        ("sys.exit(3)\n", {}, "exited 3"),
        ("sys.stderr.write('login first'); sys.exit(1)\n", {}, "exited 1: login first"),
        ("print('not json')\n", {}, "printed no JSON ExecCredential"),
        (answer({"token": "t"}, "client.authentication.k8s.io/v1beta1"), {}, "answered"),
        (answer({}), {}, "neither a token nor a client certificate"),
        (answer({"clientCertificateData": "c"}), {}, "without clientKeyData"),
        (answer({"token": "t", "expirationTimestamp": "soon"}), {}, "is not RFC 3339"),
        ("import time; time.sleep(30)\n", {"_timeout": 0.5}, "did not finish within"),
    ],
    ids=["exit", "stderr", "json", "version", "empty", "half-cert", "stamp", "hung"],
)
def test_a_failing_plugin_says_what_went_wrong(
    tmp_path: Path, body: str, extra: dict[str, Any], message: str
) -> None:
    exec_ = plugin(tmp_path, body)
    if "_timeout" in extra:
        with pytest.raises(ExecPluginError, match=message):
            ExecPlugin.parse(exec_, tmp_path, None).run(timeout=extra["_timeout"])
        return
    with pytest.raises(KubeconfigError, match=message):
        kubeconfig_rest_config(kubeconfig(tmp_path, exec_))


@pytest.mark.parametrize(
    ("exec_", "message"),
    [
        (
            {
                "apiVersion": V1,
                "command": "nope-not-installed",
                "interactiveMode": "Never",
                "installHint": "install nope from example.org",
            },
            "not found; install nope",
        ),
        ({"apiVersion": V1, "command": "x", "interactiveMode": "Always"}, "needs a terminal"),
        ({"apiVersion": V1, "command": "x"}, "required for client.authentication.k8s.io/v1"),
        ({"apiVersion": "v2", "command": "x"}, "apiVersion 'v2' is not supported"),
        ({"apiVersion": V1, "interactiveMode": "Never"}, "exec has no command"),
    ],
    ids=["not-found", "interactive", "no-mode", "version", "no-command"],
)
def test_a_misconfigured_plugin_is_refused_with_what_to_do(
    tmp_path: Path, exec_: dict[str, Any], message: str
) -> None:
    with pytest.raises(KubeconfigError, match=message):
        kubeconfig_rest_config(kubeconfig(tmp_path, exec_))


def test_a_relative_command_resolves_against_the_kubeconfigs_directory(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    tool = tmp_path / "bin" / "cred"
    doc = json.dumps({"apiVersion": V1, "kind": "ExecCredential", "status": {"token": "rel"}})
    tool.write_text(f"#!/bin/sh\necho '{doc}'\n")
    tool.chmod(0o755)
    exec_ = {"apiVersion": V1, "command": "./bin/cred", "interactiveMode": "Never"}
    assert kubeconfig_rest_config(kubeconfig(tmp_path, exec_)).authorization() == "Bearer rel"


@pytest.mark.anyio
async def test_the_client_reruns_an_expired_plugin_and_after_a_401(tmp_path: Path) -> None:
    counter = tmp_path / "n"
    counter.write_text("0")
    body = (
        f"p = __import__('pathlib').Path({str(counter)!r}); n = int(p.read_text()) + 1\n"
        "p.write_text(str(n))\n"
        "print(json.dumps({'apiVersion': info['apiVersion'], 'kind': 'ExecCredential',\n"
        "  'status': {'token': f'tok-{n}', 'expirationTimestamp': '2000-01-01T00:00:00Z'}}))\n"
    )
    path = kubeconfig(tmp_path, plugin(tmp_path, body), **{"insecure-skip-tls-verify": True})
    async with Client.from_kubeconfig(path, auth_refresh_interval=3600) as client:
        assert client._headers["Authorization"] == "Bearer tok-1"
        await client.refresh_auth()  # expired, and never renewed yet
        assert client._headers["Authorization"] == "Bearer tok-2"
        await client.refresh_auth()  # expired again, but at most once per refresh interval
        assert client._headers["Authorization"] == "Bearer tok-2"
        await client.refresh_auth(force=True)  # what a 401 answer triggers
        assert client._headers["Authorization"] == "Bearer tok-3"


def test_an_exec_client_loads_no_kubernetes_package(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path, plugin(tmp_path, answer({"token": "t"})))
    probe = (
        "import sys\nfrom sdgruntime.client import Client\n"
        f"Client.from_kubeconfig({str(path)!r})\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'kubernetes', 'requests'}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
