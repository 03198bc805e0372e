"""Prometheus metrics with controller-runtime's and client-go's names and labels.

All metrics live in one registry (``REGISTRY``) that the manager serves on ``/metrics``;
applications add their own metrics to the same registry.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

_RECONCILE_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.15,
    0.2,
    0.25,
    0.3,
    0.35,
    0.4,
    0.45,
    0.5,
    0.6,
    0.7,
    0.8,
    0.9,
    1.0,
    1.25,
    1.5,
    1.75,
    2.0,
    2.5,
    3.0,
    3.5,
    4.0,
    4.5,
    5,
    6,
    7,
    8,
    9,
    10,
    15,
    20,
    25,
    30,
    40,
    50,
    60,
)
_QUEUE_BUCKETS = tuple(10.0**e for e in range(-8, 2))  # 10ns .. 10s, as client-go

# --- controller -----------------------------------------------------------------------
RECONCILE_TOTAL = Counter(
    "controller_runtime_reconcile_total",
    "Total number of reconciliations per controller",
    ["controller", "result"],
    registry=REGISTRY,
)
RECONCILE_ERRORS = Counter(
    "controller_runtime_reconcile_errors_total",
    "Total number of reconciliation errors per controller",
    ["controller"],
    registry=REGISTRY,
)
TERMINAL_RECONCILE_ERRORS = Counter(
    "controller_runtime_terminal_reconcile_errors_total",
    "Total number of terminal reconciliation errors per controller",
    ["controller"],
    registry=REGISTRY,
)
RECONCILE_TIME = Histogram(
    "controller_runtime_reconcile_time_seconds",
    "Length of time per reconciliation per controller",
    ["controller"],
    buckets=_RECONCILE_BUCKETS,
    registry=REGISTRY,
)
ACTIVE_WORKERS = Gauge(
    "controller_runtime_active_workers",
    "Number of currently used workers per controller",
    ["controller"],
    registry=REGISTRY,
)
MAX_CONCURRENT_RECONCILES = Gauge(
    "controller_runtime_max_concurrent_reconciles",
    "Maximum number of concurrent reconciles per controller",
    ["controller"],
    registry=REGISTRY,
)

# --- workqueue (labels: name, controller; both carry the controller's name) ------------
_WQ = ["name", "controller"]
WORKQUEUE_DEPTH = Gauge("workqueue_depth", "Current depth of workqueue", _WQ, registry=REGISTRY)
WORKQUEUE_ADDS = Counter(
    "workqueue_adds_total", "Total number of adds handled by workqueue", _WQ, registry=REGISTRY
)
WORKQUEUE_QUEUE_DURATION = Histogram(
    "workqueue_queue_duration_seconds",
    "How long in seconds an item stays in workqueue before being requested",
    _WQ,
    buckets=_QUEUE_BUCKETS,
    registry=REGISTRY,
)
WORKQUEUE_WORK_DURATION = Histogram(
    "workqueue_work_duration_seconds",
    "How long in seconds processing an item from workqueue takes",
    _WQ,
    buckets=_QUEUE_BUCKETS,
    registry=REGISTRY,
)
WORKQUEUE_UNFINISHED_WORK = Gauge(
    "workqueue_unfinished_work_seconds",
    "How many seconds of work has been done that is in progress and hasn't been observed by "
    "work_duration. Large values indicate stuck threads.",
    _WQ,
    registry=REGISTRY,
)
WORKQUEUE_LONGEST_RUNNING = Gauge(
    "workqueue_longest_running_processor_seconds",
    "How many seconds has the longest running processor for workqueue been running.",
    _WQ,
    registry=REGISTRY,
)
WORKQUEUE_RETRIES = Counter(
    "workqueue_retries_total",
    "Total number of retries handled by workqueue",
    _WQ,
    registry=REGISTRY,
)

# --- webhook ---------------------------------------------------------------------------
WEBHOOK_LATENCY = Histogram(
    "controller_runtime_webhook_latency_seconds",
    "Histogram of the latency of processing admission requests",
    ["webhook"],
    registry=REGISTRY,
)
WEBHOOK_REQUESTS = Counter(
    "controller_runtime_webhook_requests_total",
    "Total number of admission requests by HTTP status code.",
    ["webhook", "code"],
    registry=REGISTRY,
)
WEBHOOK_IN_FLIGHT = Gauge(
    "controller_runtime_webhook_requests_in_flight",
    "Current number of admission requests being served.",
    ["webhook"],
    registry=REGISTRY,
)

# --- leader election and REST client ---------------------------------------------------
LEADER_ELECTION_STATUS = Gauge(
    "leader_election_master_status",
    "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, "
    "1 indicates master. 'name' is the string used to identify the lease.",
    ["name"],
    registry=REGISTRY,
)
REST_CLIENT_REQUESTS = Counter(
    "rest_client_requests_total",
    "Number of HTTP requests, partitioned by status code, method, and host.",
    ["code", "method", "host"],
    registry=REGISTRY,
)
REST_CLIENT_LATENCY = Histogram(
    "rest_client_request_duration_seconds",
    "Request latency in seconds. Broken down by verb and host.",
    ["verb", "host"],
    registry=REGISTRY,
)

# --- Events -----------------------------------------------------------------------------
EVENTS_QUEUED = Gauge(
    "sdgruntime_events_queued",
    "Events emitted and not yet taken by a writer, by component: a backlog that grows "
    "while a burst is written at the manager's event_qps",
    ["component"],
    registry=REGISTRY,
)
EVENTS_DROPPED = Counter(
    "sdgruntime_events_dropped_total",
    "Events emitted but never written, by component: the buffer was full, the recorder "
    "was not running, or they were still queued or in flight when a stop's deadline came",
    ["component"],
    registry=REGISTRY,
)

# --- HTTP servers ---------------------------------------------------------------------
HTTP_CONNECTIONS = Counter(
    "sdgruntime_http_connections_total",
    "Connections served by sdgruntime's HTTP servers, by server and negotiated protocol "
    "(http/1.1); a fast-growing count means clients reconnect instead of reusing",
    ["server", "protocol"],
    registry=REGISTRY,
)
