"""A pool's router: run vllm-router in its multi-model mode and give it its workers, on every start.

Runs INSIDE the router's container as its command, with nothing but the standard library:

  router_entry.py WORKERS_JSON -- vllm-router --enable-igw --host IP --port PORT ...

WORKERS_JSON: [{"url": ..., "model_id": ..., "labels": {"policy": ...}}, ...], one per replica and
name, or @PATH: a file in the container that holds it (bootstrap rewrites that file when `serve`
converges the pool, so that a router restarted later adds what the pool serves now).

vllm-router 0.1.17 routes by the request's `model` only in its IGW mode (--enable-igw), and in that
mode it drops --worker-urls (lib.rs sets worker_urls to an empty list): workers exist only once they
are added through its API (POST /workers with a model_id). A router that restarts (its restart
policy, the keeper) would start with none, so this entry adds them on every start, each once (the
router counts a URL added twice under one name twice: worker_registry.rs), then waits on
vllm-router and exits with its status. A replica serving adapters is added under each name.
SIGTERM and SIGINT are passed on.

The endpoint as OpenAI clients see it: in that mode vllm-router answers `GET /v1/models` with
`{"models": [names]}` (an OpenAI client's `models.list()` finds nothing there) and lists a name while
any worker of it is registered, healthy or not. So vllm-router listens on loopback (the same port, on
127.0.0.1) and this entry takes the address it was given: a front that answers `GET /v1/models` and
`GET /v1/models/{id}` itself, in OpenAI's shape (`{"object": "list", "data": [...]}`, an adapter with
its `parent`), listing every name the router holds that has a healthy worker (its GET /workers) and
that the request's key opens (BOOTSTRAP_MODEL_KEYS, VLLM_API_KEY: a model with a key is listed only
to its key; none listed to a wrong key is 401), and passes every other request and its answer through
byte for byte, streamed as they come. The names of a URL are read from the workers file (the router's
GET /workers shows one name per URL): the first a replica's model, the rest its adapters.
"""
import asyncio
import hmac
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

#: how long to wait for the router's API after each start, and between tries
DEADLINE_S = 120
STEP_S = 0.5


def http(method, url, body=None, timeout=5.0):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def option(argv, name):
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def registered(api):
    """The router's workers as {(url, model_id)} (GET /workers; it shows the last name a URL was added
    under, which is all a router that just started can have)."""
    code, body = http("GET", api + "/workers")
    if code != 200:
        raise RuntimeError(f"GET /workers answered {code}")
    doc = json.loads(body)
    items = doc.get("workers", []) if isinstance(doc, dict) else doc
    return {(w.get("url", "").rstrip("/"), w.get("model_id")) for w in items if isinstance(w, dict)}


def add_workers(api, workers, proc):
    """Add each (url, name) the router does not hold yet, each once (a URL added twice under one name
    counts twice; under several names it is one worker indexed under each); True once all are in,
    False if vllm-router ended."""
    start, last, done = time.monotonic(), None, None
    while time.monotonic() - start < DEADLINE_S:
        if proc.poll() is not None:
            return False
        try:
            if done is None:
                done = registered(api)
            for w in workers:
                key = (w["url"].rstrip("/"), w["model_id"])
                if key in done:
                    continue
                code, body = http("POST", api + "/workers", w)
                if code >= 300:
                    raise RuntimeError(f"POST /workers {w['url']} answered {code}: {body[:200]!r}")
                done.add(key)
                print(f"router_entry: added {w['url']} for {w['model_id']}", flush=True)
            return True
        except (OSError, RuntimeError, ValueError) as exc:
            last = exc
        time.sleep(STEP_S)
    print(f"router_entry: could not add the workers in {DEADLINE_S}s: {last}", file=sys.stderr, flush=True)
    return True


def read_workers(arg):
    if arg.startswith("@"):
        with open(arg[1:], encoding="utf-8") as f:
            return json.load(f)
    return json.loads(arg)


def inner_host(host):
    """Where vllm-router listens behind the front: loopback, on the front's port (another address)."""
    return "127.0.0.2" if host.startswith("127.") else "127.0.0.1"


