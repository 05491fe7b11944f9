#!/usr/bin/env python3
"""The hostile requests of issue #31, measured against `moeserve serve` (by hand).

Each row starts a fresh server on the default model (loopback only), reads its resident memory,
sends the request (or opens the connections) and prints the answer's status, its size, how long
it took and how much the server's resident memory grew. A last row sends every hostile request
to one server and checks that its memory returns to within 10 % of where it started.

  scripts/hostile_requests.py [--binary build/release/cli/moeserve] [--model models/default]

Standard library only; results go to stdout as a Markdown table (docs/reliability.md).
"""
import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, binary, model, extra=()):
        self.port = free_port()
        self.log = open(f"/tmp/hostile_{self.port}.log", "w")
        self.proc = subprocess.Popen(
            [binary, "serve", "--model", model, "--port", str(self.port), *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if self.request("GET", "/health")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        else:
            raise RuntimeError("the server did not become healthy")
        time.sleep(0.5)

    def rss_mb(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return -1

    def request(self, method, path, body=None, headers=None, timeout=600):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        payload = r.read()
        c.close()
        return r.status, payload

    def raw(self, data, read_timeout=5.0, send_timeout=10.0):
        """Sends raw bytes (as far as the server takes them) and reads until it closes."""
        s = socket.create_connection(("127.0.0.1", self.port))
        s.settimeout(send_timeout)
        try:
            s.sendall(data)
        except OSError:
            pass
        s.settimeout(read_timeout)
        out = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                out += chunk
        except OSError:
            pass
        s.close()
        return out

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)
        self.log.close()


def status_of(raw):
    return int(raw[9:12]) if raw.startswith(b"HTTP/1.1 ") else None


def measure(server, send):
    before = server.rss_mb()
    start = time.time()
    status, size, note = send(server)
    seconds = time.time() - start
    time.sleep(0.3)
    return status, size, seconds, server.rss_mb() - before, note


def greedy_latency(server):
    start = time.time()
    server.request("POST", "/v1/completions",
                   {"prompt": "And it came", "max_tokens": 2, "temperature": 0})
    return time.time() - start


def completion(body):
    def send(server):
        status, payload = server.request("POST", "/v1/completions", body)
        return status, len(payload), payload[:160].decode(errors="replace")
    return send


def with_parallel_small(body):
    """The request, and a 2-token greedy request sent while it is being admitted."""
    def send(server):
        result = {}
        t = threading.Thread(target=lambda: result.update(
            big=server.request("POST", "/v1/completions", body)))
        t.start()
        time.sleep(0.05)
        small = greedy_latency(server)
        t.join()
        status, payload = result["big"]
        return status, len(payload), f"a parallel 2-token request took {small:.3f} s"
    return send


def raw_send(data, **kw):
    def send(server):
        out = server.raw(data, **kw)
        return status_of(out), len(out), out[:160].decode(errors="replace").split("\r\n")[0]
    return send


def chunked_body(total):
    piece = b"x" * 65536
    out = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
           b"Content-Type: application/json\r\n\r\n")
    for _ in range(total // len(piece)):
        out += b"%x\r\n" % len(piece) + piece + b"\r\n"
    return out + b"0\r\n\r\n"


def many_headers(n):
    return b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-a: b\r\n" * n + b"\r\n"


def pipelined(server):
    out = server.raw(b"GET /version HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * 2 +
                     b"GET /version HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    return status_of(out), len(out), f"{out.count(b'HTTP/1.1 200')} answers"


def content_parts(server):
    status, payload = server.request("POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Elizabeth was"}]}],
        "max_tokens": 1})
    usage = json.loads(payload).get("usage", {}) if status == 200 else {}
    plain_status, plain = server.request("POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Elizabeth was"}], "max_tokens": 1})
    plain_usage = json.loads(plain).get("usage", {}) if plain_status == 200 else {}
    return status, len(payload), (f"{usage.get('prompt_tokens')} prompt tokens "
                                  f"(plain string: {plain_usage.get('prompt_tokens')})")


