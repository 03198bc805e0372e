"""Name and spec validation shared by the pydantic models, the webhooks and the CRD tests.

The regular expressions mirror Kubernetes' own (apimachinery ``validation``) and the CEL
rules in ``config/crd``; a unit test checks the CRD uses these exact patterns, so a group
the API server accepts is one the Python side accepts, and vice versa.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from api.constants import MAX_DEVICES_PER_RESOURCE, MAX_PIN_LENGTH, MAX_PINNED_DEVICES

DNS1123_LABEL: Final = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
#: A DNS-1123 subdomain (object names, annotation/resource prefixes); at most 253 chars.
DNS1123_SUBDOMAIN: Final = rf"{DNS1123_LABEL}(\.{DNS1123_LABEL})*"
#: The name part of a qualified name; at most 63 chars.
QUALIFIED_NAME_PART: Final = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
#: A device resource name: ``<dns-subdomain prefix>/<name>``, e.g. ``nvidia.com/gpu``.
#: The prefix is required: unprefixed names are Kubernetes' native resources (cpu,
#: memory, pods), which a device group cannot meaningfully hold.
RESOURCE_NAME: Final = rf"{DNS1123_SUBDOMAIN}/{QUALIFIED_NAME_PART}"
#: A label key: qualified name with an optional DNS-subdomain prefix.
LABEL_KEY: Final = rf"({DNS1123_SUBDOMAIN}/)?{QUALIFIED_NAME_PART}"
LABEL_VALUE: Final = rf"({QUALIFIED_NAME_PART})?"

MAX_SUBDOMAIN_LEN: Final = 253
MAX_NAME_PART_LEN: Final = 63
#: Bounds the CRD uses so the CEL cost estimator accepts its rules.
MAX_RESOURCES: Final = 16
MAX_NODE_SELECTOR: Final = 64
MAX_RESOURCE_NAME_LEN: Final = MAX_SUBDOMAIN_LEN + 1 + MAX_NAME_PART_LEN

#: A pinned device in ``spec.devices``: a number is SDG's device ID (as in
#: ``status.selectedDevices``), anything else a UUID (``GPU-6f1c...``).
PIN: Final = r"[A-Za-z0-9][-A-Za-z0-9_.:]*"
#: A pin that is a device ID: digits only.
PIN_ID: Final = r"[0-9]+"

_SUBDOMAIN_RE = re.compile(DNS1123_SUBDOMAIN)
_PIN_RE = re.compile(PIN)
_NAME_PART_RE = re.compile(QUALIFIED_NAME_PART)
_LABEL_VALUE_RE = re.compile(LABEL_VALUE)

STRATEGIES: Final = ("binpack", "spread")

#: The CRD's message for a count above ``MAX_DEVICES_PER_RESOURCE`` (no node offers more).
COUNT_TOO_LARGE: Final = (
    f"device counts must be at most {MAX_DEVICES_PER_RESOURCE}, "
    "the most devices of one resource SDG addresses per node"
)


def is_dns_subdomain(value: str) -> bool:
    """True if ``value`` is a valid object name for groups (and annotation value for pods)."""
    return len(value) <= MAX_SUBDOMAIN_LEN and _SUBDOMAIN_RE.fullmatch(value) is not None


def _split_qualified(value: str) -> tuple[str | None, str]:
    prefix, sep, name = value.rpartition("/")
    return (prefix if sep else None), name


def _is_name_part(name: str) -> bool:
    return len(name) <= MAX_NAME_PART_LEN and _NAME_PART_RE.fullmatch(name) is not None


def is_resource_name(value: str) -> bool:
    """True for an extended resource name with a DNS-subdomain prefix, e.g. ``amd.com/gpu``."""
    prefix, name = _split_qualified(value)
    return (
        prefix is not None
        and "/" not in prefix
        and is_dns_subdomain(prefix)
        and (_is_name_part(name))
    )


def is_label_key(value: str) -> bool:
    """True for a Kubernetes label key (qualified name, optional DNS-subdomain prefix)."""
    prefix, name = _split_qualified(value)
    if prefix is not None and ("/" in prefix or not is_dns_subdomain(prefix)):
        return False
    return _is_name_part(name)


def is_label_value(value: str) -> bool:
    return len(value) <= MAX_NAME_PART_LEN and _LABEL_VALUE_RE.fullmatch(value) is not None


def validate_spec(spec: Any) -> list[str]:
    """Field errors of a group spec dict (``[]`` when valid), worded like the API server's.

    The CRD enforces the same rules; this lets webhooks and the CLI explain a bad spec
    without a round trip, and guards code paths that read specs the CRD never checked.
    """
    if not isinstance(spec, Mapping):
        return ["spec: Required value: a SharedDeviceGroup needs a spec"]
    errors: list[str] = []
    resources = spec.get("resources")
    if not isinstance(resources, Mapping) or not resources:
        errors.append(
            "spec.resources: Required value: name at least one device resource, "
            "e.g. nvidia.com/gpu: 2"
        )
    else:
        if len(resources) > MAX_RESOURCES:
            errors.append(
                f"spec.resources: Too many: {len(resources)}: must have at most "
                f"{MAX_RESOURCES} items"
            )
        for name, count in resources.items():
            if not isinstance(name, str) or not is_resource_name(name):
                errors.append(
                    f"spec.resources[{name}]: Invalid value: {name!r}: must be an extended "
                    "resource name: a DNS subdomain prefix, '/', and a name of at most 63 "
                    "alphanumerics, '-', '_' or '.' (e.g. nvidia.com/gpu)"
                )
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                errors.append(
                    f"spec.resources[{name}]: Invalid value: {count!r}: must be a positive integer"
                )
            elif count > MAX_DEVICES_PER_RESOURCE:
                errors.append(f"spec.resources[{name}]: Invalid value: {count}: {COUNT_TOO_LARGE}")
    strategy = spec.get("schedulingStrategy", "binpack")
    if strategy not in STRATEGIES:
        errors.append(
            f"spec.schedulingStrategy: Unsupported value: {strategy!r}: "
            'supported values: "binpack", "spread"'
        )
    host_access = spec.get("allowHostAccess")
    if host_access is not None and not isinstance(host_access, bool):
        errors.append(
            f"spec.allowHostAccess: Invalid value: {host_access!r}: must be true or false"
        )
    errors += validate_pins(spec.get("devices"), resources)
    selector = spec.get("nodeSelector")
    if selector is not None:
        if not isinstance(selector, Mapping):
            errors.append("spec.nodeSelector: Invalid value: must be a map of label key to value")
        else:
            for key, value in selector.items():
                if not isinstance(key, str) or not is_label_key(key):
                    errors.append(
                        f"spec.nodeSelector[{key}]: Invalid value: {key!r}: "
                        "must be a valid label key"
                    )
                if not isinstance(value, str) or not is_label_value(value):
                    errors.append(
                        f"spec.nodeSelector[{key}]: Invalid value: {value!r}: "
                        "must be a valid label value"
                    )
    return errors


def pin_id(pin: str) -> int | None:
    """The device ID a pin names (``"3"`` -> 3), or None when the pin is a UUID."""
    return int(pin) if pin.isascii() and pin.isdigit() else None


def validate_pins(devices: Any, resources: Any) -> list[str]:
    """Field errors of ``spec.devices`` (the CRD's rules, worded as the API server's)."""
    if devices is None:
        return []
    if not isinstance(devices, Mapping):
        return [
            "spec.devices: Invalid value: must map a resource to its device IDs or UUIDs, "
            'e.g. nvidia.com/gpu: ["0", "3"]'
        ]
    errors: list[str] = []
    if len(devices) > MAX_RESOURCES:
        errors.append(
            f"spec.devices: Too many: {len(devices)}: must have at most {MAX_RESOURCES} items"
        )
    requested = resources if isinstance(resources, Mapping) else {}
    for res, pins in devices.items():
        field = f"spec.devices[{res}]"
        if res not in requested:
            errors.append(
                f"{field}: Invalid value: pins a resource spec.resources does not request; "
                "add it to spec.resources or remove it here"
            )
        if not isinstance(pins, list) or not all(isinstance(p, str) for p in pins):
            errors.append(f"{field}: Invalid value: must be a list of device IDs or UUIDs")
            continue
        if len(pins) > MAX_PINNED_DEVICES:
            errors.append(
                f"{field}: Too many: {len(pins)}: must have at most {MAX_PINNED_DEVICES} items"
            )
        count = requested.get(res)
        if isinstance(count, int) and not isinstance(count, bool) and len(pins) != count:
            errors.append(
                f"{field}: Invalid value: lists {len(pins)} device(s) but spec.resources "
                f"requests {count}: pin exactly as many devices as requested"
            )
        seen: set[str] = set()
        for i, pin in enumerate(pins):
            if pin in seen:
                errors.append(f"{field}[{i}]: Duplicate value: {pin!r}")
            seen.add(pin)
            if len(pin) > MAX_PIN_LENGTH or _PIN_RE.fullmatch(pin) is None:
                errors.append(
                    f"{field}[{i}]: Invalid value: {pin!r}: must be a device ID (a number) "
                    f"or a UUID of at most {MAX_PIN_LENGTH} letters, digits, '-', '_', '.' "
                    "or ':'"
                )
            elif (n := pin_id(pin)) is not None and n >= MAX_DEVICES_PER_RESOURCE:
                errors.append(
                    f"{field}[{i}]: Invalid value: {pin!r}: device IDs are below "
                    f"{MAX_DEVICES_PER_RESOURCE}"
                )
    return errors
