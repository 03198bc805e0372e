"""``sdg doctor --pre``'s judges on hand-made objects: the server version, runtimes and
their handlers, CDI/NRI as far as the API shows them, DRA drivers' slices, and the
delivery ``choose_delivery`` picks per node. The real API server's answers are in
tests/e2e/test_doctor_pre.py."""

from __future__ import annotations

from typing import Any

from cli.doctor.facts import PreFacts, Unreadable
from cli.doctor.judge import (
    exit_code,
    judge_cdi_nri,
    judge_dra_drivers,
    judge_pre,
    judge_runtime,
    judge_version,
)
from tests import factories
from tests.factories import GPU, resource_slice

Obj = dict[str, Any]


def node(
    name: str,
    gpus: int = 1,
    *,
    shared: bool = True,
    runtime: str = "containerd://2.4.2",
    handlers: tuple[str, ...] = ("", "runc"),
    labels: dict[str, str] | None = None,
) -> Obj:
    """A node with its kubelet's facts: versions and runtime handlers."""
    obj = factories.node(
        name,
        {GPU: gpus} if gpus else None,
        shared=shared,
        labels=labels,
        allocatable={"cpu": "8"},
        ready=None,
    )
    obj["status"]["nodeInfo"] = {"kubeletVersion": "v1.37.2", "containerRuntimeVersion": runtime}
    obj["status"]["runtimeHandlers"] = [{"name": h} for h in handlers]
    return obj


def rslice(node_name: str, n: int, driver: str = "gpu.nvidia.com") -> Obj:
    """``n`` GPUs as NVIDIA's DRA driver publishes them: uuid, type and PCI bus ID."""
    devices = [
        {
            "name": f"gpu-{i}",
            "attributes": {
                "type": {"string": "gpu"},
                "uuid": {"string": f"GPU-{i}"},
                "resource.kubernetes.io/pciBusID": {"string": f"0000:0{i}:00.0"},
            },
        }
        for i in range(n)
    ]
    return resource_slice(node_name, devices, driver=driver, slices=1)


RC = {"metadata": {"name": "nvidia"}, "handler": "nvidia"}


def test_version() -> None:
    ok = judge_version({"gitVersion": "v1.37.2", "major": "1", "minor": "37"})
    assert ok.ok is True
    assert ok.detail == "v1.37.2 (SDG needs 1.30+; DRA's resource.k8s.io/v1 is served from 1.34)"
    eks = judge_version({"gitVersion": "v1.31.4-eks-2d5f260"})
    assert eks.ok is True and "no DRA resource.k8s.io/v1 before 1.34" in eks.detail
    old = judge_version({"gitVersion": "v1.29.9"})
    assert old.ok is False and "SDG needs 1.30+" in old.detail
    assert old.fix == "upgrade the cluster to Kubernetes 1.30 or later"
    assert judge_version({"gitVersion": "weird"}).ok is None
    denied = judge_version(Unreadable("403 Forbidden"))
    assert denied.ok is False and "cannot read the server version" in denied.detail


def test_runtime_handlers() -> None:
    listed = judge_runtime(node("a", handlers=("", "runc", "nvidia")))
    assert listed.ok is True
    assert listed.detail == (
        'containerd://2.4.2, kubelet v1.37.2; status.runtimeHandlers: "" (default), runc, nvidia'
    )
    none = judge_runtime(node("b", runtime="containerd://1.7.20", handlers=()))
    assert none.ok is None and "no status.runtimeHandlers" in none.detail
    assert none.fix.startswith("kubectl label node b deviceshare.io/delivery=runtimeclass")


def test_cdi_nri_says_what_the_api_cannot_show() -> None:
    new = judge_cdi_nri(node("a"))
    assert new.ok is True
    assert "containerd 2.x: CDI and NRI are on by default" in new.detail
    assert "not visible from the API" in new.detail and "device-injector" in new.detail
    cdi = {"deviceshare.io/delivery": "cdi"}
    old = judge_cdi_nri(node("b", runtime="containerd://1.7.20", labels=cdi))
    assert old.ok is None and "off by default" in old.detail and old.fix
    ancient = judge_cdi_nri(node("c", runtime="containerd://1.6.20", labels=cdi))
    assert ancient.ok is False and "no CDI, no NRI" in ancient.detail
    # Not labelled cdi: an old runtime only informs.
    assert judge_cdi_nri(node("c", runtime="containerd://1.6.20")).ok is True
    dra = judge_cdi_nri(node("d", runtime="containerd://1.7.20"), [rslice("d", 2)])
    assert "a DRA driver publishes devices here, so CDI works" in dra.detail


def test_dra_drivers_per_node_counts() -> None:
    slices = [rslice("a", 8), rslice("b", 4), rslice("a", 2, "gpu.example.com")]
    check = judge_dra_drivers(slices)
    assert check.ok is True
    assert check.detail == (
        "devices per node: gpu.example.com (not read by SDG: --dra-drivers): a 2; "
        "gpu.nvidia.com -> nvidia.com/gpu: a 8, b 4"
    )
    assert "not served" in judge_dra_drivers(None).detail
    assert "no ResourceSlice" in judge_dra_drivers([]).detail
    assert judge_dra_drivers(Unreadable("403 Forbidden")).ok is None


def test_pre_shows_each_shared_node_and_its_delivery() -> None:
    """RuntimeClass nvidia exists: a node listing handler nvidia gets runtimeclass; one
    that does not is env, unverified (a warning naming what settles it)."""
    facts = PreFacts(
        version={"gitVersion": "v1.37.2"},
        nodes=[
            node("a", handlers=("", "nvidia")),
            node("b"),
            node("plain", shared=False),
        ],
        slices=[rslice("a", 2)],
        runtime_class=RC,
    )
    checks = {c.name: c for c in judge_pre(facts)}
    assert list(checks) == [
        "Kubernetes version",
        "shared nodes",
        "DRA drivers",
        "node a: runtime",
        "node a: CDI/NRI",
        "node a: devices",
        "node a: delivery",
        "node b: runtime",
        "node b: CDI/NRI",
        "node b: devices",
        "node b: delivery",
        "RuntimeClass",
    ]
    assert checks["node a: delivery"].ok is True
    assert checks["node a: delivery"].detail.startswith("runtimeclass (")
    assert checks["node b: delivery"].ok is None
    assert checks["node b: delivery"].detail.startswith("env, unverified: ")
    assert "nvidia.com/gpu: 2 from ResourceSlice" in checks["node a: devices"].detail
    assert exit_code(checks.values()) == 0


def test_pre_before_any_label_shows_nodes_with_devices() -> None:
    facts = PreFacts(
        version={"gitVersion": "v1.37.2"},
        nodes=[node("gpu", shared=False), node("cpu", gpus=0, shared=False)],
        runtime_class=None,
    )
    checks = {c.name: c for c in judge_pre(facts)}
    assert checks["shared nodes"].ok is None
    assert "shown below: the nodes with devices (gpu)" in checks["shared nodes"].detail
    assert checks["shared nodes"].fix == "kubectl label node gpu deviceshare.io/mode=shared"
    assert "node gpu: delivery" in checks and "node cpu: runtime" not in checks
    rc = checks["RuntimeClass"]
    assert rc.ok is True and "does not exist, so delivery auto chooses it on no node" in rc.detail


def test_pre_fails_on_an_old_server() -> None:
    checks = judge_pre(PreFacts(version={"gitVersion": "v1.28.0"}, nodes=[node("a")]))
    assert exit_code(checks) == 1
