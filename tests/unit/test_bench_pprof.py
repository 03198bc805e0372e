"""S10's kube-apiserver parts: Go's CPU profile read back and split by what it was doing."""

from __future__ import annotations

import pytest

from hack.bench._pprof import OTHER, parse_traces, part_of, parts
from hack.bench.compare import S1_KUBE, S1_SDG, apiserver_ms, cost_parts

# `go tool pprof -traces` as it prints (header, then one block per stack, leaf first).
TRACES = """File: kube-apiserver
Build ID: 5c6dfab0d69cdcf4442b7c6cd5772de3d0ab2f5a
Type: cpu
Duration: 12s, Total samples = 10.53s (87.74%)
-----------+-------------------------------------------------------
      20ms   crypto/internal/fips140/nistec.p256MulInternal
             crypto/x509.(*Certificate).Verify
             k8s.io/apiserver/pkg/authentication/request/x509.(*Authenticator).AuthenticateRequest
             net/http.(*conn).serve
-----------+-------------------------------------------------------
      30ms   encoding/json.Marshal
             k8s.io/apiserver/pkg/admission/plugin/webhook/mutating.(*mutatingDispatcher).Dispatch
             k8s.io/apiserver/pkg/endpoints/handlers.CreateResource.createHandler.func1
             net/http.(*conn).serve
-----------+-------------------------------------------------------
      10ms   runtime.memmove
             k8s.io/apiserver/pkg/endpoints/handlers.CreateResource.createHandler.func1
             net/http.(*conn).serve
-----------+-------------------------------------------------------
   1.50s     runtime.futex
             runtime.gcBgMarkWorker
-----------+-------------------------------------------------------
     250us   runtime.usleep
             runtime.sysmon
"""


def test_traces_are_read_with_their_cpu_and_leaf_first_frames() -> None:
    stacks = parse_traces(TRACES)
    assert [secs for secs, _ in stacks] == pytest.approx([0.02, 0.03, 0.01, 1.5, 0.00025])
    assert stacks[0][1][0] == "crypto/internal/fips140/nistec.p256MulInternal"
    assert stacks[3][1] == ["runtime.futex", "runtime.gcBgMarkWorker"]


def test_a_sample_goes_to_the_most_specific_part_on_its_stack() -> None:
    # The webhook call runs inside a pod create: it is the webhook's, not the create's.
    assert parts(parse_traces(TRACES)) == pytest.approx(
        {
            "authn: client certificates": 0.02,
            "mutating webhook calls": 0.03,
            "creates (pods, Events, ...)": 0.01,
            "GC (background)": 1.5,
            "Go scheduler": 0.00025,
        }
    )
    assert part_of(["runtime.memmove", "net/http.(*conn).serve"]) == "connections in: reads, TLS"
    # the bench's own /metrics scrapes are named, so they are not taken for a contender's
    scrape = ["compress/flate.(*compressor).deflate", "promhttp.HandlerForTransactional.func1"]
    assert part_of([*scrape, "(*timeoutHandler).ServeHTTP.func1"]) == "bench: /metrics scrapes"
    assert part_of(["main.main"]) == OTHER
    # a CRD's status PATCH, outside its storage's Update: the patch handler's, not a filter's
    crd_patch = "k8s.io/apiextensions-apiserver/pkg/apiserver.(*crdHandler).serveStatus"
    handler = [f"{crd_patch}.PatchResource.func3", "(*timeoutHandler).ServeHTTP.func1"]
    assert part_of(["handlers.asPartialObjectMetadata", *handler]) == "updates and patches"


def test_parts_add_up_to_the_cpu_proc_measured() -> None:
    phase = {"cpu": {"kube-apiserver": 4.0}, "apiserver_parts": {"a": 3.0, "b": 1.0}}
    assert apiserver_ms(phase, 1000) == pytest.approx({"a": 3.0, "b": 1.0})
    assert apiserver_ms({"cpu": {"kube-apiserver": 4.0}}, 1000) == {}


def test_cost_parts_print_the_api_server_parts_of_each_run() -> None:
    out = {
        "phases": [
            {
                "name": S1_SDG,
                "pods": 1000,
                "cpu": {"kube-apiserver": 6.0},
                "apiserver_parts": {"mutating webhook calls": 1.0, "pods/binding POST": 2.0},
            },
            {
                "name": S1_KUBE,
                "pods": 1000,
                "cpu": {"kube-apiserver": 4.0},
                "apiserver_parts": {"pods/binding POST": 1.0},
            },
        ]
    }
    lines = cost_parts(out)
    assert "| kube-apiserver: pods/binding POST | 4.00 ms | 4.00 ms |" in lines
    assert "| kube-apiserver: mutating webhook calls | 2.00 ms | 0.00 ms |" in lines
