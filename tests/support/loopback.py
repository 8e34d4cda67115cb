"""A throwaway HTTP server on loopback for the probes' unit tests (checks/*.py speak HTTP to vLLM
and vllm-router; these stand in for their answers)."""
import http.server
import threading


def reply(handler: http.server.BaseHTTPRequestHandler, body: bytes, code: int = 200,
          content_type: str | None = None) -> None:
    handler.send_response(code)
    if content_type:
        handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


class Loopback:
    """Serves `handler` (a BaseHTTPRequestHandler subclass) on 127.0.0.1, a free port, in a thread."""

    def __init__(self, handler: type) -> None:
        handler.log_message = lambda *a: None
        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()
