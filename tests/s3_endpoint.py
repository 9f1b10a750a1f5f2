"""A real S3 endpoint on loopback (moto's server mode) behind a proxy that can fail for a while."""

from __future__ import annotations

import http.client
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_SLOWDOWN = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message></Error>")


@contextmanager
def s3_env(port: int) -> Iterator[dict]:
    """The AWS variables that point s3fs at the endpoint on `port` (its bucket `frenzy` created), restored after."""
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{port}"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()
        fs = s3fs.S3FileSystem()
        if not fs.exists("frenzy"):  # moto's buckets live in the process: an earlier test's server may have made it
            fs.mkdir("frenzy")
        yield env
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FlakyProxy:
    """Forwards HTTP to `upstream_port`; while failing, answers every request 503 SlowDown (as S3 does). `only`: the
    failure hits only requests whose path holds it (a Prefect API route), and `fail_next(n)` fails the next n of those.
    `retry_after`: the 503s carry `Retry-After: N` (a Prefect client sleeps 2 s after each 503 without one, even when
    it has no retry left)."""

    def __init__(self, upstream_port: int, only: str = "", retry_after: str | None = None) -> None:
        self.upstream_port, self.only, self.retry_after = upstream_port, only, retry_after
        self.fail_until = 0.0
        self.to_fail = 0
        self.failed = 0
        self.forwarded = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: object) -> None:
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0], 16)
                        if size == 0:
                            self.rfile.readline()
                            return out
                        out += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))

            def _handle(self) -> None:
                body = self._body()
                if proxy.failing(self.path):
                    proxy.failed += 1
                    self.send_response(503)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(_SLOWDOWN)))
                    if proxy.retry_after is not None:
                        self.send_header("Retry-After", proxy.retry_after)
                    self.end_headers()
                    self.wfile.write(_SLOWDOWN)
                    return
                proxy.forwarded += 1
                conn = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "transfer-encoding"}
                headers["Content-Length"] = str(len(body))
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "content-length", "connection", "server", "date"):
                        self.send_header(k, v)
                # a HEAD answer carries the object's length, not the (empty) body's
                length = resp.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self.port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def fail_for(self, seconds: float) -> None:
        self.fail_until = time.monotonic() + seconds

    def fail_next(self, n: int) -> None:
        self.to_fail = n

    def failing(self, path: str) -> bool:
        if self.only not in path:
            return False
        if self.to_fail > 0:
            self.to_fail -= 1
            return True
        return time.monotonic() < self.fail_until

    def __enter__(self) -> FlakyProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
