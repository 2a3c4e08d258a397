#!/usr/bin/env python3
"""cedar serve on each --device, same requests, same answers.

Starts one `cedar serve --model MODEL --device D` per device (random weights from the same seed),
then against each: a chat completion, the same chat streamed as SSE (its deltas must join to the
non-streamed text), a Responses call and a follow-up with previous_response_id, and the
Responses WebSocket mode (a turn and a follow-up; a standard-library client). Requests
are greedy (temperature 0), so every device must give the same text as the first one.
Requests go through curl (urllib when curl is absent). Prints one line per check; exit status 1 on any failure.

usage: serve_device_check.py --cedar 'bash .gpu/run cedar' [--model micro] [--devices cpu,cuda]
"""
import argparse
import json
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request

failures = []


def check(ok, what):
    print(("  ok    " if ok else "  FAIL  ") + what, flush=True)
    if not ok:
        failures.append(what)


def start_server(cedar, model, device, log_path):
    cmd = shlex.split(cedar) + ["serve", "--host", "127.0.0.1", "--port", "0", "--model", model,
                                "--device", device]
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    t0 = time.time()
    while time.time() - t0 < 300:
        text = open(log_path).read()
        m = re.search(r"listening on (http://[0-9.:]+)", text)
        if m:
            return proc, m.group(1), time.time() - t0
        if proc.poll() is not None:
            raise RuntimeError("server (%s) exited:\n%s" % (device, text[-2000:]))
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("server (%s) did not listen within 300 s" % device)


def curl(url, body, stream=False):
    if shutil.which("curl") is None:  # the same request through urllib
        req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            out = r.read().decode()
        return out if stream else json.loads(out)
    cmd = ["curl", "-sS", "--max-time", "120", "-H", "Content-Type: application/json", "-d", json.dumps(body), url]
    if stream:
        cmd.insert(1, "-N")
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return out if stream else json.loads(out)


def responses_text(r):
    return "".join(c.get("text", "") for o in r.get("output", []) if o.get("type") == "message"
                   for c in o.get("content", []))


def run_checks(base):
    """The answers of one server, by check name."""
    got = {}
    chat = {"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 12,
            "temperature": 0, "chat_template_kwargs": {"thinking": False}}
    r = curl(base + "/v1/chat/completions", chat)
    text = r["choices"][0]["message"]["content"] or ""
    check(r["object"] == "chat.completion" and r["usage"]["completion_tokens"] > 0,
          "chat: %d tokens, finish %s, text %r" % (r["usage"]["completion_tokens"], r["choices"][0]["finish_reason"], text[:40]))
    got["chat"] = text

    raw = curl(base + "/v1/chat/completions", dict(chat, stream=True), stream=True)
    check(raw.endswith("data: [DONE]\n\n"), "chat SSE ends with [DONE]")
    events = [json.loads(b[6:]) for b in raw.split("\n\n") if b.startswith("data: {")]
    streamed = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))
    check(streamed == text, "chat SSE: %d events, deltas join to the non-streamed text" % len(events))
    got["chat_sse"] = streamed

    first = curl(base + "/v1/responses", {"input": "Count to five.", "max_output_tokens": 10, "temperature": 0,
                                          "reasoning": {"effort": "none"}})
    check(first.get("status") in ("completed", "incomplete") and first.get("id"),
          "responses: %s, id %s, text %r" % (first.get("status"), first.get("id"), responses_text(first)[:40]))
    second = curl(base + "/v1/responses", {"input": "And back.", "max_output_tokens": 10, "temperature": 0,
                                           "reasoning": {"effort": "none"}, "previous_response_id": first["id"]})
    check(second.get("status") in ("completed", "incomplete") and second.get("previous_response_id") == first["id"],
          "responses with previous_response_id: %s, text %r" % (second.get("status"), responses_text(second)[:40]))
    check(second["usage"]["input_tokens"] > first["usage"]["input_tokens"] + first["usage"]["output_tokens"],
          "follow-up prompt holds the first turn (%d > %d + %d input tokens)" %
          (second["usage"]["input_tokens"], first["usage"]["input_tokens"], first["usage"]["output_tokens"]))
    got["responses"] = responses_text(first)
    got["responses_followup"] = responses_text(second)

    got.update(ws_checks(base))
    check(got.get("ws_1") == got["responses"] and got.get("ws_2") == got["responses_followup"],
          "WebSocket turns give the HTTP Responses texts")
    return got


