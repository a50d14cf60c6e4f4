"""``bench.metrics``' scraper client, which reads HTTP answers on a plain
socket by their Content-Length: against a real HTTP/1.1 server on 127.0.0.1
it reads each answer whole on one kept connection, opens a new one when the
server closed the last, and refuses a status it was not to get."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench.metrics import CONTROL_PATH, _Client


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    connections: set[int] = set()  # the client ports seen, one per connection
    close_after_answer = False

    def do_GET(self) -> None:
        type(self).connections.add(self.client_address[1])
        if self.path == CONTROL_PATH:
            status, body = 404, b"no such path\n"
        elif self.path == "/no-length":
            self.send_response(200)
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            self.wfile.write(b"a body the client cannot measure")
            return
        elif self.path.startswith("/size/"):
            status, body = 200, bytes(range(256)) * (int(self.path[6:]) // 256) + b"x" * (int(self.path[6:]) % 256)
        else:
            status, body = 500, b"failed\n"
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        if type(self).close_after_answer:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, type[_Handler]]]:
    handler = type("Handler", (_Handler,), {"connections": set(), "close_after_answer": False})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


@pytest.mark.parametrize("size", [0, 1, 300, 28_000, 1_000_000])
def test_each_answer_is_read_whole_on_one_kept_connection(server: tuple[str, type[_Handler]], size: int) -> None:
    url, handler = server
    client = _Client(f"{url}/size/{size}")
    try:
        assert [client.get() for _ in range(5)] == [size] * 5
    finally:
        client.close()
    assert len(handler.connections) == 1


def test_a_connection_the_server_closed_is_opened_again(server: tuple[str, type[_Handler]]) -> None:
    url, handler = server
    handler.close_after_answer = True
    client = _Client(f"{url}/size/5000")
    try:
        assert [client.get() for _ in range(3)] == [5000] * 3
    finally:
        client.close()
    assert len(handler.connections) == 3


def test_the_control_path_must_answer_404_and_any_other_200(server: tuple[str, type[_Handler]]) -> None:
    url, _ = server
    control = _Client(url + CONTROL_PATH)
    failing = _Client(url + "/broken")
    try:
        assert control.get() == len(b"no such path\n")
        with pytest.raises(RuntimeError, match="/broken answered 500"):
            failing.get()
    finally:
        control.close()
        failing.close()


def test_an_answer_without_its_length_is_refused(server: tuple[str, type[_Handler]]) -> None:
    url, _ = server
    client = _Client(url + "/no-length")
    try:
        with pytest.raises(RuntimeError, match="without Content-Length: HTTP/1.1 200"):
            client.get()
    finally:
        client.close()
