"""The manager caches slim pods and nodes (``api.pods.cached_pod``/``cached_node``): every
reader of a cached object must decide the same on the slim copy as on the whole object,
or the slimming dropped a field someone reads."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from api.constants import DEFAULT_ENV_TABLE
from api.pods import (
    cached_node,
    cached_pod,
    delivered_devices,
    index_by_group,
    index_by_node,
    is_active,
    pod_group,
    pod_key,
    pod_transform,
)
from controllers.foreign import device_use, is_shared
from controllers.holders import read_holder
from controllers.inventory import count_offer, node_offers
from controllers.placement import is_node_ready, node_device_capacity, unaddressable_devices
from controllers.podfit import host_ports, pod_fits_node, pod_requests
from controllers.podscheduler import wants_scheduling
from controllers.watches import node_changed

Obj = dict[str, Any]


def container(name: str, **extra: Any) -> Obj:
    """A container as the API server returns it: defaults, probes, mounts and all."""
    return {
        "name": name,
        "image": "nvcr.io/nvidia/pytorch:24.05-py3",
        "command": ["python", "train.py"],
        "args": ["--epochs", "10"],
        "imagePullPolicy": "IfNotPresent",
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "volumeMounts": [
            {
                "name": "kube-api-access-x7k2p",
                "readOnly": True,
                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
            }
        ],
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 10},
        "securityContext": {"allowPrivilegeEscalation": False},
        **extra,
    }


def full_pod(name: str, annotations: Obj, node: str | None = "gpu-1", **spec: Any) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"uid-{name}",
            "resourceVersion": "4711",
            "creationTimestamp": "2026-12-01T10:00:00Z",
            "labels": {"app": "train"},
            "annotations": annotations,
            "ownerReferences": [{"kind": "Job", "name": "train", "uid": "j1", "controller": True}],
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": {
            "nodeName": node,
            "schedulerName": "deviceshare-scheduler",
            "restartPolicy": "Never",
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "terminationGracePeriodSeconds": 30,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
            "priority": 0,
            "securityContext": {},
            "volumes": [
                {
                    "name": "kube-api-access-x7k2p",
                    "projected": {
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {"configMap": {"name": "kube-root-ca.crt"}},
                        ]
                    },
                }
            ],
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"},
                {"key": "deviceshare.io/mode", "operator": "Exists"},
            ],
            **spec,
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "hostIP": "10.0.0.7",
            "podIP": "10.244.1.9",
            "podIPs": [{"ip": "10.244.1.9"}],
            "startTime": "2026-12-01T10:00:01Z",
            "qosClass": "Burstable",
            "containerStatuses": [
                {
                    "name": "train",
                    "ready": True,
                    "restartCount": 0,
                    "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                    "imageID": "sha256:" + "0" * 64,
                    "containerID": "containerd://" + "1" * 64,
                    "state": {"running": {"startedAt": "2026-12-01T10:00:05Z"}},
                }
            ],
        },
    }


GPU_ENV = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0,1"}]
PODS = [
    # A group pod with the devices annotation, a sidecar init container and a host port.
    full_pod(
        "member",
        {"deviceshare.io/group": "g", "deviceshare.io/devices": '{"nvidia.com/gpu":"0,1"}'},
        containers=[
            container(
                "train",
                env=GPU_ENV,
                resources={"requests": {"cpu": "2", "memory": "8Gi"}},
                ports=[{"containerPort": 8080, "hostPort": 8080, "protocol": "TCP"}],
            )
        ],
        initContainers=[
            container("log", restartPolicy="Always", resources={"requests": {"cpu": "500m"}})
        ],
        nodeSelector={"deviceshare.io/mode": "shared"},
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                    ]
                }
            }
        },
        overhead={"cpu": "100m"},
    ),
    # A group pod admitted before the annotation existed: its devices are read from env.
    full_pod(
        "legacy",
        {"deviceshare.io/group": "g"},
        containers=[container("train", env=GPU_ENV)],
    ),
    # Pending and ours: the pod scheduler's input.
    full_pod(
        "pending",
        {"deviceshare.io/group": "g"},
        node=None,
        containers=[container("train", env=GPU_ENV)],
        schedulingGates=[],
    ),
    # Foreign device users: a device-plugin request, env from a ConfigMap, a CDI annotation.
    full_pod(
        "plugin",
        {},
        containers=[container("cuda", resources={"limits": {"nvidia.com/gpu": "1"}})],
    ),
    full_pod(
        "envfrom",
        {},
        containers=[
            container(
                "cuda",
                env=[{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": {}}}],
            )
        ],
    ),
    full_pod(
        "cdi",
        {"cdi-devices.nri.io/container.cuda": '["nvidia.com/gpu=1"]'},
        containers=[container("cuda")],
        ephemeralContainers=[container("debug", env=GPU_ENV)],
        resources={"requests": {"cpu": "1"}},
    ),
    # More ways to devices: envFrom a ConfigMap (no prefix) or a Secret (a prefix that can
    # still make NVIDIA_VISIBLE_DEVICES), DRA claims, a raw device node by annotation, a
    # MIG profile of the device plugin.
    full_pod(
        "configmap-env",
        {},
        containers=[
            container(
                "cuda",
                envFrom=[
                    {"configMapRef": {"name": "gpu-settings", "optional": True}},
                    {"prefix": "NVIDIA_", "secretRef": {"name": "s"}},
                    {"prefix": "APP_", "configMapRef": {"name": "app"}},
                ],
            )
        ],
    ),
    full_pod(
        "claims",
        {},
        containers=[container("cuda", resources={"claims": [{"name": "gpu"}]})],
        resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
    ),
    full_pod(
        "devnode",
        {"devices.noderesource.dev/container.cuda": "- path: /dev/nvidia3\n  type: c"},
        containers=[container("cuda")],
    ),
    full_pod(
        "mig",
        {},
        containers=[container("cuda", resources={"limits": {"nvidia.com/mig-1g.10gb": "1"}})],
    ),
    # SDG's holder pod: the kubelet's report of the devices it gave it.
    {
        **full_pod(
            "holder",
            {"deviceshare.io/holder-for": "g"},
            containers=[container("holder", resources={"limits": {"nvidia.com/gpu": "2"}})],
        ),
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "holder",
                    "image": "registry.k8s.io/pause:3.10.2",
                    "ready": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": "2026-12-02T00:00:00Z"}},
                    "allocatedResourcesStatus": [
                        {
                            "name": "nvidia.com/gpu",
                            "resources": [
                                {"resourceID": "3", "health": "Healthy"},
                                {"resourceID": "1", "health": "Healthy"},
                            ],
                        }
                    ],
                }
            ],
        },
    },
]
OFFERS = {"nvidia.com/gpu": count_offer("nvidia.com/gpu", 4)}
NODE: Obj = {
    "metadata": {"name": "gpu-1", "labels": {"deviceshare.io/mode": "shared", "zone": "a"}},
    "spec": {"taints": [{"key": "deviceshare.io/mode", "value": "shared", "effect": "NoSchedule"}]},
    "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"}},
}


@pytest.mark.parametrize("pod", PODS, ids=lambda p: p["metadata"]["name"])
def test_every_reader_decides_the_same_on_the_cached_copy(pod: Obj) -> None:
    slim = cached_pod(copy.deepcopy(pod))
    others = [cached_pod(copy.deepcopy(p)) for p in PODS if p is not pod]
    whole_others = [p for p in PODS if p is not pod]
    resources = {"nvidia.com/gpu": 2}
    for reader in (
        pod_key,
        pod_group,
        index_by_group,
        index_by_node,
        is_active,
        wants_scheduling,
        pod_requests,
        host_ports,
        lambda p: delivered_devices(p, resources, DEFAULT_ENV_TABLE),
        lambda p: device_use(p, DEFAULT_ENV_TABLE),
        lambda p: read_holder(p, OFFERS),
    ):
        assert reader(slim) == reader(pod)
    assert pod_fits_node(slim, NODE, others) == pod_fits_node(pod, NODE, whole_others)
    # An Event about the pod still names it exactly.
    for key in ("apiVersion", "kind"):
        assert slim[key] == pod[key]
    for key in ("name", "namespace", "uid", "resourceVersion"):
        assert slim["metadata"][key] == pod["metadata"][key]


def test_the_cached_copy_is_a_fraction_of_a_real_pod() -> None:
    pod = PODS[0]
    assert len(json.dumps(cached_pod(copy.deepcopy(pod)))) < len(json.dumps(pod)) / 2
    slim = cached_pod(copy.deepcopy(pod))
    assert "volumes" not in slim["spec"] and "containerStatuses" not in slim["status"]
    assert "managedFields" not in slim["metadata"]
    assert "image" not in slim["spec"]["containers"][0]


def test_pods_of_one_template_share_their_repeated_strings() -> None:
    """Thousands of cached pods of one template hold one copy of what they repeat (the
    namespace, node, group, env), which is most of the manager's memory per pod (S6)."""
    a, b = (json.loads(json.dumps(PODS[0])) for _ in range(2))  # separate strings
    b["metadata"].update(name="member-2", uid="uid-member-2", resourceVersion="43")
    one, two = cached_pod(a), cached_pod(b)
    assert one["metadata"]["namespace"] is two["metadata"]["namespace"]
    annotations = one["metadata"]["annotations"], two["metadata"]["annotations"]
    assert annotations[0]["deviceshare.io/group"] is annotations[1]["deviceshare.io/group"]
    assert one["spec"]["nodeName"] is two["spec"]["nodeName"]
    envs = [p["spec"]["containers"][0]["env"][0]["value"] for p in (one, two)]
    assert envs[0] is envs[1]
    assert one["status"]["phase"] is two["status"]["phase"]
    for key in ("name", "uid", "resourceVersion"):  # each pod's own, kept exactly
        assert one["metadata"][key] == PODS[0]["metadata"][key]
        assert two["metadata"][key] == b["metadata"][key]


