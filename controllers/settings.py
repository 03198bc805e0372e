"""Manager settings: command-line flags, each with an ``SDG_*`` environment equivalent.

Flags win over the environment, which wins over defaults. Each field's ``description``
is its ``--help`` line (with its env var and default), the one source of both. Validation
(pydantic) turns a bad value into one clear startup error instead of a failure deep inside
a controller.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal, get_args, get_origin

from pydantic import BaseModel, Field, ValidationError, field_validator
from pydantic.fields import FieldInfo

from api.constants import (
    DEFAULT_CDI_ANNOTATION_PREFIX,
    DEFAULT_ENV_TABLE,
    DEFAULT_RUNTIME_CLASS,
    LEASE_NAME,
    MANAGER_NAMESPACE,
    SCHEDULER_NAME,
)
from api.envvars import parse_env_table
from api.validation import is_dns_subdomain
from controllers.inventory import DEFAULT_DRA_DRIVERS
from controllers.statuscontroller import STATUS_BATCH_PERIOD, STATUS_HOLD, STATUS_WORKERS
from webhooks.delivery import Delivery, cdi_prefix_problem

ENV_PREFIX = "SDG_"

#: The parts ``--controllers`` names. The leader-elected ones share one Lease per process.
CONTROLLERS = ("group-scheduler", "pod-scheduler", "status", "foreign-reporter", "webhooks")


def enabled_controllers(value: str) -> frozenset[str]:
    """``--controllers`` as the set of parts it runs: ``*`` is all of them, a name adds
    one, ``-name`` takes one away (``*,-webhooks``: all but the webhooks)."""
    items = [item.strip() for item in value.split(",") if item.strip()]
    if not items:
        raise ValueError("--controllers is empty: give '*' or names of " + ", ".join(CONTROLLERS))
    enabled: set[str] = set()
    for item in items:
        name = item.removeprefix("-")
        if name != "*" and name not in CONTROLLERS:
            raise ValueError(
                f"--controllers {item!r}: no such part; known: *, " + ", ".join(CONTROLLERS)
            )
        chosen = set(CONTROLLERS) if name == "*" else {name}
        if item.startswith("-"):
            enabled -= chosen
        else:
            enabled |= chosen
    if all(item.startswith("-") for item in items):  # only exclusions: from all of them
        enabled = set(CONTROLLERS) - {i.removeprefix("-") for i in items}
    if not enabled:
        raise ValueError(f"--controllers {value!r} runs nothing")
    return frozenset(enabled)


class Settings(BaseModel):
    """The manager's settings; each field is a flag (``--log-level``) and an env var
    (``SDG_LOG_LEVEL``), its description the one line ``sdg-manager --help`` shows."""

    kubeconfig: str | None = Field(
        None,
        description="kubeconfig file for the API server; unset: $KUBECONFIG, else in-cluster",
    )
    metrics_bind_address: str = Field(":8080", description="address of /metrics; 0 turns it off")
    metrics_secure: bool = Field(
        False,
        description=(
            "serve /metrics over HTTPS for scrapers the API server authenticates and authorizes "
            "(config/manager sets it); off: plain HTTP, for local use"
        ),
    )
    metrics_cert_dir: str | None = Field(
        None,
        description="tls.crt/tls.key for --metrics-secure; unset: a self-signed pair made at start",
    )
    health_probe_bind_address: str = Field(":8081", description="address of /healthz and /readyz")
    webhook_host: str = Field(
        "0.0.0.0", description="address of the admission webhook server (TLS)"
    )
    webhook_port: int = Field(
        9443, ge=0, le=65535, description="port of the admission webhook server"
    )
    webhook_cert_dir: str = Field(
        "/tmp/k8s-webhook-server/serving-certs",
        description="the webhook's tls.crt/tls.key, re-read when they change",
    )
    leader_elect: bool = Field(
        False, description="Lease-based leader election: only the leader schedules (on in config/)"
    )
    leader_election_namespace: str | None = Field(
        None, description="namespace of the leader Lease; unset: the pod's namespace"
    )
    leader_election_id: str = Field(LEASE_NAME, description="name of the leader Lease")
    scheduler_name: str = Field(
        SCHEDULER_NAME,
        description="schedulerName of the pods this manager binds (the pod webhook sets it)",
    )
    delivery: Literal["auto", "env", "runtimeclass", "cdi"] = Field(
        "auto",
        description=(
            "how group pods get their devices, per node: auto (runtimeclass where RuntimeClass "
            "--runtime-class-name exists and the node lists its handler in "
            "status.runtimeHandlers, env where it is labelled deviceshare.io/default-runtime="
            "nvidia, else env with a Warning Event: unverified), or one mode for every node: "
            "env (vendor env vars), runtimeclass (the same, run by --runtime-class-name) or cdi "
            "(CDI device annotations); the node label deviceshare.io/delivery overrides"
        ),
    )
    device_ids: Literal["auto", "index", "uuid"] = Field(
        "auto",
        description=(
            "auto: NVIDIA devices by UUID where the group's status.physicalDevices has them, "
            "other vendors' and the rest by ID; index: by ID; uuid: by UUID where known, for "
            "every vendor"
        ),
    )
    runtime_class_name: str = Field(
        DEFAULT_RUNTIME_CLASS,
        description="the RuntimeClass of delivery runtimeclass (and that auto looks for)",
    )
    cdi_annotation_prefix: str = Field(
        DEFAULT_CDI_ANNOTATION_PREFIX,
        description='cdi mode: group pods get <prefix><container name>: ["nvidia.com/gpu=0", ...]',
    )
    claims_namespace: str | None = Field(
        None,
        description="namespace of the per-node claim records; unset: the pod's (POD_NAMESPACE)",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="log level")
    log_format: Literal["json", "text"] = Field(
        "text", description="text, or json for log pipelines"
    )
    event_loop: Literal["auto", "uvloop", "asyncio"] = Field(
        "auto",
        description=(
            "the event loop: uvloop (its TLS and transports are compiled: less CPU per "
            "webhook review and watch event), asyncio, or auto: uvloop where installed"
        ),
    )
    device_env: list[str] = Field(
        default_factory=list,
        description=(
            "add or override a device env var mapping of the built-in table (repeatable; in "
            "the env var, comma-separated)"
        ),
    )
    device_env_file: str | None = Field(
        None, description="a file of RESOURCE_GLOB=ENV_VAR mappings, one per line (# comments)"
    )
    group_workers: int = Field(
        # Placement and reservation stay one serialised step; the record writes they
        # lead to overlap (S3 in hack/bench/RESULTS.md).
        8,
        ge=1,
        le=64,
        description="concurrent group reconciles (claim record writes per node are serialised)",
    )
    status_workers: int = Field(
        STATUS_WORKERS,
        ge=1,
        le=64,
        description="concurrent status reconciles (each mostly one status PATCH)",
    )
    status_batch_period: float = Field(
        STATUS_BATCH_PERIOD,
        ge=0,
        le=60,
        description="seconds between two status writes of one group (a burst of pods is "
        "written once per period; 0 writes every change at once)",
    )
    status_hold: float = Field(
        STATUS_HOLD,
        ge=0,
        le=300,
        description="seconds a group's status write may wait while pods wait to be bound "
        "(binds go first after a failover; 0: never waits)",
    )
    event_qps: float = Field(
        50.0,
        gt=0,
        description="Events written per second by this process, in all (a burst of "
        "warnings reaches the API server at this rate; the kubelet's --event-qps)",
    )
    event_burst: int = Field(
        100,
        ge=1,
        le=10000,
        description="Events written at once before --event-qps paces them",
    )
    allocated_pods: Literal["names", "counts"] = Field(
        "names",
        description="names: status.allocatedPods lists the group's pods (namespace/name); "
        "counts: status.allocatedPodCounts counts them per namespace and allocatedPods stays "
        "empty, so readers of groups see no pod names (nor PodsJoined/PodsLeft events)",
    )
    controllers: str = Field(
        "*",
        description=(
            "the parts this process runs, as kube-controller-manager's --controllers: '*' "
            "(all), names to run only those, '-name' to leave one out; names: "
            + ", ".join(CONTROLLERS)
            + ". Leader-elected parts of two processes need two --leader-election-id"
        ),
    )
    pod_workers: int = Field(
        32, ge=1, le=256, description="concurrent pod reconciles (bind calls are pipelined)"
    )
    resource_slices: Literal["auto", "on", "off"] = Field(
        "auto",
        description=(
            "device inventory from DRA ResourceSlices: auto when the API server serves "
            "resource.k8s.io/v1 (Kubernetes 1.34+), or on/off"
        ),
    )
    device_taint_rules: Literal["auto", "on", "off"] = Field(
        "auto",
        description=(
            "read DRA DeviceTaintRules (a matched device with a NoSchedule/NoExecute taint is "
            "unhealthy): auto when the API server serves them in resource.k8s.io/v1 (1.37+)"
        ),
    )
    dra_drivers: str = Field(
        "",
        description="more DRIVER=RESOURCE pairs, comma-separated, on top of the known DRA "
        "drivers: " + ",".join(f"{d}={r}" for d, r in DEFAULT_DRA_DRIVERS.items()),
    )
    holders: Literal["auto", "off"] = Field(
        "auto",
        description=(
            "auto: a group bound on devices from a device plugin gets a holder pod asking the "
            "kubelet for them, so plain pods never get them (nodes may be shared with plain "
            "pods); off: no holders (keep shared nodes tainted so only groups use them)"
        ),
    )
    holder_image: str = Field(
        "registry.k8s.io/pause:3.10.2",
        description="image of the holder pods (any image whose entrypoint runs until stopped)",
    )
    holder_priority_class: str = Field(
        "deviceshare-holder",
        description="PriorityClass of the holder pods (config/manager ships it); empty: none",
    )

    @field_validator("device_env")
    @classmethod
    def _check_env(cls, value: list[str]) -> list[str]:
        parse_env_table(value)
        return value

    @field_validator("runtime_class_name")
    @classmethod
    def _check_runtime_class(cls, value: str) -> str:
        if not is_dns_subdomain(value):
            raise ValueError(f"--runtime-class-name {value!r} is not a valid RuntimeClass name")
        return value

    @field_validator("controllers")
    @classmethod
    def _check_controllers(cls, value: str) -> str:
        enabled_controllers(value)
        return value

    @field_validator("cdi_annotation_prefix")
    @classmethod
    def _check_cdi_prefix(cls, value: str) -> str:
        problem = cdi_prefix_problem(value)
        if problem is not None:
            raise ValueError(f"--cdi-annotation-prefix {problem}")
        return value

    @property
    def namespace(self) -> str:
        """The manager's own namespace: claims and the lease live there."""
        return (
            self.claims_namespace
            or self.leader_election_namespace
            or os.environ.get("POD_NAMESPACE")
            or MANAGER_NAMESPACE
        )

    def runs(self, part: str) -> bool:
        """Whether this process runs ``part`` (one of :data:`CONTROLLERS`)."""
        return part in enabled_controllers(self.controllers)

    def dra_driver_table(self) -> dict[str, str]:
        """DRA driver -> the device resource its devices count as."""
        return dra_driver_table(self.dra_drivers)

    def env_table(self) -> dict[str, str]:
        items = list(self.device_env)
        if self.device_env_file:
            for line in Path(self.device_env_file).read_text().splitlines():
                line = line.split("#", 1)[0].strip()
                if line:
                    items.append(line)
        return parse_env_table(items, DEFAULT_ENV_TABLE)

    def delivery_settings(self) -> Delivery:
        """What the pod webhook needs to give group pods their devices."""
        return Delivery(
            self.delivery, self.device_ids, self.runtime_class_name, self.cdi_annotation_prefix
        )


