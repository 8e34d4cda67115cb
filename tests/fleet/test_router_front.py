"""The pool router's front (checks/router_entry.py): OpenAI's /v1/models from the router's healthy
workers and the request's key, every other request passed through as it is, streamed.

The front runs for real on loopback in front of a stub of vllm-router's multi-model API (GET /workers,
its {"models": [...]}, a completion echoed, a streamed one); the client is the `openai` package.
"""
from __future__ import annotations

import http.client
import http.server
import json
import socket
import threading
import time

import openai
import pytest

from tests.support.checks import load_check
from tests.support.loopback import reply

entry = load_check("router_entry")

CHAT_A, CHAT_B, CODER = "http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"
WORKERS = [
    {"url": CHAT_A, "model_id": "chat", "labels": {"policy": "round_robin"}},
    {"url": CHAT_A, "model_id": "sql-lora", "labels": {"policy": "round_robin"}},
    {"url": CHAT_B, "model_id": "chat", "labels": {"policy": "round_robin"}},
    {"url": CHAT_B, "model_id": "sql-lora", "labels": {"policy": "round_robin"}},
    {"url": CODER, "model_id": "coder", "labels": {"policy": "round_robin"}},
]


class Router:
    """What the stub answers: the registered names and each URL's health (the test changes them)."""

    def __init__(self):
        self.names = ["chat", "sql-lora", "coder"]
        self.healthy = {CHAT_A: True, CHAT_B: True, CODER: True}
        self.seen: list[tuple[str, str, bytes]] = []
        self.pooling: set[str] = set()  # models that embed and do not complete
        self.broken: set[str] = set()  # models that do neither


def stub(router: Router) -> http.server.ThreadingHTTPServer:
    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def send(self, code, doc):
            reply(self, json.dumps(doc).encode(), code, "application/json")

        def do_GET(self):  # noqa: N802 (http.server's name)
            router.seen.append(("GET", self.path, b""))
            if self.path == "/workers":  # one entry per URL, as vllm-router 0.1.17 shows them
                self.send(200, {"workers": [{"url": u, "model_id": "x", "is_healthy": ok}
                                            for u, ok in router.healthy.items()]})
            elif self.path == "/v1/models":
                self.send(200, {"models": router.names})
            else:
                self.send(200, {"path": self.path})

        def do_DELETE(self):  # noqa: N802
            router.seen.append(("DELETE", self.path, b""))
            self.send(200, {"success": True})

        def do_POST(self):  # noqa: N802
            body = self.rfile.read(int(self.headers["Content-Length"]))
            router.seen.append(("POST", self.path, body))
            doc = json.loads(body)
            if self.path == "/v1/embeddings" and doc.get("model") in router.broken:
                self.send(400, {"error": {"message": "broken", "code": 400}})
                return
            if self.path == "/v1/embeddings":
                self.send(200, {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.5]}],
                                "model": doc["model"]})
                return
            if doc.get("model") in router.pooling:  # vLLM's answer for a pooling model
                self.send(404, {"error": {"message": "The model does not support Completions API", "code": 404}})
                return
            if not doc.get("stream"):
                self.send(200, {"id": "c1", "object": "text_completion", "created": 1, "model": doc.get("model"),
                                "choices": [{"index": 0, "text": "echo:" + str(doc.get("prompt")),
                                             "finish_reason": "stop", "logprobs": None}]})
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for word in ("one", "two", "three"):
                event = json.dumps({"id": "c1", "object": "text_completion", "created": 1, "model": doc["model"],
                                    "choices": [{"index": 0, "text": word, "finish_reason": None,
                                                 "logprobs": None}]})
                data = f"data: {event}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
                time.sleep(0.05)
            self.wfile.write(b"10\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")

        def log_message(self, *_a):
            pass

    return http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)