def with_option(argv, name, value):
    """argv with NAME's value replaced by VALUE (NAME VALUE or NAME=VALUE), or added."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] == name and i + 1 < len(argv):
            i += 2
            continue
        if not argv[i].startswith(name + "="):
            out.append(argv[i])
        i += 1
    return out + [name, value]


# -- the front ------------------------------------------------------------------------------------
#: the largest request head the front reads (vllm-router's own limit is larger than any client's)
HEAD_MAX = 64 * 1024
#: the paths the front answers itself (GET only)
MODELS = "/v1/models"
#: when the front started: the `created` of every model it lists (OpenAI's field; vLLM's is its own)
STARTED = int(time.time())


def names_by_url(workers):
    """{url: [names]} from the workers file's entries: a replica's model first, then its adapters."""
    out = {}
    for w in workers:
        url = str(w.get("url", "")).rstrip("/")
        if w.get("model_id") and w["model_id"] not in out.setdefault(url, []):
            out[url].append(w["model_id"])
    return out


def key_of(name, keys, urls):
    """The API key a request for NAME needs: its own (BOOTSTRAP_MODEL_KEYS), else that of a name served
    by the same replica (an adapter loaded at runtime takes its model's), else VLLM_API_KEY; None: none."""
    if keys.get(name):
        return keys[name]
    for names in urls.values():
        if name in names:
            for other in names:
                if keys.get(other):
                    return keys[other]
    return os.environ.get("VLLM_API_KEY") or None


def opens(need, bearer):
    return need is None or (bearer is not None and hmac.compare_digest(need.encode(), bearer.encode()))


def listing(workers_doc, registered, files, keys, bearer):
    """(status, OpenAI's list) for a request bearing BEARER: every name the router holds (REGISTERED:
    its /v1/models) whose URL (the workers file FILES) has a healthy worker (WORKERS_DOC: its GET
    /workers) and whose key BEARER opens; 401 when keys hide every name."""
    urls = names_by_url(files)
    healthy = {str(w.get("url", "")).rstrip("/") for w in workers_doc.get("workers", [])
               if isinstance(w, dict) and w.get("is_healthy")}
    data, hidden = [], False
    for url, names in urls.items():
        if url not in healthy:
            continue
        for i, name in enumerate(names):
            if name not in registered or any(d["id"] == name for d in data):
                continue
            if not opens(key_of(name, keys, urls), bearer):
                hidden = True
                continue
            data.append({"id": name, "object": "model", "created": STARTED, "owned_by": "vllm",
                         "root": name if i == 0 else None, "parent": None if i == 0 else names[0]})
    if hidden and not data:
        return 401, {"error": {"message": "Unauthorized: the API key opens no model here", "type":
                               "invalid_request_error", "param": None, "code": 401}}
    return 200, {"object": "list", "data": data}


def model_keys_env():
    try:
        keys = json.loads(os.environ.get("BOOTSTRAP_MODEL_KEYS") or "{}")
    except ValueError:
        keys = {}
    return keys if isinstance(keys, dict) else {}


class Front:
    """The OpenAI-shaped front of a pool's router (module docstring): one per router container."""

    def __init__(self, inner, port, workers_arg):
        self.inner, self.port, self.workers_arg = inner, port, workers_arg
        self.relays = set()  # the answers being passed back (asyncio holds its tasks weakly)

    async def ask(self, path):
        """GET PATH of vllm-router: (status, parsed JSON)."""
        reader, writer = await asyncio.open_connection(self.inner, self.port)
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: router\r\nConnection: close\r\n\r\n".encode())
            raw = await asyncio.wait_for(reader.read(), 10)
        finally:
            writer.close()
        head, _, body = raw.partition(b"\r\n\r\n")
        if b"transfer-encoding: chunked" in head.lower():
            body = dechunk(body)
        return int(head.split(b" ", 2)[1]), json.loads(body or b"{}")

    def files(self):
        try:
            doc = read_workers(self.workers_arg)  # read again each time: serve rewrites the file
        except (OSError, ValueError):
            return []
        return [w for w in doc if isinstance(w, dict)] if isinstance(doc, list) else []

    async def models(self, path, headers):
        """(status, body) of GET /v1/models or /v1/models/{id}, for the request's key."""
        auth = headers.get("authorization", "")
        bearer = auth[7:].strip() if auth[:7].lower() == "bearer " else None
        try:
            code, workers = await self.ask("/workers")
            code2, registered = await self.ask(MODELS)
        except (OSError, ValueError, IndexError, asyncio.TimeoutError) as exc:
            return 503, error(503, f"the router does not answer: {type(exc).__name__}")
        if code != 200 or code2 != 200:
            return 503, error(503, f"the router answered {code} to GET /workers")
        listed = registered.get("models") if isinstance(registered, dict) else None
        code, doc = listing(workers if isinstance(workers, dict) else {}, set(listed or []), self.files(),
                            model_keys_env(), bearer)
        if code != 200 or path == MODELS:
            return code, doc
        want = urllib.parse.unquote(path[len(MODELS) + 1:])
        for m in doc["data"]:
            if m["id"] == want:
                return 200, m
        return 404, error(404, f"The model `{want}` does not exist.", "NotFoundError")

    async def serve(self, creader, cwriter):
        """One client connection: each request's head is read; ours are answered, the others (and
        everything after a body the front does not measure) go to vllm-router, its answers back."""
        up = None
        try:
            while True:
                head = await read_head(creader)
                if head is None:
                    return
                method, path, headers = parse_head(head)
                if method == "GET" and (path == MODELS or path.startswith(MODELS + "/")):
                    code, doc = await self.models(path, headers)
                    cwriter.write(answer(code, doc))
                    await cwriter.drain()
                    continue
                if up is None:
                    ureader, up = await asyncio.open_connection(self.inner, self.port)
                    task = asyncio.ensure_future(relay(ureader, cwriter))
                    self.relays.add(task)
                    task.add_done_callback(self.relays.discard)
                up.write(head)
                length = headers.get("content-length")
                if "transfer-encoding" in headers or "upgrade" in headers or "expect" in headers or (
                        length is not None and not length.isdigit()):
                    await relay(creader, up)  # a body the front does not measure: the rest passes through
                    return
                await copy(creader, up, int(length or 0))
        except (ConnectionError, OSError, ValueError, asyncio.IncompleteReadError) as exc:
            if up is None:  # nothing of vllm-router's was sent: the client gets a reason
                cwriter.write(answer(502, error(502, f"the router does not answer: {type(exc).__name__}")))
        finally:
            if up is not None:
                up.close()
            cwriter.close()


def error(code, message, kind="ServiceUnavailableError"):
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def answer(code, doc):
    body = json.dumps(doc).encode()
    reason = {200: "OK", 401: "Unauthorized", 404: "Not Found", 502: "Bad Gateway"}.get(code, "Service Unavailable")
    return (f"HTTP/1.1 {code} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"\r\n").encode() + body


async def read_head(reader):
    """A request's head (through its blank line), or None at the connection's end."""
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial.strip():
            raise
        return None
    except asyncio.LimitOverrunError:
        raise ValueError("request head too long") from None


def parse_head(head):
    lines = head.decode("latin-1").split("\r\n")
    method, target = (lines[0].split(" ") + ["", ""])[:2]
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return method, target.split("?", 1)[0], headers


async def copy(reader, writer, n):
    while n > 0:
        chunk = await reader.read(min(n, 65536))
        if not chunk:
            raise asyncio.IncompleteReadError(b"", n)
        writer.write(chunk)
        n -= len(chunk)
    await writer.drain()


async def relay(reader, writer):
    """Everything READER gives, to WRITER as it comes, until the end; then WRITER's end."""
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


def dechunk(body):
    out = b""
    while body:
        size, _, rest = body.partition(b"\r\n")
        n = int(size.split(b";")[0] or b"0", 16)
        if n == 0:
            break
        out, body = out + rest[:n], rest[n + 2:]
    return out


def run_front(front, host, ready):
    """The front's event loop, in its own thread: listening on (HOST, front.port) once READY is set."""
    async def go():
        server = await asyncio.start_server(front.serve, host, front.port, limit=HEAD_MAX)
        ready.set()
        async with server:
            await server.serve_forever()
    try:
        asyncio.run(go())
    except OSError as exc:
        print(f"router_entry: cannot listen on {host}:{front.port}: {exc}", file=sys.stderr, flush=True)
        ready.set()
        os._exit(1)


def main(argv):
    if "--" not in argv or len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    cut = argv.index("--")
    workers, command = read_workers(argv[1]), argv[cut + 1:]
    host, port = option(command, "--host") or "127.0.0.1", option(command, "--port") or "30000"
    inner = inner_host(host)
    front = Front(inner, int(port), argv[1])
    ready = threading.Event()
    threading.Thread(target=run_front, args=(front, host, ready), daemon=True).start()
    ready.wait(30)
    proc = subprocess.Popen(with_option(command, "--host", inner))
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, _f: proc.send_signal(s))
    add_workers(f"http://{inner}:{port}", workers, proc)
    return proc.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
