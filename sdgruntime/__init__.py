"""sdgruntime: a controller runtime for Kubernetes in Python, after controller-runtime.

The public API is importable from here; see docs/index.md. Names are resolved on
first use (PEP 562), so ``import sdgruntime.kinds`` stays cheap for code that needs no
client or manager.

sdgruntime is its own distribution (``sdgruntime/pyproject.toml``); ``__version__`` is its
version, which that project's build reads (setuptools' ``attr:``): one place to bump it.
"""

from __future__ import annotations

__version__ = "0.1.0"

from importlib import import_module
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    # reconcile
    "Request": "sdgruntime.reconcile",
    "Result": "sdgruntime.reconcile",
    "Reconciler": "sdgruntime.reconcile",
    "ReconcilerFunc": "sdgruntime.reconcile",
    "TerminalError": "sdgruntime.reconcile",
    # controller, handlers, predicates, builder
    "Controller": "sdgruntime.controller",
    "Builder": "sdgruntime.builder",
    "EventHandler": "sdgruntime.handler",
    "EnqueueRequestForObject": "sdgruntime.handler",
    "EnqueueRequestForOwner": "sdgruntime.handler",
    "EnqueueRequestsFromMapFunc": "sdgruntime.handler",
    "Predicate": "sdgruntime.predicate",
    "Funcs": "sdgruntime.predicate",
    "GenerationChangedPredicate": "sdgruntime.predicate",
    "LabelChangedPredicate": "sdgruntime.predicate",
    "AnnotationChangedPredicate": "sdgruntime.predicate",
    "ResourceVersionChangedPredicate": "sdgruntime.predicate",
    "And": "sdgruntime.predicate",
    "Or": "sdgruntime.predicate",
    "Not": "sdgruntime.predicate",
    "LabelSelectorPredicate": "sdgruntime.predicate",
    "label_selector_predicate": "sdgruntime.predicate",
    # controllerutil
    "AlreadyOwnedError": "sdgruntime.controllerutil",
    "OperationResult": "sdgruntime.controllerutil",
    "add_finalizer": "sdgruntime.controllerutil",
    "contains_finalizer": "sdgruntime.controllerutil",
    "create_or_patch": "sdgruntime.controllerutil",
    "create_or_update": "sdgruntime.controllerutil",
    "is_controlled_by": "sdgruntime.controllerutil",
    "remove_finalizer": "sdgruntime.controllerutil",
    "set_controller_reference": "sdgruntime.controllerutil",
    "set_owner_reference": "sdgruntime.controllerutil",
    # status conditions
    "find_status_condition": "sdgruntime.conditions",
    "is_status_condition_false": "sdgruntime.conditions",
    "is_status_condition_true": "sdgruntime.conditions",
    "remove_status_condition": "sdgruntime.conditions",
    "set_status_condition": "sdgruntime.conditions",
    # logging
    "from_context": "sdgruntime.log",
    "setup_logging": "sdgruntime.log",
    # manager, leader election, tracing
    "Manager": "sdgruntime.manager",
    "ManagerOptions": "sdgruntime.manager",
    "LeaderElector": "sdgruntime.leaderelection",
    "LeaderElectionLost": "sdgruntime.leaderelection",
    "setup_tracing": "sdgruntime.tracing",
    # building blocks
    "Client": "sdgruntime.client",
    "Cache": "sdgruntime.cache",
    "Kind": "sdgruntime.kinds",
    "discover_kind": "sdgruntime.discovery",
    "EventRecorder": "sdgruntime.events",
    "WorkQueue": "sdgruntime.workqueue",
    "WebhookServer": "sdgruntime.webhook",
}

__all__ = [
    "AlreadyOwnedError",
    "And",
    "AnnotationChangedPredicate",
    "Builder",
    "Cache",
    "Client",
    "Controller",
    "EnqueueRequestForObject",
    "EnqueueRequestForOwner",
    "EnqueueRequestsFromMapFunc",
    "EventHandler",
    "EventRecorder",
    "Funcs",
    "GenerationChangedPredicate",
    "Kind",
    "LabelChangedPredicate",
    "LabelSelectorPredicate",
    "LeaderElectionLost",
    "LeaderElector",
    "Manager",
    "ManagerOptions",
    "Not",
    "OperationResult",
    "Or",
    "Predicate",
    "Reconciler",
    "ReconcilerFunc",
    "Request",
    "ResourceVersionChangedPredicate",
    "Result",
    "TerminalError",
    "WebhookServer",
    "WorkQueue",
    "add_finalizer",
    "contains_finalizer",
    "create_or_patch",
    "create_or_update",
    "discover_kind",
    "find_status_condition",
    "from_context",
    "is_controlled_by",
    "is_status_condition_false",
    "is_status_condition_true",
    "label_selector_predicate",
    "remove_finalizer",
    "remove_status_condition",
    "set_controller_reference",
    "set_owner_reference",
    "set_status_condition",
    "setup_logging",
    "setup_tracing",
]
assert set(__all__) == set(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sdgruntime' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


if TYPE_CHECKING:
    from sdgruntime.builder import Builder
    from sdgruntime.cache import Cache
    from sdgruntime.client import Client
    from sdgruntime.conditions import (
        find_status_condition,
        is_status_condition_false,
        is_status_condition_true,
        remove_status_condition,
        set_status_condition,
    )
    from sdgruntime.controller import Controller
    from sdgruntime.controllerutil import (
        AlreadyOwnedError,
        OperationResult,
        add_finalizer,
        contains_finalizer,
        create_or_patch,
        create_or_update,
        is_controlled_by,
        remove_finalizer,
        set_controller_reference,
        set_owner_reference,
    )
    from sdgruntime.discovery import discover_kind
    from sdgruntime.events import EventRecorder
    from sdgruntime.handler import (
        EnqueueRequestForObject,
        EnqueueRequestForOwner,
        EnqueueRequestsFromMapFunc,
        EventHandler,
    )
    from sdgruntime.kinds import Kind
    from sdgruntime.leaderelection import LeaderElectionLost, LeaderElector
    from sdgruntime.log import from_context, setup_logging
    from sdgruntime.manager import Manager, ManagerOptions
    from sdgruntime.predicate import (
        And,
        AnnotationChangedPredicate,
        Funcs,
        GenerationChangedPredicate,
        LabelChangedPredicate,
        LabelSelectorPredicate,
        Not,
        Or,
        Predicate,
        ResourceVersionChangedPredicate,
        label_selector_predicate,
    )
    from sdgruntime.reconcile import Reconciler, ReconcilerFunc, Request, Result, TerminalError
    from sdgruntime.tracing import setup_tracing
    from sdgruntime.webhook import WebhookServer
    from sdgruntime.workqueue import WorkQueue
