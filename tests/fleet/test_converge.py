"""`serve` of a pool that serves already (fleet/converge.py): what it keeps, replaces, starts and removes,
judged from what each host runs (its launch digest) and the workers the routers hold; pure."""
from __future__ import annotations

import json
from types import SimpleNamespace

from bootstrap.fleet import converge as CV
from bootstrap.fleet import plan as FP
from bootstrap.fleet import routers as FRT
from tests.fleet.test_fleet_pure import CPU_SPLIT
from tests.fleet.test_pool import MODELS, pool_yaml
from tests.support.fleet_inventories import load


def planned(tmp_path, models: str = MODELS, n: int = 4):
    inv = load(tmp_path, pool_yaml(n, models))
    plan = FP.plan_fleet(inv, FP.pool_specs(inv, inv.cluster.image), [CPU_SPLIT for _ in inv.replicas], nofile={})
    return inv, plan


def running_of(plan) -> dict:
    """What each host runs once `plan` served: its members' launch digests and specs."""
    return {m.host: CV.Running(m.launch, plan.spec_of(rp), True) for rp in plan.replicas for m in rp.members}


def routed_of(plan) -> dict:
    return {rp.url: plan.spec_of(rp).served_name for rp in plan.replicas}


def actions(todo):
    return [(c.action, c.model, c.index, c.hosts) for c in todo]


def test_a_pool_that_serves_what_it_declares_is_kept_whole(tmp_path):
    inv, plan = planned(tmp_path)
    todo = CV.changes(inv, plan, running_of(plan), routed_of(plan))
    assert actions(todo) == [("keep", "chat", 0, ("h0",)), ("keep", "chat", 1, ("h1",)),
                             ("keep", "coder", 2, ("h2", "h3"))]
    # one that serves but is out of the routers (a router restarted by hand) is put back, not restarted
    routed = routed_of(plan)
    del routed[plan.replicas[1].url]
    assert [c.action for c in CV.changes(inv, plan, running_of(plan), routed)] == ["keep", "route", "keep"]


def test_a_models_changed_flags_replace_only_its_replicas_and_say_what_changed(tmp_path):
    inv, plan = planned(tmp_path)
    now = running_of(plan)
    inv2, plan2 = planned(tmp_path, MODELS.replace("policy: power_of_two", "args: [--max-num-seqs, '8']"))
    todo = CV.changes(inv2, plan2, now, routed_of(plan))
    assert [c.action for c in todo] == ["keep", "keep", "replace"]
    assert todo[2].why == "vLLM flags (none) -> --max-num-seqs 8", todo[2].why
    # the chat model's source changed: both its replicas, the coder kept
    inv3, plan3 = planned(tmp_path, MODELS.replace("org/chat-model", "org/chat-model-v2"))
    todo = CV.changes(inv3, plan3, now, routed_of(plan))
    assert [c.action for c in todo] == ["replace", "replace", "keep"]
    assert todo[0].why == "source org/chat-model -> org/chat-model-v2"


def test_a_new_model_on_new_hosts_is_started_and_the_others_are_kept(tmp_path):
    inv, plan = planned(tmp_path)
    more = MODELS + "  - name: embed\n    source: org/embed\n"
    inv2, plan2 = planned(tmp_path, more, n=5)
    todo = CV.changes(inv2, plan2, running_of(plan), routed_of(plan))
    assert actions(todo) == [("keep", "chat", 0, ("h0",)), ("keep", "chat", 1, ("h1",)),
                             ("keep", "coder", 2, ("h2", "h3")), ("start", "embed", 3, ("h4",))]
    assert todo[3].why == "nothing runs on its hosts"


def test_a_reshaped_model_replaces_its_replicas_and_a_removed_ones_workers_leave_the_routers(tmp_path):
    inv, plan = planned(tmp_path)
    # the coder from one two-node replica to two one-node replicas: both change, the chat is kept
    two = MODELS.replace("    nodes: 2\n", "    replicas: 2\n")
    inv2, plan2 = planned(tmp_path, two)
    todo = CV.changes(inv2, plan2, running_of(plan), routed_of(plan))
    assert actions(todo) == [("keep", "chat", 0, ("h0",)), ("keep", "chat", 1, ("h1",)),
                             ("replace", "coder", 2, ("h2",)), ("replace", "coder", 3, ("h3",))]
    assert todo[2].why == "its hosts or its split change"
    # the coder removed with its hosts: its worker leaves the routers; the chat's replicas are kept
    chat_only = MODELS.split("  - name: coder")[0]
    inv3, plan3 = planned(tmp_path, chat_only, n=2)
    todo = CV.changes(inv3, plan3, running_of(plan), routed_of(plan))
    assert actions(todo) == [("keep", "chat", 0, ("h0",)), ("keep", "chat", 1, ("h1",)),
                             ("remove", "coder", None, ())]
    assert todo[2].url == plan.replicas[2].url and todo[2].describe().startswith("remove   coder: (http://")