def test_env_from_and_claims_are_kept_bounded_and_err_towards_counting() -> None:
    """Only what foreign detection reads; a pod with thousands of envFrom entries or
    claims costs a bounded copy, and whatever is cut can only add to what is counted."""
    many = [{"prefix": f"P{i}_", "configMapRef": {"name": f"cm{i}"}} for i in range(1000)]
    many.append({"prefix": "X" * 10_000, "secretRef": {"name": "s", "optional": True}})
    pod = full_pod(
        "many",
        {},
        containers=[container("c", envFrom=many)],
        resourceClaims=[{"name": f"c{i}", "resourceClaimName": f"rc{i}"} for i in range(500)],
    )
    slim = cached_pod(copy.deepcopy(pod))
    kept = slim["spec"]["containers"][0]["envFrom"]
    assert len(kept) == 16 and len(slim["spec"]["resourceClaims"]) == 16
    assert kept[0] == {"prefix": "P0_", "configMapRef": {"name": "cm0"}}
    # The last stands for the rest, without a prefix: it may set any device variable.
    assert kept[-1] == {"configMapRef": {"name": "..."}}
    assert device_use(pod, DEFAULT_ENV_TABLE) is not None  # the claims alone count
    use = device_use(slim, DEFAULT_ENV_TABLE)
    assert use is not None and use.env_from and use.claims
    # A long prefix is cut to a start of itself: it matches at least what it matched.
    long = full_pod("long", {}, containers=[container("c", envFrom=[many[-1]])])
    cut = cached_pod(copy.deepcopy(long))["spec"]["containers"][0]["envFrom"]
    assert cut == [{"prefix": "X" * 64, "secretRef": {"name": "s"}}]
    assert device_use(long, DEFAULT_ENV_TABLE) == device_use(cached_pod(long), DEFAULT_ENV_TABLE)