def cross_origin(server):
    body = json.dumps({"prompt": "hi", "max_tokens": 1}).encode()
    out = server.raw(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Origin: http://evil.example\r\nContent-Type: text/plain\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
    return status_of(out), len(out), out.split(b"\r\n\r\n", 1)[-1][:120].decode(errors="replace")


def rows():
    v = 8192
    a200 = " ".join(["a"] * 200)
    return [
        ("64 prompts x n 64", completion(
            {"prompt": ["a"] * 64, "n": 64, "temperature": 1, "max_tokens": 1})),
        ("8 prompts x n 8 (at the cap)", completion(
            {"prompt": ["a"] * 8, "n": 8, "temperature": 1, "max_tokens": 1})),
        ("stop 1 MiB, n 64", completion(
            {"prompt": "a", "stop": ["x" * (1 << 20)], "n": 64, "temperature": 1, "max_tokens": 1})),
        ("prompt_logprobs -1, 200 tokens", completion(
            {"prompt": a200, "prompt_logprobs": -1, "max_tokens": 1})),
        ("logprobs -1", completion({"prompt": "a", "logprobs": -1, "max_tokens": 8})),
        ("logprobs 21", completion({"prompt": "a", "logprobs": 21, "max_tokens": 8})),
        ("logprobs 20 (at the cap)", completion({"prompt": "a", "logprobs": 20, "max_tokens": 8})),
        ("logit_bias over the vocabulary, n 1024", with_parallel_small(
            {"prompt": "a", "n": 1024, "temperature": 1, "max_tokens": 2,
             "logit_bias": {str(i): 0.5 for i in range(v)}})),
        ("logit_bias over the vocabulary, n 64", with_parallel_small(
            {"prompt": "a", "n": 64, "temperature": 1, "max_tokens": 2,
             "logit_bias": {str(i): 0.5 for i in range(v)}})),
        ("20 MiB chunked body", raw_send(chunked_body(20 << 20))),
        ("32 MB header line", raw_send(
            b"GET /health HTTP/1.1\r\nX-Long: " + b"a" * (32 << 20))),
        ("1,000,000 headers", raw_send(many_headers(1_000_000))),
        ("3 pipelined GETs", pipelined),
        ("content parts", content_parts),
        ("Origin: http://evil.example", cross_origin),
        ("Host: evil.example", raw_send(
            b"GET /v1/models HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n")),
        ("1 MB model name", completion({"model": "m" * (1 << 20), "prompt": "a"})),
        ("1 MB /tokenize prompt", lambda s: (lambda r: (r[0], len(r[1]), r[1][:120].decode()))(
            s.request("POST", "/tokenize", {"prompt": "word " * 200_000}))),
        ("response_format json_object", completion(
            {"prompt": "a", "response_format": {"type": "json_object"}})),
    ]


def table(args):
    print("| request | status | answer bytes | seconds | resident memory growth | note |")
    print("|---|---|---|---|---|---|")
    for name, send in rows():
        server = Server(args.binary, args.model)
        try:
            status, size, seconds, grown, note = measure(server, send)
        finally:
            server.stop()
        note = note.replace("|", "\\|").replace("\n", " ")
        print(f"| {name} | {status} | {size} | {seconds:.3f} | {grown:+.1f} MB | {note} |",
              flush=True)


def summary(args):
    # Every row on one server, three times over: memory after, against before. The first pass
    # warms the server up (a first generation faults in the engine's scratch and cache pages,
    # ~40 MB on the default model, kept as a cache's are), and is reported too.
    server = Server(args.binary, args.model, args.serve_args.split())
    try:
        loaded = server.rss_mb()
        for name, send in rows():
            send(server)
        time.sleep(1.0)
        warm = server.rss_mb()
        for _ in range(3):
            for name, send in rows():
                send(server)
        time.sleep(1.0)
        end = server.rss_mb()
        print(f"\nall rows on one server: resident {loaded:.1f} MB once loaded, {warm:.1f} MB "
              f"after a first pass, {end:.1f} MB after three more "
              f"({(end - warm) / warm * 100:+.1f} % over the three)")
    finally:
        server.stop()

    # With --api-key and no key: a 24 MiB body announced, refused before it is read.
    server = Server(args.binary, args.model, ["--api-key", "k"])
    try:
        s = socket.create_connection(("127.0.0.1", server.port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                  b"Content-Length: 25165824\r\n\r\n")
        start = time.time()
        s.settimeout(5)
        answer = s.recv(4096)
        print(f"--api-key, no key, 24 MiB announced: {status_of(answer)} after "
              f"{time.time() - start:.3f} s, nothing of the body sent")
        s.close()
    finally:
        server.stop()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--binary", default=os.path.join(ROOT, "build/release/cli/moeserve"))
    p.add_argument("--model", default=os.path.join(ROOT, "models/default"))
    p.add_argument("--serve-args", default="--kv-cache-memory 0.015 --state-cache-memory 0.015",
                   help="more flags for the summary's server: by default caches small enough "
                        "that the warm-up pass touches all of their pages (a cache's pages are "
                        "backed as they are first written and then kept, so a large one grows "
                        "resident memory pass after pass until it is all touched)")
    p.add_argument("--summary-only", action="store_true",
                   help="skip the per-row table (a fresh server per row)")
    args = p.parse_args()
    if not args.summary_only:
        table(args)
    summary(args)



if __name__ == "__main__":
    sys.exit(main())
