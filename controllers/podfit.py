"""Does a pod fit a node? The checks a standalone scheduler owes before binding.

A pod of a bound group has exactly one possible node, so the pod scheduler does not
search; but binding straight to that node would bypass everything kube-scheduler checks.
This module is those checks, pure, mirroring kube-scheduler's plugins: NodeUnschedulable,
TaintToleration, NodeAffinity (+ nodeSelector), NodeResourcesFit, NodePorts. Messages use
kube-scheduler's wording so users recognise them, plus the numbers that explain them.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from api.constants import FILTERING_TAINT_EFFECTS
from api.pods import is_active, tolerates
from controllers.quantity import format_units, parse_quantity, quantity_units, to_units
from sdgruntime.kinds import Obj, meta_of, spec_of, status_of

UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
_INT = re.compile(r"[+-]?[0-9]+")
_WILDCARD_IPS = frozenset({"", "0.0.0.0"})


# --- tolerations ------------------------------------------------------------------------


def _tolerated(tolerations: Iterable[Obj], taint: Obj) -> bool:
    return any(tolerates(t, taint) for t in tolerations)


# --- node affinity ----------------------------------------------------------------------


def _match_expression(expr: Obj, labels: Mapping[str, str]) -> bool:
    key = expr.get("key", "")
    op = expr.get("operator")
    values = expr.get("values") or []
    present = key in labels
    if op == "In":
        return present and labels[key] in values
    if op == "NotIn":
        return not present or labels[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt"):
        if not present or len(values) != 1:
            return False
        have, want = labels[key], values[0]
        if not _INT.fullmatch(have) or not _INT.fullmatch(str(want)):
            return False
        return int(have) > int(want) if op == "Gt" else int(have) < int(want)
    return False  # unknown operator: never matches (API validation rejects it anyway)


def _match_field(expr: Obj, node_name: str) -> bool:
    if expr.get("key") != "metadata.name":  # the only field selector nodes support
        return False
    return _match_expression(expr, {"metadata.name": node_name})


def _match_term(term: Obj, labels: Mapping[str, str], node_name: str) -> bool:
    exprs = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not exprs and not fields:
        return False  # an empty term matches no objects
    return all(_match_expression(e, labels) for e in exprs) and all(
        _match_field(f, node_name) for f in fields
    )


def matches_required_affinity(pod: Obj, node: Obj) -> bool:
    """``requiredDuringSchedulingIgnoredDuringExecution``: terms are ORed, expressions ANDed."""
    affinity = (spec_of(pod).get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if not required:
        return True
    meta = meta_of(node)
    labels = meta.get("labels") or {}
    name = meta.get("name") or ""
    terms = required.get("nodeSelectorTerms") or []
    return any(_match_term(t, labels, name) for t in terms)


# --- resources --------------------------------------------------------------------------


def _container_requests(container: Obj) -> dict[str, Fraction]:
    """Requests, with limits standing in for missing requests (the API server's default)."""
    res = container.get("resources") or {}
    merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
    return {name: parse_quantity(q) for name, q in merged.items()}


def _add(into: dict[str, Fraction], more: Mapping[str, Fraction]) -> None:
    for name, q in more.items():
        into[name] = into.get(name, Fraction(0)) + q


def _max(into: dict[str, Fraction], other: Mapping[str, Fraction]) -> None:
    for name, q in other.items():
        if q > into.get(name, Fraction(0)):
            into[name] = q


def pod_requests(pod: Obj) -> dict[str, int]:
    """A pod's effective requests in scheduler units (milli-CPU; bytes; counts).

    As kube-scheduler computes it: the sum over containers, raised to the largest init
    container's need, where restartable (sidecar, ``restartPolicy: Always``) init
    containers keep running — they add to the sum and to every later init container's
    need; pod-level ``spec.resources`` overrides per resource; then ``spec.overhead``.
    """
    spec = spec_of(pod)
    containers = spec.get("containers") or ()
    if not (
        spec.get("initContainers")
        or spec.get("resources")
        or spec.get("overhead")
        or any(isinstance(c, dict) and c.get("resources") for c in containers)
    ):
        return {}  # most pods: nothing requested anywhere
    total: dict[str, Fraction] = {}
    for c in containers:
        _add(total, _container_requests(c))
    sidecars: dict[str, Fraction] = {}
    init_need: dict[str, Fraction] = {}
    for c in spec.get("initContainers") or ():
        reqs = _container_requests(c)
        if c.get("restartPolicy") == "Always":
            _add(total, reqs)
            _add(sidecars, reqs)
            need = dict(sidecars)
        else:
            need = dict(reqs)
            _add(need, sidecars)
        _max(init_need, need)
    _max(total, init_need)
    pod_level = spec.get("resources") or {}
    if pod_level:
        override = {**(pod_level.get("limits") or {}), **(pod_level.get("requests") or {})}
        for name, q in override.items():
            total[name] = parse_quantity(q)
    _add(total, {n: parse_quantity(q) for n, q in (spec.get("overhead") or {}).items()})
    return {name: to_units(q, name) for name, q in total.items()}


# --- host ports -------------------------------------------------------------------------


def host_ports(pod: Obj) -> list[tuple[str, str, int]]:
    """``(protocol, hostIP, hostPort)`` the pod claims on its node.

    Containers and restartable init containers (they run alongside); one-shot init
    containers have finished before the others start.
    """
    spec = spec_of(pod)
    containers = list(spec.get("containers") or ())
    containers += [
        c for c in spec.get("initContainers") or () if c.get("restartPolicy") == "Always"
    ]
    out: list[tuple[str, str, int]] = []
    for c in containers:
        for p in c.get("ports") or ():
            port = int(p.get("hostPort") or 0)
            if port > 0:
                out.append((p.get("protocol") or "TCP", p.get("hostIP") or "0.0.0.0", port))
    return out


def _ports_conflict(a: tuple[str, str, int], b: tuple[str, str, int]) -> bool:
    if a[0] != b[0] or a[2] != b[2]:
        return False
    return a[1] in _WILDCARD_IPS or b[1] in _WILDCARD_IPS or a[1] == b[1]


# --- what a node's pods use -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Share:
    """What one active pod takes of its node: its requests in scheduler units (non-zero
    ones only) and its host ports."""

    units: tuple[tuple[str, int], ...] = ()
    ports: tuple[tuple[str, str, int], ...] = ()


#: The share of a pod that requests nothing and takes no host port (most pods' share is
#: this one object, not one each).
NO_SHARE = Share()


def share_of(pod: Obj, *, lenient: bool = False) -> Share:
    """``pod``'s ``Share`` (``pod_requests`` and ``host_ports``). ``lenient``: requests
    or ports that do not parse (the API server validates them; a test's pod may not) count
    as none instead of raising ValueError."""
    try:
        units = tuple((name, u) for name, u in pod_requests(pod).items() if u)
    except (ValueError, TypeError):
        if not lenient:
            raise
        units = ()
    try:
        ports = tuple(host_ports(pod))
    except (ValueError, TypeError):
        if not lenient:
            raise
        ports = ()
    return Share(units, ports) if units or ports else NO_SHARE


@dataclass(slots=True)
class NodeUsage:
    """What a node's active pods take together, as kube-scheduler's NodeInfo sums it:
    how many, their requests by resource, their host ports (a fit check reads these, never
    the pods)."""

    pods: int = 0
    units: dict[str, int] = field(default_factory=dict)
    ports: Counter[tuple[str, str, int]] = field(default_factory=Counter)

    def add(self, share: Share, sign: int = 1) -> None:
        """Count ``share`` in (``sign`` 1) or out (-1); totals that reach 0 go."""
        self.pods += sign
        units = self.units
        for name, u in share.units:
            total = units.get(name, 0) + sign * u
            if total:
                units[name] = total
            else:
                del units[name]
        ports = self.ports
        for port in share.ports:
            total = ports[port] + sign
            if total > 0:
                ports[port] = total
            else:
                del ports[port]

    def without(self, share: Share) -> NodeUsage:
        """A copy with ``share`` counted out."""
        out = NodeUsage(self.pods, dict(self.units), Counter(self.ports))
        out.add(share, -1)
        return out


def usage_of(pods: Iterable[Obj], but: Obj | None = None) -> NodeUsage:
    """What ``pods`` take together: the active ones other than ``but``."""
    usage = NodeUsage()
    for p in pods:
        if is_active(p) and (but is None or not _same_pod(p, but)):
            usage.add(share_of(p))
    return usage


# --- the fit check ----------------------------------------------------------------------


def _same_pod(a: Obj, b: Obj) -> bool:
    ma, mb = meta_of(a), meta_of(b)
    if ma.get("uid") and mb.get("uid"):
        return bool(ma["uid"] == mb["uid"])
    return (ma.get("namespace"), ma.get("name")) == (mb.get("namespace"), mb.get("name"))


def pod_fits_node(pod: Obj, node: Obj, pods_on_node: Iterable[Obj]) -> list[str] | None:
    """None if ``pod`` can run on ``node`` next to ``pods_on_node``; else every reason.

    ``pods_on_node`` may include terminal pods (ignored) and the pod itself (ignored).
    """
    return pod_fits(pod, node, usage_of(pods_on_node, but=pod))


def pod_fits(pod: Obj, node: Obj, usage: NodeUsage, share: Share | None = None) -> list[str] | None:
    """None if ``pod`` (whose ``share_of`` is ``share``, when known) can run on ``node``
    beside what its other pods take (``usage``); else every reason."""
    spec = spec_of(pod)
    node_spec = spec_of(node)
    tolerations = spec.get("tolerations") or []
    reasons: list[str] = []

    if node_spec.get("unschedulable") and not _tolerated(
        tolerations, {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}
    ):
        reasons.append("node(s) were unschedulable")

    for taint in node_spec.get("taints") or ():
        if taint.get("effect") in FILTERING_TAINT_EFFECTS and not _tolerated(tolerations, taint):
            reasons.append(
                f"node(s) had untolerated taint {{{taint.get('key', '')}: "
                f"{taint.get('value', '')}}}"
            )
            break

    labels = meta_of(node).get("labels") or {}
    selector = spec.get("nodeSelector") or {}
    missing = sorted(f"{k}={v}" for k, v in selector.items() if labels.get(k) != v)
    if missing:
        reasons.append(
            f"node(s) didn't match Pod's node affinity/selector (nodeSelector {', '.join(missing)})"
        )
    elif not matches_required_affinity(pod, node):
        reasons.append("node(s) didn't match Pod's node affinity/selector (required node affinity)")

    if share is None:
        share = share_of(pod)
    reasons.extend(_resource_reasons(share, node, usage))

    if share.ports:
        used = usage.ports
        busy = sorted({w for w in share.ports if any(_ports_conflict(w, u) for u in used)})
        if busy:
            listed = ", ".join(f"{port}/{proto}" for proto, _ip, port in busy)
            reasons.append(f"node(s) didn't have free ports for the requested pod ports ({listed})")

    return reasons or None


def _resource_reasons(share: Share, node: Obj, usage: NodeUsage) -> list[str]:
    allocatable = status_of(node).get("allocatable") or {}
    reasons: list[str] = []
    max_pods = quantity_units(allocatable.get("pods", 0), "pods")
    if usage.pods + 1 > max_pods:
        reasons.append(f"Too many pods (node allows {max_pods}, {usage.pods} already running)")
    for name, want in sorted(share.units):
        if want <= 0:
            continue
        have = quantity_units(allocatable.get(name, 0), name) - usage.units.get(name, 0)
        if want > have:
            reasons.append(
                f"Insufficient {name} (requested {format_units(want, name)}, "
                f"free {format_units(max(have, 0), name)})"
            )
    return reasons
