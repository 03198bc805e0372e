"""envtest's admin HTTP client on the standard library: what setup code relies on."""

from __future__ import annotations

from sdgruntime.envtest.adminhttp import Headers, _query


def test_headers_are_found_in_any_case_and_repeats_are_joined() -> None:
    h = Headers([("Content-Type", "application/json"), ("Warning", "a"), ("warning", "b")])
    assert h["content-type"] == h["Content-Type"] == "application/json"
    assert h.get("WARNING") == "a, b" and "Warning" in h
    assert h.get("missing", "") == ""


def test_query_parameters_are_what_the_api_server_parses() -> None:
    assert _query({"watch": True, "force": False, "limit": 5, "continue": None}) == (
        "watch=true&force=false&limit=5&continue="
    )
    assert _query({"labelSelector": "app=web,tier in (a,b)"}) == (
        "labelSelector=app%3Dweb%2Ctier+in+%28a%2Cb%29"
    )
