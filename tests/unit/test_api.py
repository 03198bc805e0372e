"""The SDG API: models, name rules, env table, conditions, and the CRD manifest agreeing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from api import constants as c
from api.conditions import (
    TRUNCATED_MARKER,
    cap_message,
    find_condition,
    is_condition_true,
    set_condition,
)
from api.envvars import env_var_for, parse_env_table
from api.pods import (
    delivered_devices,
    devices_annotation,
    devices_from_env,
    parse_devices_annotation,
)
from api.v1alpha1 import (
    SharedDeviceGroup,
    SharedDeviceGroupSpec,
    SharedDeviceGroupStatus,
    allows_host_access,
    format_ids,
    group_phase,
    group_pod_count,
    group_resources,
    group_strategy,
    is_bound,
    parse_ids,
    pod_list_update,
    pods_truncated,
    selected_devices,
)
from api.validation import (
    COUNT_TOO_LARGE,
    LABEL_KEY,
    MAX_RESOURCES,
    MAX_SUBDOMAIN_LEN,
    RESOURCE_NAME,
    is_dns_subdomain,
    is_label_key,
    is_label_value,
    is_resource_name,
    validate_spec,
)

CRD_PATH = Path(__file__).parents[2] / "config" / "crd" / "deviceshare.io_shareddevicegroups.yaml"


def test_kind_constant_names_the_cluster_scoped_resource() -> None:
    assert c.SDG_KIND.api_version == "deviceshare.io/v1alpha1"
    assert c.SDG_KIND.path(name="g") == "/apis/deviceshare.io/v1alpha1/shareddevicegroups/g"
    assert not c.SDG_KIND.namespaced


# --- models -----------------------------------------------------------------------------


def test_group_round_trips_camel_case_json() -> None:
    obj = {
        "apiVersion": "deviceshare.io/v1alpha1",
        "kind": "SharedDeviceGroup",
        "metadata": {"name": "g", "uid": "u1", "managedFields": [{"x": 1}]},
        "spec": {"resources": {"nvidia.com/gpu": 2}, "nodeSelector": {"gpu-type": "a100"}},
        "status": {
            "phase": "Bound",
            "nodeName": "n1",
            "selectedDevices": {"nvidia.com/gpu": "0,1"},
            "allocatedPods": ["ns/b", "ns/a"],
            "podCount": 2,
            "conditions": [
                {
                    "type": "Scheduled",
                    "status": "True",
                    "reason": "Bound",
                    "message": "bound to n1",
                    "lastTransitionTime": "2025-01-02T03:04:05Z",
                    "observedGeneration": 1,
                }
            ],
            "observedGeneration": 1,
        },
    }
    group = SharedDeviceGroup.from_dict(obj)
    assert group.spec.scheduling_strategy == "binpack"
    assert group.status is not None and group.status.allocated_pods == ["ns/a", "ns/b"]
    out = group.to_dict()
    assert out["spec"] == {
        "resources": {"nvidia.com/gpu": 2},
        "schedulingStrategy": "binpack",
        "nodeSelector": {"gpu-type": "a100"},
    }
    assert out["status"]["conditions"][0]["lastTransitionTime"] == "2025-01-02T03:04:05Z"
    assert out["status"]["selectedDevices"] == {"nvidia.com/gpu": "0,1"}
    assert out["metadata"]["managedFields"] == [{"x": 1}]  # unknown metadata kept verbatim


def test_spec_accepts_snake_case_names_in_python() -> None:
    spec = SharedDeviceGroupSpec(resources={"amd.com/gpu": 1}, scheduling_strategy="spread")
    assert spec.model_dump(exclude_none=True) == {
        "resources": {"amd.com/gpu": 1},
        "schedulingStrategy": "spread",
    }


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"resources": {}}, "at least one device resource"),
        ({"resources": {"nvidia.com/gpu": 0}}, "positive integer"),
        ({"resources": {"nvidia.com/gpu": -1}}, "positive integer"),
        ({"resources": {"nvidia.com/gpu": 1025}}, "at most 1024"),
        ({"resources": {"nvidia.com/gpu": True}}, "int"),
        ({"resources": {"nvidia.com/gpu": "2"}}, "int"),
        ({"resources": {"gpu": 1}}, "extended resource name"),
        ({"resources": {"Bad_Prefix.com/gpu": 1}}, "extended resource"),
        ({"resources": {"nvidia.com/gpu": 1}, "schedulingStrategy": "random"}, "binpack"),
        ({"resources": {"nvidia.com/gpu": 1}, "nodeSelector": {"a b": "x"}}, "label key"),
        ({"resources": {"nvidia.com/gpu": 1}, "allowHostAccess": "yes"}, "bool"),
    ],
)
def test_spec_rejects_invalid_input(spec: dict, fragment: str) -> None:
    with pytest.raises(ValidationError, match=fragment):
        SharedDeviceGroupSpec.model_validate(spec)


def test_status_normalises_device_lists_and_rejects_garbage() -> None:
    status = SharedDeviceGroupStatus.model_validate({"selectedDevices": {"x.io/d": "3, 1"}})
    assert status.selected_devices == {"x.io/d": "1,3"}
    with pytest.raises(ValidationError, match="not an integer"):
        SharedDeviceGroupStatus.model_validate({"selectedDevices": {"x.io/d": "a"}})
    with pytest.raises(ValidationError):
        SharedDeviceGroupStatus.model_validate({"phase": "Running"})


def test_dict_readers_tolerate_partial_objects() -> None:
    empty: dict = {}
    assert group_phase(empty) == "Pending"
    assert group_resources(empty) == {}
    assert group_strategy(empty) == "binpack"
    assert not is_bound({"status": {"phase": "Bound"}})  # no node: not really bound
    bound = {"status": {"phase": "Bound", "nodeName": "n", "selectedDevices": {"a.io/b": "1,0"}}}
    assert is_bound(bound)
    assert selected_devices(bound) == {"a.io/b": [0, 1]}


# --- ID lists ---------------------------------------------------------------------------


def test_format_and_parse_ids() -> None:
    assert format_ids([1, 0, 7]) == "0,1,7"
    assert format_ids([]) == ""
    assert parse_ids("0,1") == [0, 1]
    assert parse_ids(" 2 , 0 ") == [0, 2]
    assert parse_ids("") == []


@pytest.mark.parametrize("bad", ["0,,1", "a", "-1", "1,1", "0x1", "1.0", "²"])
def test_parse_ids_rejects_malformed(bad: str) -> None:
    with pytest.raises(ValueError, match=r"malformed|not an integer"):
        parse_ids(bad)
    with pytest.raises(ValueError, match=r"malformed|not an integer"):
        parse_ids(bad)  # parsed lists are remembered; a refusal is not


def test_parsed_ids_are_each_callers_own() -> None:
    """Short lists are remembered parsed, long ones not: either way each caller gets a list
    of its own, so one that changes it changes nothing the next one reads."""
    long = ",".join(str(i) for i in range(40))  # past the memo's length
    for text, want in (("3,1", [1, 3]), (long, list(range(40)))):
        first = parse_ids(text)
        first.append(99)
        assert parse_ids(text) == want
    annotation = '{"nvidia.com/gpu":"1,0"}'
    first_devices = parse_devices_annotation(annotation)
    assert first_devices is not None
    first_devices["nvidia.com/gpu"].append(7)
    first_devices["amd.com/gpu"] = [1]
    assert parse_devices_annotation(annotation) == {"nvidia.com/gpu": [0, 1]}
    assert parse_devices_annotation('{"nvidia.com/gpu":"1,1"}') is None
    assert parse_devices_annotation('{"nvidia.com/gpu":"1,1"}') is None


@pytest.mark.parametrize("bad", [[-1], [1, 1], [True]])
def test_format_ids_rejects_bad_ids(bad: list) -> None:
    with pytest.raises(ValueError):
        format_ids(bad)


# --- names ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["nvidia.com/gpu", "huawei.com/Ascend910", "amd.com/gpu", "a/b", "example.com/x_y.z-1"],
)
def test_resource_names_accepted(name: str) -> None:
    assert is_resource_name(name)
    assert validate_spec({"resources": {name: 1}}) == []


@pytest.mark.parametrize(
    "name",
    [
        "gpu",
        "cpu",
        "/gpu",
        "nvidia.com/",
        "Nvidia.com/gpu",
        "nvidia.com/gpu/x",
        "nvidia.com/-gpu",
        "nvidia..com/gpu",
        "nvidia.com/" + "g" * 64,
        "a" * 254 + "/gpu",
    ],
)
def test_resource_names_rejected(name: str) -> None:
    assert not is_resource_name(name)
    assert validate_spec({"resources": {name: 1}})


def test_label_and_subdomain_rules() -> None:
    assert is_label_key("gpu-type") and is_label_key("topology.kubernetes.io/zone")
    assert not is_label_key("a/b/c") and not is_label_key("-x")
    assert is_label_value("") and is_label_value("a100") and not is_label_value("a" * 64)
    assert is_dns_subdomain("my-gpu-group") and is_dns_subdomain("a.b")
    assert (
        not is_dns_subdomain("My_Group")
        and not is_dns_subdomain("")
        and not (is_dns_subdomain("a" * 254))
    )


def test_validate_spec_wants_allow_host_access_a_boolean() -> None:
    spec = {"resources": {"nvidia.com/gpu": 1}, "allowHostAccess": "yes"}
    assert validate_spec(spec) == [
        "spec.allowHostAccess: Invalid value: 'yes': must be true or false"
    ]
    assert validate_spec({**spec, "allowHostAccess": True}) == []
    group = {"spec": {**spec, "allowHostAccess": True}}
    assert allows_host_access(group) and not allows_host_access({"spec": spec})


def test_validate_spec_reports_every_problem() -> None:
    errors = validate_spec(
        {"resources": {"gpu": 0}, "schedulingStrategy": "x", "nodeSelector": {"k": "v v"}}
    )
    assert len(errors) == 4
    assert validate_spec(None) and validate_spec({"resources": None})


# --- env table --------------------------------------------------------------------------


def test_env_table_exact_and_glob_matches() -> None:
    assert env_var_for("nvidia.com/gpu") == "NVIDIA_VISIBLE_DEVICES"
    assert env_var_for("amd.com/gpu") == "AMD_VISIBLE_DEVICES"
    assert env_var_for("huawei.com/Ascend910") == "ASCEND_VISIBLE_DEVICES"
    assert env_var_for("huawei.com/ascend910") is None  # case-sensitive, as resource names
    assert env_var_for("intel.com/gpu") is None


def test_env_table_longest_glob_wins_regardless_of_order() -> None:
    table = {"x.io/*": "GENERIC", "x.io/fast*": "FAST", "x.io/fastest": "EXACT"}
    assert env_var_for("x.io/fast1", table) == "FAST"
    assert env_var_for("x.io/fastest", table) == "EXACT"
    assert env_var_for("x.io/slow", dict(reversed(table.items()))) == "GENERIC"


def test_parse_env_table_extends_defaults() -> None:
    table = parse_env_table(["intel.com/gpu=INTEL_VISIBLE_DEVICES", " amd.com/gpu = ROCR "])
    assert table["intel.com/gpu"] == "INTEL_VISIBLE_DEVICES"
    assert table["amd.com/gpu"] == "ROCR"
    assert table["nvidia.com/gpu"] == "NVIDIA_VISIBLE_DEVICES"
    for bad in ["nvidia.com/gpu", "=X", "a.io/b=1X", "a.io/b=X-Y"]:
        with pytest.raises(ValueError, match="--device-env"):
            parse_env_table([bad])


# --- conditions -------------------------------------------------------------------------


def test_set_condition_keeps_transition_time_while_status_unchanged() -> None:
    conds = set_condition(None, "Scheduled", "False", "Unschedulable", "no nodes", now="t1")
    conds = set_condition(conds, "Ready", "False", "NotReady", "", now="t1")
    again = set_condition(conds, "Scheduled", "False", "Unschedulable", "still", now="t2")
    assert find_condition(again, "Scheduled") == {
        "type": "Scheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "still",
        "lastTransitionTime": "t1",
    }
    flipped = set_condition(
        again, "Scheduled", "True", "Bound", "n1", observed_generation=3, now="t3"
    )
    cond = find_condition(flipped, "Scheduled")
    assert cond is not None and cond["lastTransitionTime"] == "t3"
    assert cond["observedGeneration"] == 3
    assert [x["type"] for x in flipped] == ["Scheduled", "Ready"]  # order kept
    assert is_condition_true(flipped, "Scheduled") and not is_condition_true(flipped, "Ready")
    assert conds[0]["status"] == "False"  # inputs untouched


def test_set_condition_caps_long_messages() -> None:
    long = "0/5000 nodes are available: " + ", ".join(f"1 reason {i}" for i in range(5000))
    (cond,) = set_condition(None, "Scheduled", "False", "Unschedulable", long, now="t")
    assert len(cond["message"]) == c.MAX_CONDITION_MESSAGE
    assert cond["message"].endswith(TRUNCATED_MARKER)
    assert long.startswith(cond["message"].removesuffix(TRUNCATED_MARKER))
    exact = "x" * c.MAX_CONDITION_MESSAGE
    assert set_condition(None, "Ready", "True", "Ready", exact, now="t")[0]["message"] == exact
    assert cap_message("short") == "short"
    assert cap_message("abcdef", limit=3) == "abc"  # no room for the marker


def test_set_condition_collapses_duplicate_types() -> None:
    dup = [{"type": "Ready", "status": "True"}, {"type": "Ready", "status": "False"}]
    out = set_condition(dup, "Ready", "True", "Ready", "", now="t")
    assert len(out) == 1


# --- the CRD manifest -------------------------------------------------------------------


def _crd() -> dict:
    return yaml.safe_load(CRD_PATH.read_text())


def test_crd_identity_and_printer_columns() -> None:
    crd = _crd()
    assert crd["metadata"]["name"] == "shareddevicegroups.deviceshare.io"
    spec = crd["spec"]
    assert spec["scope"] == "Cluster"
    assert spec["names"]["shortNames"] == ["sdg"]
    (version,) = spec["versions"]
    assert version["name"] == c.VERSION and version["subresources"] == {"status": {}}
    columns = {col["name"]: col for col in version["additionalPrinterColumns"]}
    assert [n for n, col in columns.items() if not col.get("priority")] == [
        "Phase",
        "Ready",
        "Node",
        "Devices",
        "Pods",
        "Age",
    ]
    assert columns["Pods"]["jsonPath"] == ".status.podCount"
    assert columns["Devices"]["jsonPath"] == ".status.deviceSummary"
    assert columns["Ready"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'


def test_crd_rules_use_the_python_patterns() -> None:
    schema = _crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]["properties"]
    rules = " ".join(r["rule"] for r in spec["resources"]["x-kubernetes-validations"])
    # In the YAML the regex is a CEL string literal, so each backslash is doubled.
    assert f"'^{RESOURCE_NAME}$'".replace("\\", "\\\\") in rules
    selector_rule = spec["nodeSelector"]["x-kubernetes-validations"][0]["rule"]
    assert f"'^{LABEL_KEY}$'".replace("\\", "\\\\") in selector_rule
    assert spec["resources"]["additionalProperties"]["minimum"] == 1
    assert spec["schedulingStrategy"]["enum"] == ["binpack", "spread"]
    assert spec["schedulingStrategy"]["default"] == "binpack"
    status = schema["properties"]["status"]["properties"]
    assert status["phase"]["enum"] == [c.PHASE_PENDING, c.PHASE_BOUND]
    for name in ("podCount", "allocatedPods", "selectedDevices", "conditions", "nodeName"):
        assert name in status


def test_crd_patterns_compile_as_python_regexes() -> None:
    schema = _crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    cond = schema["properties"]["status"]["properties"]["conditions"]["items"]["properties"]
    for const in (c.CONDITION_SCHEDULED, c.CONDITION_NODE_HEALTHY, c.CONDITION_READY):
        assert re.fullmatch(cond["type"]["pattern"].strip("^$"), const)
    for reason in (c.REASON_BOUND, c.REASON_UNSCHEDULABLE, c.REASON_NODE_NOT_READY):
        assert re.fullmatch(cond["reason"]["pattern"].strip("^$"), reason)


def test_crd_bounds_agree_with_the_constants() -> None:
    schema = _crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    resources = schema["properties"]["spec"]["properties"]["resources"]
    assert resources["additionalProperties"]["maximum"] == c.MAX_DEVICES_PER_RESOURCE
    assert resources["maxProperties"] == MAX_RESOURCES
    by_message = {r["message"]: r["rule"] for r in resources["x-kubernetes-validations"]}
    assert by_message[COUNT_TOO_LARGE] == f"self.all(k, self[k] <= {c.MAX_DEVICES_PER_RESOURCE})"
    status = schema["properties"]["status"]["properties"]
    assert status["allocatedPods"]["maxItems"] == c.MAX_ALLOCATED_PODS
    # namespace/name: a namespace is a DNS label (63), a pod name a DNS subdomain (253).
    assert status["allocatedPods"]["items"]["maxLength"] == 63 + 1 + MAX_SUBDOMAIN_LEN
    assert status["selectedDevices"]["maxProperties"] == MAX_RESOURCES
    all_ids = format_ids(range(c.MAX_DEVICES_PER_RESOURCE))
    assert status["selectedDevices"]["additionalProperties"]["maxLength"] >= len(all_ids)
    cond = status["conditions"]["items"]["properties"]
    # metav1.Condition's own bounds; our messages are cut well below the API's limit.
    assert cond["message"]["maxLength"] == 32768 >= c.MAX_CONDITION_MESSAGE
    assert (cond["reason"]["minLength"], cond["reason"]["maxLength"]) == (1, 1024)
    assert cond["type"]["maxLength"] == 316
    assert cond["status"]["enum"] == ["True", "False", "Unknown"]


def test_kustomization_lists_the_crd() -> None:
    kust = yaml.safe_load((CRD_PATH.parent / "kustomization.yaml").read_text())
    assert kust["resources"] == [CRD_PATH.name]


# --- status.allocatedPods bounds ----------------------------------------------------------


def test_pod_list_keeps_the_sorted_first_pods_and_an_exact_count() -> None:
    active = [f"ns/p{i:04d}" for i in range(1500)][::-1]
    update = pod_list_update([], 0, active)
    assert update.listed == sorted(active)[: c.MAX_ALLOCATED_PODS]
    assert update.count == 1500 and update.truncated
    assert update.joined == sorted(active) and update.left == []
    small = pod_list_update(["ns/a", "ns/b"], 2, ["ns/c", "ns/a", "ns/a"])
    assert (small.listed, small.count, small.joined, small.left) == (
        ["ns/a", "ns/c"],
        2,
        ["ns/c"],
        ["ns/b"],
    )
    assert not small.truncated


def test_pod_list_after_a_cut_list_reports_only_what_it_knows() -> None:
    # Before: 5 pods, the first 3 listed. After: p0 gone, p1a new (sorts inside the old
    # list), p9 sorts after it: it may have been there unlisted, so it is not "joined".
    before = ["ns/p0", "ns/p1", "ns/p2"]
    update = pod_list_update(before, 5, ["ns/p1", "ns/p1a", "ns/p2", "ns/p3", "ns/p9"], limit=3)
    assert update.listed == ["ns/p1", "ns/p1a", "ns/p2"] and update.count == 5
    assert update.joined == ["ns/p1a"] and update.left == ["ns/p0"]
    # A count above an empty list says nothing about any pod.
    assert pod_list_update([], 4, ["ns/a"]).joined == []


def test_pod_count_readers() -> None:
    listed = {"status": {"allocatedPods": ["ns/a", "ns/b"], "podCount": 1500}}
    assert group_pod_count(listed) == 1500 and pods_truncated(listed)
    exact = {"status": {"allocatedPods": ["ns/a"], "podCount": 1}}
    assert group_pod_count(exact) == 1 and not pods_truncated(exact)
    assert group_pod_count({"status": {"allocatedPods": ["ns/a"]}}) == 1
    assert group_pod_count({}) == 0 and not pods_truncated({})


def test_status_model_refuses_more_pods_than_the_crd() -> None:
    pods = [f"ns/p{i}" for i in range(c.MAX_ALLOCATED_PODS + 1)]
    with pytest.raises(ValidationError):
        SharedDeviceGroupStatus(allocated_pods=pods, pod_count=len(pods))
    ok = SharedDeviceGroupStatus(allocated_pods=pods[:-1], pod_count=len(pods))
    assert ok.pod_count == c.MAX_ALLOCATED_PODS + 1


# --- the devices a pod was given -------------------------------------------------------------


def _pod(annotations: dict[str, str] | None = None, env: list | None = None) -> dict:
    meta: dict = {"name": "p", "namespace": "ns"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": {"containers": [{"name": "a", "env": env or []}]}}


GPU_ENV = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0,1"}]


def test_devices_annotation_is_compact_sorted_json() -> None:
    assert devices_annotation({"nvidia.com/gpu": [1, 0], "amd.com/gpu": [3]}) == (
        '{"amd.com/gpu":"3","nvidia.com/gpu":"0,1"}'
    )
    assert parse_devices_annotation('{"nvidia.com/gpu":"1,0"}') == {"nvidia.com/gpu": [0, 1]}


def test_delivered_devices_reads_the_annotation_first() -> None:
    """Whatever the env says (UUIDs, void): the record names the IDs."""
    record = {c.DEVICES_ANNOTATION: '{"nvidia.com/gpu":"2,3"}'}
    void = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
    table = c.DEFAULT_ENV_TABLE
    assert delivered_devices(_pod(record, void), {"nvidia.com/gpu": 2}, table) == {
        "nvidia.com/gpu": [2, 3]
    }
    assert delivered_devices(_pod(record, GPU_ENV), {"nvidia.com/gpu": 2}, table) == {
        "nvidia.com/gpu": [2, 3]
    }
    # Returned whole: a pod given other resources than its group's now shows it.
    both = {c.DEVICES_ANNOTATION: '{"amd.com/gpu":"0","nvidia.com/gpu":"1"}'}
    assert delivered_devices(_pod(both), {"nvidia.com/gpu": 1}, table) == {
        "amd.com/gpu": [0],
        "nvidia.com/gpu": [1],
    }


@pytest.mark.parametrize(
    "value",
    ["", "0,1", "[]", '{"nvidia.com/gpu":[0,1]}', '{"nvidia.com/gpu":"0,x"}', '{"g":"1,1"}', "{"],
)
def test_a_malformed_record_gives_none_not_the_env(value: str) -> None:
    p = _pod({c.DEVICES_ANNOTATION: value}, GPU_ENV)
    assert delivered_devices(p, {"nvidia.com/gpu": 2}, c.DEFAULT_ENV_TABLE) is None


def test_pods_admitted_before_the_record_fall_back_to_env() -> None:
    table = c.DEFAULT_ENV_TABLE
    assert delivered_devices(_pod({}, GPU_ENV), {"nvidia.com/gpu": 2}, table) == {
        "nvidia.com/gpu": [0, 1]
    }
    assert delivered_devices(_pod(None, GPU_ENV), {"nvidia.com/gpu": 2}, table) == (
        devices_from_env(_pod(None, GPU_ENV), {"nvidia.com/gpu": 2}, table)
    )
    assert delivered_devices(_pod(None, []), {"nvidia.com/gpu": 2}, table) is None


def test_a_counts_mode_status_reads_its_counts() -> None:
    # --allocated-pods counts: the model keeps the per-namespace counts, names no pod.
    status = SharedDeviceGroupStatus.model_validate(
        {"podCount": 3, "allocatedPods": [], "allocatedPodCounts": {"ml": 2, "web": 1}}
    )
    assert status.allocated_pod_counts == {"ml": 2, "web": 1}
    assert status.allocated_pods == []
    assert SharedDeviceGroupStatus().allocated_pod_counts is None