def dra_driver_table(text: str, *, strict: bool = True) -> dict[str, str]:
    """``--dra-drivers`` (``DRIVER=RESOURCE,...``) on top of the known drivers; not
    ``strict``, a malformed item is skipped instead of refused."""
    table = dict(DEFAULT_DRA_DRIVERS)
    for item in text.split(","):
        driver, sep, resource = item.strip().partition("=")
        if item.strip() and (not sep or not driver.strip() or not resource.strip()):
            if strict:
                raise ValueError(f"--dra-drivers {item!r}: expected DRIVER=RESOURCE")
            continue
        if sep:
            table[driver.strip()] = resource.strip()
    return table


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def env_var(name: str) -> str:
    """The environment variable of a setting: ``log_level`` -> ``SDG_LOG_LEVEL``."""
    return ENV_PREFIX + name.upper()


def _default_text(field: FieldInfo) -> str:
    value = field.get_default(call_default_factory=True)
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "unset"
    if value == "" or value == []:
        return "none"
    return str(value)


def _metavar(field: FieldInfo) -> str | None:
    if get_origin(field.annotation) is Literal:
        return "{" + ",".join(str(a) for a in get_args(field.annotation)) + "}"
    if field.annotation is int:
        return "N"
    return None


def flag_help(name: str) -> str:
    """A flag's ``--help`` line: its description, env var and default."""
    field = Settings.model_fields[name]
    if not field.description:
        raise ValueError(f"setting {name} has no description")
    return f"{field.description} (env {env_var(name)}; default {_default_text(field)})"