@pytest.fixture
def front(tmp_path, monkeypatch):
    """(the front's base URL, the stub's state, the workers file): vllm-router's stub on 127.0.0.1,
    the front on 127.0.0.3, the same port (as in the router's container)."""
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    monkeypatch.delenv("BOOTSTRAP_MODEL_KEYS", raising=False)
    router = Router()
    server = stub(router)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    f = tmp_path / "workers.json"
    f.write_text(json.dumps(WORKERS))
    ready = threading.Event()
    threading.Thread(target=entry.run_front, args=(entry.Front("127.0.0.1", port, "@" + str(f)), "127.0.0.3", ready),
                     daemon=True).start()
    assert ready.wait(10)
    yield f"http://127.0.0.3:{port}", router, f
    server.shutdown()


def client(base, key="none"):
    return openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=10)


def test_models_list_names_every_healthy_model_and_adapter_in_openais_shape(front):
    base, router, _ = front
    models = client(base).models.list()
    assert [(m.id, m.object, m.owned_by) for m in models.data] == [
        ("chat", "model", "vllm"), ("sql-lora", "model", "vllm"), ("coder", "model", "vllm")]
    assert {m.id: m.model_extra.get("parent") for m in models.data} == {"chat": None, "sql-lora": "chat",
                                                                       "coder": None}
    assert client(base).models.retrieve("coder").id == "coder"
    with pytest.raises(openai.NotFoundError):
        client(base).models.retrieve("nope")


def test_a_model_leaves_the_list_when_its_last_worker_is_unhealthy_or_the_router_drops_it(front):
    base, router, _ = front
    router.healthy[CHAT_A] = False  # one of chat's two: chat and its adapter stay
    assert [m.id for m in client(base).models.list().data] == ["chat", "sql-lora", "coder"]
    router.healthy[CODER] = False  # coder's only worker
    assert [m.id for m in client(base).models.list().data] == ["chat", "sql-lora"]
    router.healthy[CODER] = True
    router.names = ["chat", "sql-lora"]  # coder removed from the router (its workers deleted)
    assert [m.id for m in client(base).models.list().data] == ["chat", "sql-lora"]


def test_a_model_with_a_key_is_listed_only_to_its_key_and_a_key_that_opens_nothing_is_401(front, monkeypatch):
    base, _, _ = front
    monkeypatch.setenv("BOOTSTRAP_MODEL_KEYS", json.dumps({"coder": "coder-key"}))
    assert [m.id for m in client(base).models.list().data] == ["chat", "sql-lora"]
    assert [m.id for m in client(base, "coder-key").models.list().data] == ["chat", "sql-lora", "coder"]
    monkeypatch.setenv("VLLM_API_KEY", "team-key")  # the pool's key: every model without its own
    assert [m.id for m in client(base, "team-key").models.list().data] == ["chat", "sql-lora"]
    with pytest.raises(openai.AuthenticationError):
        client(base, "wrong").models.list()


def test_an_adapter_loaded_at_runtime_takes_its_models_key(front, monkeypatch):
    base, router, f = front
    f.write_text(json.dumps([*WORKERS, {"url": CODER, "model_id": "coder-lora", "labels": {}}]))
    router.names.append("coder-lora")
    monkeypatch.setenv("BOOTSTRAP_MODEL_KEYS", json.dumps({"coder": "coder-key"}))
    assert [m.id for m in client(base, "coder-key").models.list().data if m.id.startswith("coder")] == [
        "coder", "coder-lora"]
    assert [m.id for m in client(base).models.list().data] == ["chat", "sql-lora"]


def test_completions_pass_through_whole_and_streamed_on_one_kept_connection(front):
    base, router, _ = front
    c = client(base)
    assert c.completions.create(model="coder", prompt="hi", max_tokens=3).choices[0].text == "echo:hi"
    assert c.models.list().data[0].id == "chat"  # the same pooled connection, answered by the front
    words = [e.choices[0].text for e in c.completions.create(model="chat", prompt="x", max_tokens=3, stream=True)]
    assert words == ["one", "two", "three"]
    posts = [json.loads(b)["model"] for m, p, b in router.seen if m == "POST"]
    assert posts == ["coder", "chat"]


