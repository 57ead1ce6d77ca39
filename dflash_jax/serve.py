"""An OpenAI-compatible HTTP server for a target and its speculation plan (``dflash-jax serve``).

Endpoints: ``GET /v1/models`` and ``POST /v1/chat/completions`` (not streamed): ``messages``,
``max_tokens`` (or ``max_completion_tokens``), ``temperature`` (0: greedy, the default here),
``top_p``, ``top_k``, ``seed``. Requests that arrive together are decoded together: a worker takes
every waiting request (up to ``batch_size``) of the same sampling settings and decodes them on rows
refilled as they finish (``Decoder.as_completed``), each to the longest ``max_tokens`` among them and
cut to its own (greedy: exactly what that limit gives alone). Enough for making training data
through ``prepare-data --server`` and for trying a drafter from another client; not a serving engine.
"""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from concurrent.futures import Future
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from dflash_jax.decode import Decoder
from dflash_jax.sampling import Sampling
from dflash_jax.tokens import chat_ids, stop_ids
from dflash_jax.utils import log


class BadRequest(ValueError):
    """A request the server refuses (HTTP 400, OpenAI's ``invalid_request_error``)."""


class UnknownModel(BadRequest):
    """A request for a model this server does not serve (HTTP 404, as vLLM answers)."""


def parse_request(body: dict, default_max_tokens: int) -> dict:
    """The fields of a chat completion request this server reads, checked.

    Raises:
      BadRequest: missing or malformed ``messages``, a non-positive ``max_tokens``, ``stream``, ``n``
        other than 1, or sampling settings ``Sampling`` refuses.
    """
    messages = body.get("messages")
    if not (isinstance(messages, list) and messages):
        raise BadRequest("'messages' must be a non-empty list of {role, content}")
    for m in messages:
        known = isinstance(m, dict) and m.get("role") in ("system", "user", "assistant")
        if not (known and isinstance(m.get("content"), str)):
            raise BadRequest("every message needs a role (system, user or assistant) and a string content")
    if body.get("stream"):
        raise BadRequest("streamed responses are not supported by this server; send stream: false")
    if body.get("n", 1) != 1:
        raise BadRequest("only n = 1 is supported")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens", default_max_tokens))
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise BadRequest("'max_tokens' must be a positive integer")
    try:
        temperature, top_p, top_k = body.get("temperature", 0.0), body.get("top_p", 1.0), body.get("top_k", 0)
        sampling = Sampling(float(temperature), float(top_p), int(top_k))
    except (TypeError, ValueError) as e:
        raise BadRequest(str(e)) from None
    if sampling.greedy:
        sampling = Sampling()  # top_p / top_k do not matter: one compiled decoder for every greedy request
    seed = body.get("seed", 0)
    if not isinstance(seed, int):
        raise BadRequest("'seed' must be an integer")
    messages = [{"role": m["role"], "content": m["content"]} for m in messages]
    return {"messages": messages, "max_tokens": max_tokens, "sampling": sampling, "seed": seed}


