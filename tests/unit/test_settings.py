"""Manager flags, their SDG_* environment equivalents, and clear startup errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from controllers.settings import CONTROLLERS, Settings, parse, parser


def test_defaults() -> None:
    s = parse([], environ={})
    assert s.metrics_bind_address == ":8080"
    assert s.health_probe_bind_address == ":8081"
    assert s.webhook_port == 9443
    assert s.leader_elect is False
    assert s.scheduler_name == "deviceshare-scheduler"
    assert s.namespace == "deviceshare-system"
    assert s.env_table()["nvidia.com/gpu"] == "NVIDIA_VISIBLE_DEVICES"


def test_flags_win_over_env_which_win_over_defaults() -> None:
    env = {"SDG_WEBHOOK_PORT": "9000", "SDG_LOG_LEVEL": "debug", "SDG_LEADER_ELECT": "true"}
    s = parse(["--webhook-port", "9100"], environ=env)
    assert s.webhook_port == 9100
    assert s.log_level == "debug"
    assert s.leader_elect is True
    assert parse(["--no-leader-elect"], environ=env).leader_elect is False


def test_namespace_from_pod_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "gpu-system")
    assert parse([], environ={}).namespace == "gpu-system"
    assert parse(["--claims-namespace", "x"], environ={}).namespace == "x"


def test_kubeconfig_env() -> None:
    assert parse([], environ={"KUBECONFIG": "/k"}).kubeconfig == "/k"


def test_device_env_table_from_flags_and_file(tmp_path) -> None:
    f = tmp_path / "env"
    f.write_text("# vendor table\nexample.com/fpga=FPGA_DEVICES\n")
    s = parse(
        ["--device-env", "amd.com/gpu=ROCR_VISIBLE_DEVICES", "--device-env-file", str(f)],
        environ={},
    )
    table = s.env_table()
    assert table["amd.com/gpu"] == "ROCR_VISIBLE_DEVICES"
    assert table["example.com/fpga"] == "FPGA_DEVICES"
    assert table["nvidia.com/gpu"] == "NVIDIA_VISIBLE_DEVICES"


@pytest.mark.parametrize(
    "argv",
    [
        ["--device-env", "no-equals-sign"],
        ["--log-level", "loud"],
        ["--webhook-port", "70000"],
        ["--log-format", "xml"],
    ],
)
def test_bad_values_exit_with_a_message(argv: list[str], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as info:
        parse(argv, environ={})
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "sdg-manager: error:" in err


def test_delivery_defaults_and_their_webhook_settings() -> None:
    """By default the delivery is chosen per node (auto) and devices go by UUID where the
    inventory knows them (auto); index and uuid, env, runtimeclass and cdi stay choices."""
    s = parse([], environ={})
    assert (s.delivery, s.device_ids) == ("auto", "auto")
    assert s.runtime_class_name == "nvidia"
    # The device-injector's current family (containerd/nri plugins/device-injector).
    assert s.cdi_annotation_prefix == "cdi-devices.noderesource.dev/container."
    d = s.delivery_settings()
    assert (d.mode, d.device_ids, d.runtime_class_name, d.cdi_annotation_prefix) == (
        "auto",
        "auto",
        "nvidia",
        "cdi-devices.noderesource.dev/container.",
    )


def test_delivery_flags_and_env() -> None:
    env = {
        "SDG_DELIVERY": "cdi",
        "SDG_DEVICE_IDS": "uuid",
        "SDG_RUNTIME_CLASS_NAME": "nvidia-cdi",
        "SDG_CDI_ANNOTATION_PREFIX": "cdi-devices.nri.io/container.",
    }
    s = parse([], environ=env)
    assert s.delivery_settings().mode == "cdi"
    assert s.device_ids == "uuid"
    assert s.runtime_class_name == "nvidia-cdi"
    assert s.cdi_annotation_prefix == "cdi-devices.nri.io/container."  # the deprecated one
    s = parse(["--delivery", "runtimeclass", "--runtime-class-name", "gpu"], environ=env)
    assert (s.delivery, s.runtime_class_name) == ("runtimeclass", "gpu")
    s = parse(["--delivery", "env", "--device-ids", "index"], environ={})
    assert (s.delivery_settings().mode, s.delivery_settings().device_ids) == ("env", "index")


@pytest.mark.parametrize(
    "argv",
    [
        ["--delivery", "nri"],
        ["--device-ids", "serial"],
        ["--runtime-class-name", "Not_A_Name"],
        ["--cdi-annotation-prefix", "no-slash"],
        ["--cdi-annotation-prefix", "deviceshare.io/container."],
    ],
)
def test_bad_delivery_values_exit_with_a_message(
    argv: list[str], capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as info:
        parse(argv, environ={})
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "sdg-manager: error:" in err and argv[0].lstrip("-").replace("-", "_") in err


# --- sdg-manager --help: every flag, its description, env var and default --------------------


def test_every_setting_has_a_description() -> None:
    assert [n for n, f in Settings.model_fields.items() if not f.description] == []


def test_help_gives_each_flag_its_description_env_var_and_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # one line per flag, no wrapping
    text = parser().format_help()
    assert "PydanticUndefined" not in text
    words = " ".join(text.split())
    for name, field in Settings.model_fields.items():
        assert f"--{name.replace('_', '-')} " in words, name
        assert f"{field.description} (env SDG_{name.upper()}; default " in words, name
    assert "(env SDG_WEBHOOK_PORT; default 9443)" in text
    assert "(env SDG_LEADER_ELECT; default off)" in text
    assert "(env SDG_KUBECONFIG; default unset)" in text
    assert "(env SDG_DEVICE_ENV; default none)" in text
    assert "--log-level {debug,info,warning,error}" in text


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse(["--help"], environ={})
    assert info.value.code == 0
    assert "Every flag can be given as its SDG_<NAME> environment variable" in (
        " ".join(capsys.readouterr().out.split())
    )


def test_lists_and_booleans_from_the_environment() -> None:
    env = {
        "SDG_DEVICE_ENV": "amd.com/gpu=ROCR_VISIBLE_DEVICES,example.com/fpga=FPGA_DEVICES",
        "SDG_LEADER_ELECT": " On ",
    }
    s = parse([], environ=env)
    assert s.device_env == ["amd.com/gpu=ROCR_VISIBLE_DEVICES", "example.com/fpga=FPGA_DEVICES"]
    assert s.env_table()["example.com/fpga"] == "FPGA_DEVICES"
    assert s.leader_elect is True
    for false in ("0", "false", "No", "off"):
        assert parse([], environ={"SDG_LEADER_ELECT": false}).leader_elect is False
    assert parse(["--leader-elect"], environ={"SDG_LEADER_ELECT": "no"}).leader_elect


def test_a_boolean_env_var_that_is_no_boolean_is_an_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as info:
        parse([], environ={"SDG_LEADER_ELECT": "maybe"})
    assert info.value.code == 2
    assert "leader_elect" in capsys.readouterr().err


def test_readme_lists_every_flag_with_its_env_var() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    missing = [
        name
        for name in Settings.model_fields
        if "--" + name.replace("_", "-") not in section or f"SDG_{name.upper()}" not in section
    ]
    assert missing == []


@pytest.mark.parametrize(
    ("value", "runs"),
    [
        ("*", set(CONTROLLERS)),
        ("status", {"status"}),
        ("webhooks,status", {"webhooks", "status"}),
        ("*,-webhooks", set(CONTROLLERS) - {"webhooks"}),
        ("-webhooks", set(CONTROLLERS) - {"webhooks"}),
        ("-webhooks,-status", set(CONTROLLERS) - {"webhooks", "status"}),
    ],
)
def test_controllers_names_the_parts_a_process_runs(value: str, runs: set[str]) -> None:
    settings = parse([f"--controllers={value}"], environ={})
    assert {part for part in CONTROLLERS if settings.runs(part)} == runs


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("statuz", "'statuz': no such part; known: *, group-scheduler"),
        ("", "--controllers is empty"),
        ("*,-*", "runs nothing"),
    ],
)
def test_controllers_refuses_what_runs_nothing_or_is_unknown(value: str, message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        Settings(controllers=value)