def test_a_stopped_replica_is_started_again_and_a_host_moved_to_another_model_is_replaced(tmp_path):
    inv, plan = planned(tmp_path)
    now = running_of(plan)
    now["h0"] = CV.Running(now["h0"].launch, now["h0"].spec, False)
    assert [c.action for c in CV.changes(inv, plan, now, routed_of(plan))] == ["start", "keep", "keep"]
    # chat takes a third replica from the coder's member host; the coder shrinks to one node
    moved = MODELS.replace("replicas: 2", "replicas: 3").replace("    nodes: 2\n", "")
    inv2, plan2 = planned(tmp_path, moved)
    todo = CV.changes(inv2, plan2, running_of(plan), routed_of(plan))
    assert actions(todo) == [("keep", "chat", 0, ("h0",)), ("keep", "chat", 1, ("h1",)),
                             ("replace", "chat", 2, ("h2",)), ("replace", "coder", 3, ("h3",))]
    assert todo[2].why == "its hosts serve coder now"


def test_routers_are_changed_in_place_only_when_they_run_the_pool_entry_with_the_planned_options(tmp_path):
    inv, plan = planned(tmp_path)
    run = plan.routers[0].run
    args = run[run.index(inv.cluster.image) + 1:]  # Docker's Args: the command after the image
    ok = SimpleNamespace(running=True, args=args)
    assert "@" + FRT.WORKERS_PATH in args
    assert CV.router_ready(inv, plan, {"h0": ok}) is None
    assert CV.router_ready(inv, plan, {}) == "the router on h0 is not running"
    inline = SimpleNamespace(running=True, args=tuple(a if not a.startswith("@") else "[]" for a in args))
    assert CV.router_ready(inv, plan, {"h0": inline}) == "the router on h0 was not started by this version's pool entry"
    other = SimpleNamespace(running=True, args=tuple(a if a != "power_of_two" else "round_robin" for a in args))
    assert CV.router_ready(inv, plan, {"h0": other}) == "the router's options on h0 changed"


def test_a_model_removed_from_models_with_its_hosts_kept_is_drained_and_its_idle_hosts_stopped(tmp_path):
    inv, plan = planned(tmp_path)
    chat_only = MODELS.split("  - name: coder")[0]
    inv2, plan2 = planned(tmp_path, chat_only, n=4)
    assert [h.name for h in inv2.idle] == ["h2", "h3"]
    todo = CV.changes(inv2, plan2, running_of(plan), routed_of(plan))
    assert actions(todo) == [("keep", "chat", 0, ("h0",)), ("keep", "chat", 1, ("h1",)),
                             ("remove", "coder", None, ()), ("stop", "coder", None, ("h2",)),
                             ("stop", "coder", None, ("h3",))]
    assert todo[3].why == "the host is idle now (no model's replica takes it)"
    # an idle host with nothing on it: nothing to do
    now = running_of(plan)
    now.pop("h2"), now.pop("h3")
    assert [c.action for c in CV.changes(inv2, plan2, now, routed_of(plan2))] == ["keep", "keep"]


def test_serves_last_line_says_what_changed_in_one_phrase():
    from bootstrap.cli.render_serving import _changed

    todo = [CV.Change("keep", "chat", 0, ("h0",), "u0", ""), CV.Change("replace", "coder", 2, ("h2",), "u2", ""),
            CV.Change("start", "embed", 3, ("h3",), "u3", ""),
            CV.Change("remove", "old", None, (), "http://x:8000", ""),
            CV.Change("stop", "old", None, ("h4",), "http://h4:8000", "")]
    assert _changed(todo) == ("replaced replica 2, started replica 3, took out of the routers http://x:8000, "
                              "stopped serving on h4; kept 1 replica as they were")
    assert _changed(todo[:1]) == "nothing changed; kept 1 replica as they were"