class mini_ws:
    """A WebSocket client on the standard library (text frames, client masking, no extensions)."""

    def __init__(self, url):
        import base64
        import os
        import socket
        m = re.match(r"ws://([^:/]+):(\d+)(/.*)", url)
        self.sock = socket.create_connection((m.group(1), int(m.group(2))), timeout=120)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(("GET %s HTTP/1.1\r\nHost: %s:%s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                           "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n"
                           % (m.group(3), m.group(1), m.group(2), key)).encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(1)
            if not chunk:
                raise RuntimeError("WebSocket handshake: connection closed")
            head += chunk
        if b" 101 " not in head.split(b"\r\n")[0]:
            raise RuntimeError("WebSocket handshake: " + head.split(b"\r\n")[0].decode())

    def _read(self, n):
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise RuntimeError("WebSocket closed")
            out += chunk
        return out

    def _frame(self, opcode, payload):
        import os
        import struct
        mask = os.urandom(4)
        n = len(payload)
        head = bytes([0x80 | opcode]) + (bytes([0x80 | n]) if n < 126 else
                                         bytes([0x80 | 126]) + struct.pack(">H", n) if n < 65536 else
                                         bytes([0x80 | 127]) + struct.pack(">Q", n))
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def send(self, text):
        self._frame(0x1, text.encode())

    def recv(self):
        import struct
        message = b""
        while True:
            b0, b1 = self._read(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            mask = self._read(4) if b1 & 0x80 else None
            data = self._read(n)
            if mask:
                data = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
            opcode = b0 & 0x0F
            if opcode == 0x9:
                self._frame(0xA, data)
                continue
            if opcode == 0x8:
                raise RuntimeError("WebSocket closed by the server")
            if opcode in (0x0, 0x1, 0x2):
                message += data
                if b0 & 0x80:
                    return message.decode()

    def close(self):
        try:
            self._frame(0x8, b"\x03\xe8")
        finally:
            self.sock.close()


def ws_checks(base):
    got = {}
    ws = mini_ws(base.replace("http://", "ws://") + "/v1/responses")
    try:
        prev = None
        for i, text in enumerate(["Count to five.", "And back."]):
            create = {"type": "response.create", "input": text, "max_output_tokens": 10, "temperature": 0,
                      "reasoning": {"effort": "none"}}
            if prev:
                create["previous_response_id"] = prev
            ws.send(json.dumps(create))
            deltas = ""
            while True:
                e = json.loads(ws.recv())
                if e["type"] == "response.output_text.delta":
                    deltas += e["delta"]
                if e["type"] in ("response.completed", "response.incomplete", "response.failed", "error"):
                    break
            ok = e["type"] in ("response.completed", "response.incomplete")
            check(ok, "WebSocket turn %d: %s, text %r" % (i + 1, e["type"], deltas[:40]))
            if not ok:
                print("        " + json.dumps(e)[:300])
                break
            prev = e["response"]["id"]
            got["ws_%d" % (i + 1)] = deltas
    finally:
        ws.close()
    return got


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cedar", required=True, help="command that runs cedar, e.g. 'bash .gpu/run cedar'")
    ap.add_argument("--model", default="micro")
    ap.add_argument("--devices", default="cpu,cuda")
    ap.add_argument("--log-dir", default=".")
    a = ap.parse_args()
    answers = {}
    for device in a.devices.split(","):
        print("%s:" % device, flush=True)
        proc = None
        try:
            proc, base, start_s = start_server(a.cedar, a.model, device, "%s/serve_%s.log" % (a.log_dir, device))
            print("  up in %.1f s at %s" % (start_s, base), flush=True)
            answers[device] = run_checks(base)
        except Exception as e:  # noqa: BLE001 - reported as a failed check
            check(False, "%s: %s" % (device, e))
        finally:
            if proc:
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
    devices = list(answers)
    for d in devices[1:]:
        same = answers[d] == answers[devices[0]]
        check(same, "%s gives %s's answers (%d of them)" % (d, devices[0], len(answers[d])))
        if not same:
            for k in answers[d]:
                if answers[d].get(k) != answers[devices[0]].get(k):
                    print("        %s: %r vs %r" % (k, answers[d][k][:60], answers[devices[0]].get(k, "")[:60]))
    print("serve_device_check: %s" % ("FAILED: %d" % len(failures) if failures else "all passed"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
