"""Manager settings: command-line flags, each with an ``SDG_*`` environment equivalent.

Flags win over the environment, which wins over defaults. Validation (pydantic) turns a
bad value into one clear startup error instead of a failure deep inside a controller.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError, field_validator

from api.constants import (
    DEFAULT_CDI_ANNOTATION_PREFIX,
    DEFAULT_ENV_TABLE,
    DEFAULT_RUNTIME_CLASS,
    SCHEDULER_NAME,
)
from api.envvars import parse_env_table
from api.validation import is_dns_subdomain
from webhooks.delivery import Delivery, cdi_prefix_problem

ENV_PREFIX = "SDG_"


class Settings(BaseModel):
    kubeconfig: str | None = None
    metrics_bind_address: str = ":8080"
    health_probe_bind_address: str = ":8081"
    webhook_host: str = "0.0.0.0"
    webhook_port: int = Field(9443, ge=0, le=65535)
    webhook_cert_dir: str = "/tmp/k8s-webhook-server/serving-certs"
    leader_elect: bool = False
    leader_election_namespace: str | None = None
    leader_election_id: str = "deviceshare-manager"
    scheduler_name: str = SCHEDULER_NAME
    #: How group pods get their devices, matching the nodes' container runtime: ``env``
    #: (vendor env vars), ``runtimeclass`` (the same, run by ``runtime_class_name``) or
    #: ``cdi`` (CDI device annotations); the node label deviceshare.io/delivery overrides.
    delivery: Literal["env", "runtimeclass", "cdi"] = "env"
    #: ``index``: devices named by ID; ``uuid``: by the group's status.physicalDevices
    #: where the inventory knows them (else by ID).
    device_ids: Literal["index", "uuid"] = "index"
    runtime_class_name: str = DEFAULT_RUNTIME_CLASS
    #: Group pods get ``<prefix><container name>: ["nvidia.com/gpu=0", ...]`` in cdi mode.
    cdi_annotation_prefix: str = DEFAULT_CDI_ANNOTATION_PREFIX
    claims_namespace: str | None = None
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["json", "text"] = "text"
    device_env: list[str] = Field(default_factory=list)
    device_env_file: str | None = None
    group_workers: int = Field(1, ge=1, le=64)
    pod_workers: int = Field(8, ge=1, le=256)
    #: Device inventory from DRA ResourceSlices: ``auto`` reads them when the API server
    #: serves resource.k8s.io/v1 (Kubernetes 1.34+), ``on``/``off`` force it.
    resource_slices: Literal["auto", "on", "off"] = "auto"
    #: Extra ``DRIVER=RESOURCE`` pairs (comma-separated) on top of the known DRA drivers.
    dra_drivers: str = ""

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
            or "deviceshare-system"
        )

    def dra_driver_table(self) -> dict[str, str]:
        """DRA driver -> the device resource its devices count as."""
        from controllers.inventory import DEFAULT_DRA_DRIVERS

        table = dict(DEFAULT_DRA_DRIVERS)
        for item in self.dra_drivers.split(","):
            driver, sep, resource = item.strip().partition("=")
            if item.strip() and (not sep or not driver.strip() or not resource.strip()):
                raise ValueError(f"--dra-drivers {item!r}: expected DRIVER=RESOURCE")
            if sep:
                table[driver.strip()] = resource.strip()
        return table

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


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def parse(argv: Sequence[str] | None = None, environ: dict[str, str] | None = None) -> Settings:
    """Flags, then ``SDG_<NAME>`` env vars, then defaults; exits with a message when invalid."""
    environ = dict(os.environ if environ is None else environ)
    parser = argparse.ArgumentParser(
        prog="sdg-manager",
        description="Shared Device Group manager: group and pod schedulers, status "
        "controller and admission webhooks in one process.",
    )
    for name, field in Settings.model_fields.items():
        env = ENV_PREFIX + name.upper()
        help_text = f"(env {env}; default {field.default if field.default is not None else '-'})"
        if field.annotation is bool or name == "leader_elect":
            parser.add_argument(
                _flag(name), action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        elif name == "device_env":
            parser.add_argument(
                _flag(name),
                action="append",
                default=None,
                metavar="RESOURCE_GLOB=ENV_VAR",
                help="extra device env var mapping, repeatable " + help_text,
            )
        else:
            parser.add_argument(_flag(name), default=None, help=help_text)
    args = vars(parser.parse_args(argv))
    values: dict[str, object] = {}
    for name in Settings.model_fields:
        if args.get(name) is not None:
            values[name] = args[name]
            continue
        raw = environ.get(ENV_PREFIX + name.upper())
        if raw is None:
            continue
        if name == "device_env":
            values[name] = [v for v in raw.split(",") if v.strip()]
        elif name == "leader_elect":
            values[name] = raw.strip().lower() in ("1", "true", "yes", "on")
        else:
            values[name] = raw
    if "kubeconfig" not in values and environ.get("KUBECONFIG"):
        values["kubeconfig"] = environ["KUBECONFIG"]
    try:
        return Settings(**values)
    except (ValidationError, ValueError) as err:
        parser.error(str(err))
        raise  # unreachable: parser.error exits