class Server:
    """The model behind the HTTP endpoints: a queue of requests and one worker thread decoding them.

    Args:
      ck, tok: the target checkpoint and its tokenizer; plan: its speculation plan (None: plain).
      batch_size: most requests decoded together; max_tokens: the default answer cap.
      name: the model id reported by ``/v1/models`` and in responses.
    """

    def __init__(self, ck, tok, plan, *, batch_size: int = 8, max_tokens: int = 256, name: str = "dflash-jax"):
        self.ck, self.tok, self.plan, self.name = ck, tok, plan, name
        self.batch_size, self.max_tokens = batch_size, max_tokens
        self.stops = stop_ids(tok)
        self.decoders: dict[Sampling, Decoder] = {}
        self.queue: queue.Queue = queue.Queue()
        threading.Thread(target=self._work, daemon=True).start()

    def submit(self, body: dict) -> Future:
        """Queue a chat completion request (``parse_request`` checks it); its future resolves to the
        response object."""
        if body.get("model") not in (None, self.name):
            raise UnknownModel(f"the model {body['model']!r} does not exist here; this server has {self.name!r}")
        req = parse_request(body, self.max_tokens)
        req["ids"] = chat_ids(self.tok, req["messages"])
        if len(req["ids"]) + req["max_tokens"] > self.ck.cfg.max_position_embeddings:
            raise BadRequest(
                f"the prompt ({len(req['ids'])} tokens) + max_tokens exceeds the context of "
                f"{self.ck.cfg.max_position_embeddings} tokens"
            )
        fut: Future = Future()
        self.queue.put((req, fut))
        return fut

    def _decoder(self, sampling: Sampling) -> Decoder:
        if sampling not in self.decoders:
            self.decoders[sampling] = Decoder(self.ck.params, self.ck.cfg, self.plan, sampling=sampling)
        return self.decoders[sampling]

    def _work(self) -> None:
        while True:
            batch = [self.queue.get()]
            while len(batch) < self.batch_size:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            groups: dict[Sampling, list] = {}
            for item in batch:
                groups.setdefault(item[0]["sampling"], []).append(item)
            for sampling, items in groups.items():
                try:
                    self._decode(sampling, items)
                except Exception as e:  # the requests fail, the server stays up
                    for _, fut in items:
                        if not fut.done():
                            fut.set_exception(e)

    def _decode(self, sampling: Sampling, items: list) -> None:
        dec = self._decoder(sampling)
        limit = max(req["max_tokens"] for req, _ in items)
        prompts, seeds = [req["ids"] for req, _ in items], [req["seed"] for req, _ in items]
        for i, result in dec.as_completed(prompts, limit, self.stops, seeds, batch_size=self.batch_size):
            req, fut = items[i]
            ids = result.token_ids[: req["max_tokens"]]
            stopped = bool(ids) and ids[-1] in self.stops
            text = self.tok.decode(ids[:-1] if stopped else ids, skip_special_tokens=True)
            fut.set_result(
                {
                    "id": f"chatcmpl-{uuid.uuid4().hex}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": self.name,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": text},
                            "finish_reason": "stop" if stopped else "length",
                        }
                    ],
                    "usage": {
                        "prompt_tokens": len(req["ids"]),
                        "completion_tokens": len(ids),
                        "total_tokens": len(req["ids"]) + len(ids),
                    },
                }
            )


def _handler(server: Server):
    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, obj: dict) -> None:
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, code: int, message: str, kind: str) -> None:
            self._send(code, {"error": {"message": message, "type": kind}})

        def do_GET(self):  # noqa: N802 (http.server's name)
            if self.path.rstrip("/") in ("/v1/models", "/models"):
                model = {"id": server.name, "object": "model", "owned_by": "dflash-jax"}
                self._send(200, {"object": "list", "data": [model]})
            elif self.path.rstrip("/") in ("/health", ""):
                self._send(200, {"status": "ok"})
            else:
                self._error(404, f"no endpoint {self.path}", "not_found_error")

        def do_POST(self):  # noqa: N802
            if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                where = f"no endpoint {self.path}; this server has /v1/chat/completions"
                return self._error(404, where, "not_found_error")
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if not isinstance(body, dict):
                    raise BadRequest("the request body must be a JSON object")
                fut = server.submit(body)
            except (json.JSONDecodeError, UnicodeDecodeError):
                return self._error(400, "the request body is not JSON", "invalid_request_error")
            except UnknownModel as e:
                return self._error(404, str(e), "not_found_error")
            except BadRequest as e:
                return self._error(400, str(e), "invalid_request_error")
            try:
                self._send(200, fut.result())
            except Exception as e:  # noqa: BLE001 (reported to the client, logged here)
                log(f"request failed: {type(e).__name__}: {e}")
                self._error(500, f"{type(e).__name__}: {e}", "server_error")

        def log_message(self, format, *args):  # noqa: A002 (http.server's signature)
            pass  # one line per request would drown the log

    return Handler


def serve(server: Server, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Answer HTTP requests on ``host:port`` until interrupted (Ctrl-C)."""
    httpd = ThreadingHTTPServer((host, port), _handler(server))
    log(f"serving {server.name} on http://{host}:{httpd.server_address[1]}/v1 (chat completions; Ctrl-C stops)")
    try:
        httpd.serve_forever()
    finally:
        httpd.server_close()