def test_a_models_policy_changed_alone_is_changed_in_place_unless_lora_is_on(tmp_path):
    inv, plan = planned(tmp_path)  # chat x2 (power_of_two, the cluster's), coder (power_of_two, its own)
    told = {rp.url: "round_robin" for rp in plan.replicas}  # what the routers were told before the edit
    todo = CV.changes(inv, plan, running_of(plan), routed_of(plan), told)
    assert [(c.action, c.model) for c in todo] == [("policy", "chat"), ("policy", "chat"), ("policy", "coder")]
    assert todo[0].why == "router policy round_robin -> power_of_two, in place"
    same = {rp.url: "power_of_two" for rp in plan.replicas}
    assert [c.action for c in CV.changes(inv, plan, running_of(plan), routed_of(plan), same)] == ["keep"] * 3
    assert [c.action for c in CV.changes(inv, plan, running_of(plan), routed_of(plan))] == ["keep"] * 3  # not known
    lora = MODELS.replace("    replicas: 2\n", "    replicas: 2\n    adapters: []\n", 1)
    inv, plan = planned(tmp_path, lora)
    todo = CV.changes(inv, plan, running_of(plan), routed_of(plan), {rp.url: "round_robin" for rp in plan.replicas})
    assert [(c.action, c.model) for c in todo] == [("keep", "chat"), ("keep", "chat"), ("policy", "coder")]
    assert "takes effect when the routers restart" in todo[0].why


def test_the_probe_takes_every_url_of_a_model_out_before_it_adds_them_back_with_the_policy(monkeypatch):
    from tests.support.checks import load_check

    probe = load_check("fleet_probe")
    calls = []
    workers = {"workers": [{"url": "http://a:8000", "model_id": "coder", "metadata": {"policy": "random"}},
                           {"url": "http://b:8000", "model_id": "coder", "metadata": {"policy": "random"}}]}

    def http(method, url, body=None, timeout=5.0, key=None):
        calls.append((method, url.split("/workers")[-1], (body or {}).get("labels")))
        return (200, json.dumps(workers).encode()) if method == "GET" else (200, b"{}")

    def swap(router, url, name, policy, timeout=30.0):
        calls.append(("SWAP", url, {"policy": policy}))
        return [(200, b"{}"), (200, b"{}")]
    monkeypatch.setattr(probe, "http", http)
    monkeypatch.setattr(probe, "swap", swap)
    assert probe.pool_workers("http://r")["policies"] == {"http://a:8000": "random", "http://b:8000": "random"}
    calls.clear()
    got = probe.repolicy("http://r", "coder", "round_robin", ["http://a:8000", "http://b:8000"])
    assert got["ok"] and got["gap_ms"] >= 0, got
    # every URL but the last out, the last one out and in again in one write, then the others in
    assert [c[0] for c in calls] == ["DELETE", "SWAP", "POST", "GET"], calls
    assert calls[1][1] == "http://b:8000" and calls[1][2] == calls[2][2] == {"policy": "round_robin"}
    workers["workers"] = workers["workers"][:1]  # the router lost one: said, not hidden
    got = probe.repolicy("http://r", "coder", "round_robin", ["http://a:8000", "http://b:8000"])
    assert not got["ok"] and "http://b:8000" in got["error"]


def test_the_last_workers_delete_and_post_reach_the_router_in_one_write_and_both_answers_are_read():
    """fleet_probe.swap against a real HTTP/1.1 server on loopback: the DELETE and the POST arrive on one
    connection, in that order, with the key, and each answer is read whole (the second is not lost in the
    first's buffer)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from tests.support.checks import load_check

    probe = load_check("fleet_probe")
    seen = []

    class Router(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def _answer(self, code, body):
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_DELETE(self):
            seen.append(("DELETE", self.path, self.client_address[1], self.headers.get("Authorization")))
            self._answer(200, b'{"success":true,"message":"removed"}')

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(("POST", self.path, self.client_address[1], body))
            self._answer(200, b'{"success":true,"added":"' + body["url"].encode() + b'"}')

    server = ThreadingHTTPServer(("127.0.0.1", 0), Router)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        import os
        os.environ["VLLM_API_KEY"] = "sk-test-key"
        try:
            answers = probe.swap(f"http://127.0.0.1:{server.server_port}", "http://10.0.0.5:8000", "coder", "random")
        finally:
            del os.environ["VLLM_API_KEY"]
    finally:
        server.shutdown()
    assert answers == [(200, b'{"success":true,"message":"removed"}'),
                       (200, b'{"success":true,"added":"http://10.0.0.5:8000"}')], answers
    assert [(s[0], s[1]) for s in seen] == [("DELETE", "/workers/http%3A%2F%2F10.0.0.5%3A8000"), ("POST", "/workers")]
    assert seen[0][2] == seen[1][2]  # one connection: the same client port
    assert seen[0][3] == "Bearer sk-test-key"
    assert seen[1][3] == {"url": "http://10.0.0.5:8000", "model_id": "coder", "labels": {"policy": "random"}}
