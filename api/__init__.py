"""The SharedDeviceGroup API (``deviceshare.io/v1alpha1``): models, names and rules.

Imports nothing from controllers or webhooks; both import from here.
"""

from __future__ import annotations

from api.constants import GROUP, SDG_KIND, VERSION
from api.v1alpha1 import (
    SharedDeviceGroup,
    SharedDeviceGroupSpec,
    SharedDeviceGroupStatus,
    format_ids,
    parse_ids,
)

__all__ = [
    "GROUP",
    "SDG_KIND",
    "VERSION",
    "SharedDeviceGroup",
    "SharedDeviceGroupSpec",
    "SharedDeviceGroupStatus",
    "format_ids",
    "parse_ids",
]
