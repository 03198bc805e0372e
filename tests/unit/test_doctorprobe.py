"""``sdg doctor --probe``'s pure half: the script a probe container runs (run here by a
real ``sh``), its report parsed, and what was seen judged against what the group holds.
The probe on a real kubelet node is in tests/realnode/test_doctor_probe.py."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

import pytest

from cli import main as cli
from cli.doctor.probe import (
    CONTAINER,
    Held,
    ProbeOptions,
    Seen,
    held_of,
    judge_seen,
    parse_report,
    probe_group,
    probe_pod,
    probe_resource,
    probe_script,
)
from controllers.inventory import Device, Offer

GPU = "nvidia.com/gpu"
ENV = "NVIDIA_VISIBLE_DEVICES"
HELD = Held(
    node="gpu-1",
    group="sdg-doctor-probe-ab12",
    resource=GPU,
    env_var=ENV,
    ids=("3",),
    uuids=("GPU-ddd",),
    told="GPU-ddd",
    delivery="env",
)


def run_script(env: dict[str, str]) -> str:
    sh = shutil.which("sh")
    assert sh, "no sh on this machine"
    out = subprocess.run(
        [sh, "-c", probe_script([ENV, "AMD_VISIBLE_DEVICES"])],
        capture_output=True,
        text=True,
        env={"PATH": "/nonexistent", **env},
        check=True,
        timeout=10,
    )
    return out.stdout


def test_script_reports_set_empty_and_unset_variables() -> None:
    """A variable set empty (delivery cdi's "no device") is told apart from one unset."""
    seen = parse_report(run_script({ENV: ""}))
    assert seen.complete
    assert seen.env == {ENV: "", "AMD_VISIBLE_DEVICES": None}
    assert seen.smi is None  # no nvidia-smi on this PATH
    seen = parse_report(run_script({ENV: "GPU-a,GPU-b"}))
    assert seen.env[ENV] == "GPU-a,GPU-b"


def test_script_refuses_a_bad_variable_name() -> None:
    with pytest.raises(ValueError, match="not an environment variable name"):
        probe_script(["X; rm -rf /"])


def test_parse_report_dev_and_nvidia_smi() -> None:
    log = (
        "=== env\nNVIDIA_VISIBLE_DEVICES=GPU-ddd\n=== dev\n/dev/nvidia3\n/dev/nvidiactl\n"
        "=== nvidia-smi\nGPU 0: NVIDIA A100 (UUID: GPU-ddd)\n=== end\n"
    )
    seen = parse_report(log)
    assert seen.dev == ("/dev/nvidia3", "/dev/nvidiactl")
    assert seen.smi == ("GPU 0: NVIDIA A100 (UUID: GPU-ddd)",)
    assert not parse_report("=== env\nNVIDIA_VISIBLE_DEVICES=x\n").complete


def test_env_only_exact_is_a_warning_naming_the_device() -> None:
    """The variable alone proves what the runtime was told, not that it acted."""
    check = judge_seen(HELD, Seen(env={ENV: "GPU-ddd"}))
    assert check.ok is None
    assert 'NVIDIA_VISIBLE_DEVICES="GPU-ddd" names exactly nvidia.com/gpu GPU-ddd (ID 3)' in (
        check.detail
    )
    assert "nothing shows that the runtime acted on it" in check.detail
    # by index where no UUID is known
    by_index = Held(node="n", group="g", resource=GPU, env_var=ENV, ids=("0", "1"))
    assert judge_seen(by_index, Seen(env={ENV: "1,0"})).ok is None


@pytest.mark.parametrize(
    ("value", "seen_text"),
    [
        ("", 'no device (NVIDIA_VISIBLE_DEVICES=""'),
        (None, "no device (NVIDIA_VISIBLE_DEVICES unset"),
        ("void", "no device"),
        ("all", 'NVIDIA_VISIBLE_DEVICES="all"'),
        ("GPU-aaa", 'NVIDIA_VISIBLE_DEVICES="GPU-aaa"'),
        ("GPU-ddd,GPU-aaa", 'NVIDIA_VISIBLE_DEVICES="GPU-ddd,GPU-aaa"'),
    ],
)
def test_env_mismatch_fails_naming_node_expected_and_seen(
    value: str | None, seen_text: str
) -> None:
    check = judge_seen(HELD, Seen(env={ENV: value}))
    assert check.ok is False, check
    assert check.detail.startswith(
        "node gpu-1: expected nvidia.com/gpu GPU-ddd (ID 3); the container sees "
    ), check.detail
    assert seen_text in check.detail
    assert "kubectl label node gpu-1 deviceshare.io/delivery=" in check.fix


def test_nvidia_smi_decides() -> None:
    ok = judge_seen(HELD, Seen(env={ENV: "GPU-ddd"}, smi=("GPU 0: A100 (UUID: GPU-ddd)",)))
    assert ok.ok is True and "nvidia-smi -L lists exactly" in ok.detail
    two = Seen(
        env={ENV: "GPU-ddd"},
        smi=("GPU 0: A100 (UUID: GPU-aaa)", "GPU 1: A100 (UUID: GPU-ddd)"),
    )
    bad = judge_seen(HELD, two)
    assert bad.ok is False and "sees GPU-aaa, GPU-ddd (nvidia-smi -L" in bad.detail
    none = judge_seen(HELD, Seen(env={ENV: "GPU-ddd"}, smi=("No devices were found",)))
    assert none.ok is False and "sees no GPU" in none.detail


def test_device_nodes_are_counted() -> None:
    one = Seen(env={ENV: "GPU-ddd"}, dev=("/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"))
    check = judge_seen(HELD, one)
    assert check.ok is True and "1 device(s)" in check.detail
    two = Seen(env={ENV: "GPU-ddd"}, dev=("/dev/nvidia0", "/dev/nvidia1"))
    bad = judge_seen(HELD, two)
    assert bad.ok is False and "2 device node(s) /dev/nvidia0, /dev/nvidia1" in bad.detail
    # a device node with the variable naming another GPU is no match either
    other = judge_seen(HELD, Seen(env={ENV: "GPU-aaa"}, dev=("/dev/nvidia0",)))
    assert other.ok is False


def test_cdi_that_reaches_the_container_passes() -> None:
    """Under cdi the variable is empty by design; the device node is the evidence."""
    cdi = Held(node="gpu-1", group="g", resource=GPU, env_var=ENV, ids=("3",), uuids=("GPU-ddd",))
    check = judge_seen(cdi, Seen(env={ENV: ""}, dev=("/dev/nvidia3", "/dev/nvidiactl")))
    assert check.ok is True, check


def test_cut_short_report_fails() -> None:
    check = judge_seen(HELD, Seen(env={ENV: "GPU-ddd"}, complete=False))
    assert check.ok is False and "cut short" in check.detail


def test_held_of_reads_status_and_the_admitted_pod() -> None:
    group = {
        "metadata": {"name": "g"},
        "status": {
            "phase": "Bound",
            "nodeName": "gpu-1",
            "selectedDevices": {GPU: "3"},
            "physicalDevices": {GPU: "GPU-ddd"},
        },
    }
    pod: dict[str, Any] = {
        "metadata": {
            "annotations": {"cdi-devices.noderesource.dev/container.probe": '["nvidia.com/gpu=3"]'}
        },
        "spec": {"containers": [{"name": CONTAINER, "env": [{"name": ENV}]}]},
    }
    held = held_of(group, pod, GPU, ENV)
    assert (held.node, held.ids, held.uuids, held.told) == ("gpu-1", ("3",), ("GPU-ddd",), "")
    assert held.delivery.startswith("cdi (cdi-devices.noderesource.dev/container.probe")
    group["status"].pop("physicalDevices")
    assert held_of(group, pod, GPU, ENV).uuids is None


def test_probe_objects() -> None:
    g = probe_group("sdg-doctor-probe-1", GPU, "host-1")
    assert g["spec"] == {
        "resources": {GPU: 1},
        "nodeSelector": {"kubernetes.io/hostname": "host-1"},
    }
    p = probe_pod("p", "sdg-doctor-probe-1", "busybox:1.36", "Never", [ENV])
    assert p["metadata"]["annotations"] == {"deviceshare.io/group": "sdg-doctor-probe-1"}
    (c,) = p["spec"]["containers"]
    assert (c["image"], c["imagePullPolicy"]) == ("busybox:1.36", "Never")
    assert p["spec"]["restartPolicy"] == "Never"
    assert p["spec"]["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }


def test_probe_resource_prefers_nvidia() -> None:
    def offer(res: str, n: int) -> Offer:
        return Offer(res, "count", tuple(Device(i) for i in range(n)))

    table = {GPU: ENV, "amd.com/gpu": "AMD_VISIBLE_DEVICES"}
    offers = {"amd.com/gpu": offer("amd.com/gpu", 1), GPU: offer(GPU, 2)}
    assert probe_resource(offers, table) == GPU
    assert probe_resource({"amd.com/gpu": offers["amd.com/gpu"]}, table) == "amd.com/gpu"
    assert probe_resource({GPU: offer(GPU, 0)}, table) is None
    assert probe_resource({"example.com/x": offer("example.com/x", 1)}, table) is None


def test_options_and_flags_refuse_bad_values(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="expected one of Always, IfNotPresent, Never"):
        ProbeOptions(pull_policy="Sometimes")
    with pytest.raises(ValueError, match="at most 1800 seconds"):
        ProbeOptions(timeout=4000)
    for argv, message in (
        (["doctor", "--probe", "--probe-timeout", "0"], "give more than 0 and at most 1800"),
        (["doctor", "--probe", "--probe-timeout", "soon"], "'soon' is not a number of seconds"),
        (["doctor", "--pre", "--probe"], "not allowed with argument"),
        (["doctor", "--probe", "--probe-image-pull-policy", "Sometimes"], "invalid choice"),
    ):
        with pytest.raises(SystemExit) as exit_:
            cli._parser().parse_args(argv)
        assert exit_.value.code == 2
        assert message in capsys.readouterr().err, argv