def parser(*, strict: bool = True) -> argparse.ArgumentParser:
    """``sdg-manager``'s flags, one per :class:`Settings` field. Not ``strict``: no
    ``--help``, no abbreviations, and errors raised instead of exiting (:func:`read_known`)."""
    p = argparse.ArgumentParser(
        add_help=strict,
        allow_abbrev=strict,
        exit_on_error=strict,
        prog="sdg-manager",
        description="Shared Device Group manager: group and pod schedulers, status "
        "controller and admission webhooks in one process.",
        epilog=f"Every flag can be given as its {ENV_PREFIX}<NAME> environment variable "
        "instead (lists comma-separated, booleans true/false); flags win over the "
        "environment, which wins over the defaults.",
    )
    for name, field in Settings.model_fields.items():
        help_text = flag_help(name).replace("%", "%%")
        if field.annotation is bool:
            p.add_argument(
                _flag(name), action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        elif name == "device_env":
            p.add_argument(
                _flag(name),
                action="append",
                default=None,
                metavar="RESOURCE_GLOB=ENV_VAR",
                help=help_text,
            )
        else:
            p.add_argument(_flag(name), default=None, metavar=_metavar(field), help=help_text)
    return p


def parse(argv: Sequence[str] | None = None, environ: dict[str, str] | None = None) -> Settings:
    """Flags, then ``SDG_<NAME>`` env vars, then defaults; exits with a message when invalid.

    The environment is read here rather than by pydantic-settings: flags, env vars and an
    injected ``environ`` (tests) meet in one place, lists keep their comma-separated form,
    ``KUBECONFIG`` stays a fallback, and ``Settings(...)`` built in code never reads the
    process environment behind the caller's back.
    """
    environ = dict(os.environ if environ is None else environ)
    p = parser()
    values = _given(vars(p.parse_args(argv)), environ)
    if "kubeconfig" not in values and environ.get("KUBECONFIG"):
        values["kubeconfig"] = environ["KUBECONFIG"]
    try:
        return Settings.model_validate(values)
    except (ValidationError, ValueError) as err:
        p.error(str(err))
        raise  # unreachable: parser.error exits


def _given(args: Mapping[str, object], environ: Mapping[str, str]) -> dict[str, object]:
    """The settings parsed flags (``args``) or ``SDG_<NAME>`` variables set, flags first;
    not validated yet."""
    values: dict[str, object] = {}
    for name in Settings.model_fields:
        if args.get(name) is not None:
            values[name] = args[name]
            continue
        raw = environ.get(env_var(name))
        if raw is None:
            continue
        if name == "device_env":
            values[name] = [v for v in raw.split(",") if v.strip()]
        elif Settings.model_fields[name].annotation is bool:
            values[name] = raw.strip()  # pydantic's: true/false, 1/0, yes/no, on/off
        else:
            values[name] = raw
    return values


def read_known(argv: Sequence[str], environ: Mapping[str, str]) -> dict[str, object]:
    """The settings a manager's command line and environment set, read as :func:`parse`
    reads them but for a manager running elsewhere (``sdg doctor`` reads its Deployment):
    unknown flags and words are skipped, nothing is validated, ``--flag=VALUE`` of a
    boolean counts as on for 1/true/yes/on and off otherwise, and a command line argparse
    cannot read leaves the environment's values."""
    booleans = {_flag(n) for n, f in Settings.model_fields.items() if f.annotation is bool}
    tokens = []
    for token in argv:
        flag, sep, value = token.partition("=")
        if sep and flag in booleans:
            on = value.strip().lower() in TRUE_WORDS
            token = flag if on else "--no-" + flag[2:]
        tokens.append(token)
    try:
        args = vars(parser(strict=False).parse_known_args(tokens)[0])
    except argparse.ArgumentError:
        args = {}
    return _given(args, environ)


#: How a boolean setting's ``SDG_*`` value or ``--flag=VALUE`` says "on".
TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