def test_two_requests_in_one_write_are_both_passed_on_and_answered_in_order(front):
    base, router, _ = front
    host, port = base[len("http://"):].split(":")
    body = json.dumps({"url": CODER, "model_id": "coder"}).encode()
    with socket.create_connection((host, int(port)), timeout=10) as s:  # checks/fleet_probe.py swap()
        s.sendall(b"DELETE /workers/x HTTP/1.1\r\nHost: r\r\n\r\n"
                  b"POST /workers HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        got = b"".join(iter(lambda: s.recv(65536), b""))
    assert got.count(b"HTTP/1.1 200") == 2, got
    assert [(m, p) for m, p, _ in router.seen] == [("DELETE", "/workers/x"), ("POST", "/workers")]
    assert router.seen[1][2] == body


def test_a_router_that_does_not_answer_is_503_on_models_and_502_on_the_rest(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    ready = threading.Event()
    threading.Thread(target=entry.run_front, args=(entry.Front("127.0.0.1", port, "[]"), "127.0.0.3", ready),
                     daemon=True).start()
    assert ready.wait(10)
    conn = http.client.HTTPConnection("127.0.0.3", port, timeout=10)
    conn.request("GET", "/v1/models")
    r = conn.getresponse()
    assert r.status == 503 and "does not answer" in json.loads(r.read())["error"]["message"]
    conn = http.client.HTTPConnection("127.0.0.3", port, timeout=10)
    conn.request("POST", "/v1/completions", body=b"{}", headers={"Content-Type": "application/json"})
    assert conn.getresponse().status == 502


def test_the_entry_moves_vllm_router_to_loopback_on_the_same_port():
    argv = ["vllm-router", "--enable-igw", "--host", "192.0.2.1", "--port", "30000", "--policy", "round_robin"]
    assert entry.inner_host("192.0.2.1") == "127.0.0.1" and entry.inner_host("127.0.0.1") == "127.0.0.2"
    moved = entry.with_option(argv, "--host", "127.0.0.1")
    assert entry.option(moved, "--host") == "127.0.0.1" and entry.option(moved, "--port") == "30000"
    assert "192.0.2.1" not in moved


def test_what_reads_the_list_completes_each_model_and_no_adapter_and_bench_asks_which(front):
    """fleet_probe's gate completes each model the front lists (not the adapters); bench refuses to
    guess among a pool's models and takes a one-model pool's."""
    from bootstrap.serve.bench import BenchError, discover_model

    base, router, f = front
    probe = load_check("fleet_probe")
    assert probe.served(probe.listed(base)) == (["chat", "sql-lora", "coder"], ["chat", "coder"])
    vllm = {"object": "list", "data": [{"id": "m", "parent": None}, {"id": "m-lora", "parent": "m"}]}
    assert probe.served(vllm) == (["m", "m-lora"], ["m"])
    with pytest.raises(BenchError, match="serves several models"):
        discover_model(base)
    router.names = ["chat", "sql-lora"]
    assert discover_model(base) == "chat"


def test_the_gate_takes_an_embedding_from_a_pooling_model_and_a_completion_from_the_others(front):
    """A pool model served with `--runner pooling` answers embeddings only: the gate (fleet_probe
    ready, through the router) asks it for one where vLLM refuses its completion; the OpenAI client's
    embeddings pass through the front like any other request."""
    base, router, _ = front
    router.pooling = {"coder"}
    probe = load_check("fleet_probe")
    got = probe.ready(base, 20)
    assert got["ready"] is True and got["models"] == ["chat", "sql-lora", "coder"], got
    asked = [(p, json.loads(b)["model"]) for m, p, b in router.seen if m == "POST"]
    assert asked == [("/v1/completions", "chat"), ("/v1/completions", "coder"), ("/v1/embeddings", "coder")]
    vec = client(base).embeddings.create(model="coder", input="hi")
    assert vec.data[0].embedding == [0.5] and vec.model == "coder"
    router.broken = {"coder"}  # refuses both: the gate says both answers
    why = probe.answers(base, "coder")
    assert "completion of coder answered 404" in why and "embedding of it answered 400" in why, why
