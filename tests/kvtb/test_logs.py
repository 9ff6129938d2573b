"""kvtb.logs: JSON lines with the request id from the context or an explicit extra."""
import io
import json
import logging

from kvtb.logs import JsonFormatter, RequestIdFilter, json_wanted, request_context


def capture(formatter: logging.Formatter) -> tuple[logging.Logger, io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(formatter)
    logger = logging.getLogger(f"test-logs-{id(out)}")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger, out


def test_json_lines_carry_the_request_id_and_extras():
    logger, out = capture(JsonFormatter("smartnic"))
    with request_context("req-1"):
        logger.info("turn of %s", "alice", extra={"user_id": "alice", "bytes": 10})
    logger.info("explicit", extra={"request_id": "req-2"})
    logger.info("none")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines[0]["request_id"] == "req-1" and lines[0]["message"] == "turn of alice"
    assert lines[0]["user_id"] == "alice" and lines[0]["bytes"] == 10 and lines[0]["service"] == "smartnic"
    assert lines[1]["request_id"] == "req-2" and "request_id" not in lines[2]


def test_text_lines_tag_the_request(monkeypatch):
    from kvtb.logs import TEXT_FORMAT
    logger, out = capture(logging.Formatter(TEXT_FORMAT))
    with request_context("req-9"):
        logger.info("hello")
    assert "[req-9]: hello" in out.getvalue()
    monkeypatch.setenv("KVTB_LOG_JSON", "1")
    assert json_wanted() and not json_wanted.__defaults__[0]
