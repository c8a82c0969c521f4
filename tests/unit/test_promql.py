"""core.control.promql query text, and operator.prometheus' classification of every kind of answer."""

from __future__ import annotations

import json

from metainfer.core.api.conditions import Reason
from metainfer.core.control.promql import escape_regex, p95_query, substitute
from metainfer.operator.prometheus import MetricsUnavailable, Sample, parse

FP = "0123456789abcdef"


def test_default_query_reads_compute_time_not_queue_wait() -> None:
    """A traffic surge queues requests on unchanged hardware: drift must not read that as the variant slowing."""
    assert p95_query("digits", "prod", FP, 300) == (
        "histogram_quantile(0.95, sum by (le) (rate(metainfer_inference_compute_seconds_bucket"
        '{policy="digits",hardware_class="0123456789abcdef",namespace=~"prod|"}[300s])))'
    )


def test_override_placeholders_are_replaced_literally() -> None:
    template = 'max(my_p95{svc="{policy}",ns="{namespace}",cls="{class}"}[{window}]) or vector({window_x})'
    out = p95_query("digits", "prod", FP, 60, template)
    assert out == f'max(my_p95{{svc="digits",ns="prod",cls="{FP}"}}[60s]) or vector({{window_x}})'
    assert substitute("{class}{class}", "p", "n", FP, 10) == FP * 2


def test_escaping() -> None:
    assert 'policy="a\\"b"' in p95_query('a"b', "n", FP, 10)
    assert escape_regex("a.b") == "a\\\\.b"  # RE2 escape, then string escape


def _vector(*values: str) -> str:
    result = [{"metric": {}, "value": [1700000000.0, v]} for v in values]
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}})


def test_classification() -> None:
    assert parse(200, _vector("0.0125")) == Sample(0.0125)
    assert parse(200, json.dumps({"status": "success", "data": {"resultType": "scalar", "result": [1, "0.5"]}})) == (
        Sample(0.5)
    )
    cases = {
        _vector(): Reason.NO_DATA,
        _vector("NaN"): Reason.NO_DATA,
        _vector("+Inf"): Reason.NO_DATA,
        _vector("0.1", "0.2"): Reason.PROMETHEUS_ERROR,
        json.dumps({"status": "error", "errorType": "bad_data", "error": "parse error"}): Reason.PROMETHEUS_ERROR,
        "<html>502 Bad Gateway</html>": Reason.PROMETHEUS_ERROR,
        json.dumps({"status": "success", "data": {"resultType": "matrix", "result": []}}): Reason.PROMETHEUS_ERROR,
    }
    for text, reason in cases.items():
        got = parse(502 if "html" in text else 200, text, "http://p")
        assert isinstance(got, MetricsUnavailable) and got.reason == reason, (text, got)
        assert got.message
    bad = parse(400, json.dumps({"status": "error", "errorType": "bad_data", "error": "parse error at char 3"}))
    assert isinstance(bad, MetricsUnavailable) and "bad_data" in bad.message


def test_what_a_server_answers_never_reaches_the_status() -> None:
    # With the query URL under a policy author's control, the answer was copied back into status (an SSRF oracle).
    for status, text in [(200, "root:x:0:0:secret-token"), (500, json.dumps({"status": "error", "error": "secret"}))]:
        got = parse(status, text, "http://p")
        assert isinstance(got, MetricsUnavailable) and "secret" not in got.message


def test_unreachable_is_classified_not_raised() -> None:
    import asyncio
    import socket

    from metainfer.operator.prometheus import query

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once closed
    got = asyncio.run(query(f"http://127.0.0.1:{port}", "up", timeout_s=2))
    assert isinstance(got, MetricsUnavailable) and got.reason == Reason.PROMETHEUS_UNREACHABLE
    got = asyncio.run(query("not a url", "up", timeout_s=2))
    assert isinstance(got, MetricsUnavailable) and got.reason == Reason.PROMETHEUS_UNREACHABLE


def test_the_p99_query_is_the_p95_query_at_another_quantile() -> None:
    from metainfer.core.control.promql import p95_query, quantile_query

    p95 = p95_query("digits", "ml", "a" * 16, 300)
    assert quantile_query(0.99, "digits", "ml", "a" * 16, 300) == p95.replace(
        "histogram_quantile(0.95,", "histogram_quantile(0.99,"
    )
