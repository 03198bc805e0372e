"""sdgruntime: a controller runtime for Kubernetes in Python, after controller-runtime.

The public API is importable from here; see docs/sdgruntime.md. Names are resolved on
first use (PEP 562), so ``import sdgruntime.kinds`` stays cheap for code that needs no
client or manager.
"""

from __future__ import annotations

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
    "EventRecorder": "sdgruntime.events",
    "WorkQueue": "sdgruntime.workqueue",
    "WebhookServer": "sdgruntime.webhook",
}

__all__ = [
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
    "LeaderElectionLost",
    "LeaderElector",
    "Manager",
    "ManagerOptions",
    "Not",
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
    from sdgruntime.controller import Controller
    from sdgruntime.events import EventRecorder
    from sdgruntime.handler import (
        EnqueueRequestForObject,
        EnqueueRequestForOwner,
        EnqueueRequestsFromMapFunc,
        EventHandler,
    )
    from sdgruntime.kinds import Kind
    from sdgruntime.leaderelection import LeaderElectionLost, LeaderElector
    from sdgruntime.manager import Manager, ManagerOptions
    from sdgruntime.predicate import (
        And,
        AnnotationChangedPredicate,
        Funcs,
        GenerationChangedPredicate,
        LabelChangedPredicate,
        Not,
        Or,
        Predicate,
        ResourceVersionChangedPredicate,
    )
    from sdgruntime.reconcile import Reconciler, ReconcilerFunc, Request, Result, TerminalError
    from sdgruntime.tracing import setup_tracing
    from sdgruntime.webhook import WebhookServer
    from sdgruntime.workqueue import WorkQueue
