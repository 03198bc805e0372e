"""Pinned devices (``spec.devices``): the IDs a node gives a group's pins, or why not.

A pin is SDG's device ID when it is a number (``"3"``) and a UUID otherwise, compared with
the UUIDs the node's inventory knows, never by position. A node fits a pinned resource only
when every pin names a device it lists, healthy and held by nobody in the ledger's merge;
each failing pin gives one filter reason naming the holder or the missing device, so the
Pending message and ``sdg explain`` say which. Work per call is bounded by the pins (at
most ``MAX_PINNED_DEVICES``) and the node's devices of that resource.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from api.v1alpha1 import spec_pins
from api.validation import pin_id
from controllers.inventory import SOURCE_SLICE, Offer, count_offer
from controllers.ledger.book import Ledger
from controllers.ledger.view import Group, describe

__all__ = ["LedgerPins", "claim_matches_pins", "pinned_ids", "resolve_pins"]


def resolve_pins(
    resource: str, pins: Iterable[str], offer: Offer
) -> tuple[tuple[int | None, ...], tuple[str, ...]]:
    """Each pin's device ID in ``offer`` (None where it names no usable device) and a
    reason for every pin that does not: missing, unhealthy, or the same device twice."""
    by_uuid = {d.uuid: d.id for d in offer.devices if d.uuid}
    ids: list[int | None] = []
    why: list[str] = []
    seen: dict[int, str] = {}
    for pin in pins:
        device_id = pin_id(pin)
        if device_id is None:
            device_id = by_uuid.get(pin)
            if device_id is None:
                missing = (
                    f"have no pinned {resource} {pin} (missing: the node's inventory of "
                    f"{resource} knows no UUIDs; pin by ID)"
                    if not by_uuid
                    else f"have no pinned {resource} {pin} (missing from the node's inventory)"
                )
                why.append(missing)
                ids.append(None)
                continue
        device = offer.device(device_id)
        if device is None:
            why.append(f"have no pinned {resource} {pin} (missing from the node's inventory)")
            ids.append(None)
            continue
        if not device.healthy:
            why.append(f"have pinned {resource} {pin} unhealthy")
            ids.append(None)
            continue
        if device_id in seen:
            why.append(
                f"have pinned {resource} {seen[device_id]} and {pin} as one device "
                f"(ID {device_id}): pin each device once"
            )
            ids.append(None)
            continue
        seen[device_id] = pin
        ids.append(device_id)
    return tuple(ids), tuple(why)


def pinned_ids(spec: Mapping[str, Any], offers: Mapping[str, Offer]) -> dict[str, list[int]]:
    """The sorted IDs ``offers`` gives every pinned resource of ``spec`` whose pins all
    name usable devices there (a resource missing from the result does not resolve)."""
    out: dict[str, list[int]] = {}
    for res, pins in spec_pins(spec).items():
        offer = offers.get(res)
        if offer is None:
            continue
        ids, why = resolve_pins(res, pins, offer)
        if not why:
            out[res] = sorted(i for i in ids if i is not None)
    return out


class LedgerPins:
    """``placement.PinResolver`` over a ledger: its inventory (``offers``) and its merge of
    holders. ``group``'s own holdings count as free (a claim it is adopting);
    ``holders``: the manager gives device-plugin resources through holder pods, whose
    devices the kubelet picks, so pins cannot be honoured there (None: not known, as for
    ``sdg explain`` without the manager's Deployment; judged as off)."""

    def __init__(self, ledger: Ledger, group: str = "", *, holders: bool | None = False) -> None:
        self.ledger = ledger
        self.group = group
        self.holders = holders

    def _offer(self, node: str, resource: str) -> Offer:
        offer = (self.ledger.offers.get(node) or {}).get(resource)
        if offer is None:  # only a count is known: IDs 0..N-1
            offer = count_offer(resource, self.ledger.tracker.capacity(node, resource))
        return offer

    def resolve(
        self, node: str, resource: str, pins: tuple[str, ...]
    ) -> tuple[tuple[int, ...], tuple[str, ...]]:
        offer = self._offer(node, resource)
        if self.holders and offer.source != SOURCE_SLICE:
            return (), (
                f"give {resource} through holder pods, and the kubelet picks which devices: "
                "pinned devices need a DRA node or the manager's --holders off",
            )
        ids, why = resolve_pins(resource, pins, offer)
        reasons = list(why)
        for pin, device_id in zip(pins, ids, strict=True):
            if device_id is None:
                continue
            holder = self.ledger.holder(node, resource, device_id)
            if holder is not None and holder != Group(self.group):
                reasons.append(f"have pinned {resource} {pin} held by {describe(holder)}")
        if reasons:
            return (), tuple(reasons)
        return tuple(sorted(i for i in ids if i is not None)), ()


def claim_matches_pins(
    spec: Mapping[str, Any], devices: Mapping[str, Iterable[int]], offers: Mapping[str, Offer]
) -> bool:
    """Whether a claim's ``devices`` are exactly what ``spec.devices`` pins (True when
    nothing is pinned): a claim made for other pins is not adopted."""
    pins = spec_pins(spec)
    resolved = pinned_ids(spec, offers)
    return set(resolved) == set(pins) and all(
        sorted(devices.get(res, ())) == ids for res, ids in resolved.items()
    )
