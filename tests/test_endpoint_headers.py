"""The endpoint reads a request's header block itself (http.server's email
parser was most of its own cost a turn): as that parser reads what clients
send, and refusing what http.server refuses."""

from __future__ import annotations

import email.utils
import socket
import time
from http import HTTPStatus

import pytest

from pytest_evalreplay.model import Generation
from pytest_evalreplay.run.endpoint import MAX_HEADERS, Endpoint, Headers, read_headers


def lines(*raw: bytes) -> list[bytes]:
    return [*raw, b"\r\n"]


def test_headers_are_read_by_any_case_of_their_name() -> None:
    got = read_headers(lines(b"Content-Length: 12\r\n", b"authorization:Bearer  t \r\n", b"X-A: 1\n"))
    assert isinstance(got, Headers)
    assert got.get("content-length") == "12" and got.get("Authorization") == "Bearer  t"
    assert got.get("x-a") == "1" and got.get("Expect", "") == "" and got.get("Connection") is None


def test_a_folded_line_joins_its_header_and_a_repeated_header_keeps_its_last() -> None:
    got = read_headers(lines(b"X-Long: one\r\n", b"\t two\r\n", b"X-Twice: a\r\n", b"x-twice: b\r\n"))
    assert got == {"x-long": "one two", "x-twice": "b"}


@pytest.mark.parametrize(
    ("raw", "status", "reason"),
    [
        ([b"X: " + b"a" * 70_000 + b"\r\n"], HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Line too long"),
        ([b"X: 1\r\n"] * (MAX_HEADERS + 1), HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Too many headers"),
        ([b"no colon here\r\n"], HTTPStatus.BAD_REQUEST, "Bad header line ('no colon here')"),
        ([b"Bad Name : 1\r\n"], HTTPStatus.BAD_REQUEST, "Bad header line ('Bad Name : 1')"),
    ],
)
def test_a_header_block_http_server_refuses_is_refused(raw, status, reason) -> None:
    assert read_headers(lines(*raw)) == (status, reason)


def test_a_block_cut_off_ends_where_the_connection_did() -> None:
    assert read_headers([b"Host: x\r\n", b""]) == {"host": "x"}


class _Ok:
    def serve(self, messages, tools, sampling):
        return Generation("ok", finish_reason="stop", prompt_tokens=1, completion_tokens=1)


def exchange(port: int, request: bytes) -> bytes:
    """Send `request`, read until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(request)
        out = b""
        while chunk := conn.recv(65536):
            out += chunk
    return out


def test_the_endpoint_serves_folded_lowercase_headers_and_closes_when_asked() -> None:
    endpoint = Endpoint("m")
    try:
        url = endpoint.open(_Ok())
        path = url.split(str(endpoint.port), 1)[1] + "/chat/completions"
        body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
        head = (
            f"POST {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer\r\n {endpoint.token}\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        answer = exchange(endpoint.port, head.encode() + body)  # returns: the server closed it
        assert answer.startswith(b"HTTP/1.1 200 ") and b'"content":"ok"' in answer
        date = next(line for line in answer.split(b"\r\n") if line.startswith(b"Date: "))[6:]
        assert abs(email.utils.parsedate_to_datetime(date.decode()).timestamp() - time.time()) < 5
        refused = exchange(endpoint.port, f"GET {path} HTTP/2.0\r\n\r\n".encode())
        assert refused.startswith(b"HTTP/1.1 505 ")
        many = "".join(f"x-{n}: 1\r\n" for n in range(MAX_HEADERS + 1))
        assert exchange(endpoint.port, f"GET {path} HTTP/1.1\r\n{many}\r\n".encode()).startswith(
            b"HTTP/1.1 431 "
        )
    finally:
        endpoint.stop()