def test_malformed_parts_are_kept_for_readers_to_judge() -> None:
    odd: Obj = {"metadata": {"name": "x", "namespace": "n"}, "spec": "nonsense", "status": 3}
    assert cached_pod(copy.deepcopy(odd)) == {
        "metadata": {"name": "x", "namespace": "n"},
        "spec": "nonsense",
        "status": 3,
    }
    listy: Obj = {"metadata": {"name": "y"}, "spec": {"containers": ["bad", {"name": "c"}]}}
    assert cached_pod(copy.deepcopy(listy))["spec"]["containers"] == ["bad", {"name": "c"}]


def real_node(name: str, **labels: str) -> Obj:
    """A node as a kubelet reports it: images, addresses, nodeInfo, heartbeats and all."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": "99",
            "labels": {"deviceshare.io/mode": "shared", **labels},
            "annotations": {
                "deviceshare.io/devices.nvidia.com_gpu": "GPU-a,GPU-b",
                "node.alpha.kubernetes.io/ttl": "0",
            },
            "managedFields": [{"manager": "kubelet"}],
        },
        "spec": {
            "podCIDR": "10.244.1.0/24",
            "providerID": "kind://docker/gpu-1",
            "taints": [{"key": "deviceshare.io/mode", "value": "shared", "effect": "NoSchedule"}],
            "unschedulable": False,
        },
        "status": {
            "capacity": {"cpu": "8", "nvidia.com/gpu": "2", "pods": "110"},
            "allocatable": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "2", "pods": "110"},
            "conditions": [
                {"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-12-01T10:00:00Z"}
            ],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.7"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"kubeletVersion": "v1.37.2", "osImage": "Ubuntu 24.04"},
            "images": [
                {"names": [f"registry.example/image-{i}@sha256:{i:064d}"], "sizeBytes": 10**9}
                for i in range(40)
            ],
        },
    }


@pytest.mark.parametrize("node", [real_node("gpu-1", zone="a"), real_node("gpu-2", zone="b")])
def test_every_reader_of_a_node_decides_the_same_on_the_cached_copy(node: Obj) -> None:
    slim = cached_node(copy.deepcopy(node))
    for reader in (
        node_device_capacity,
        unaddressable_devices,
        is_node_ready,
        is_shared,
        node_offers,
        lambda n: node_changed.update(n, real_node("other")),
    ):
        assert reader(slim) == reader(node)
    for pod in PODS:
        slim_pod = cached_pod(copy.deepcopy(pod))
        assert pod_fits_node(slim_pod, slim, []) == pod_fits_node(pod, node, [])
    assert len(json.dumps(slim)) < len(json.dumps(node)) / 4
    assert "images" not in slim["status"] and "managedFields" not in slim["metadata"]


def test_a_pod_with_megabytes_of_env_and_annotations_is_cached_in_kilobytes() -> None:
    """Issue 19: what a pod's author controls (env, annotations) does not grow the
    manager's cache beyond what SDG reads: the device variables of its table, its own
    annotations and the device-injector's."""
    big = copy.deepcopy(PODS[0])
    filler = [{"name": f"APP_SETTING_{i}", "value": "x" * 1000} for i in range(1400)]
    device = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "0,1"}
    big["spec"]["containers"][0]["env"] = [*filler, device]
    big["metadata"]["annotations"] = {
        "kubectl.kubernetes.io/last-applied-configuration": "y" * 256_000,
        "deviceshare.io/group": "train",
        "cdi-devices.noderesource.dev/cuda": '["nvidia.com/gpu=0"]',
    }
    assert len(json.dumps(big)) > 1_400_000
    slim = cached_pod(copy.deepcopy(big))
    assert len(json.dumps(slim)) < 4096
    assert slim["spec"]["containers"][0]["env"] == [device]
    assert set(slim["metadata"]["annotations"]) == {
        "deviceshare.io/group",
        "cdi-devices.noderesource.dev/cuda",
    }
    assert device_use(slim, DEFAULT_ENV_TABLE) == device_use(big, DEFAULT_ENV_TABLE)
    # A --device-env table's own variable is kept by the manager's transform.
    custom = copy.deepcopy(big)
    custom["spec"]["containers"][0]["env"] = [*filler[:3], {"name": "FPGA_DEVICES", "value": "2"}]
    kept = pod_transform(["FPGA_DEVICES"])(custom)["spec"]["containers"][0]["env"]
    assert kept == [{"name": "FPGA_DEVICES", "value": "2"}]
