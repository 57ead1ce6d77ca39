"""A client of OpenAI-compatible chat completion servers (vLLM, SGLang, ``dflash-jax serve``), for
``prepare-data --server``: retries with backoff, a connection pool sized for the concurrency."""

from __future__ import annotations

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from dflash_jax.errors import DataError


class ChatClient:
    """Chat completions from ``url`` (the API root, e.g. ``http://localhost:8000/v1``).

    Args:
      model: the model name sent with each request (None: the server's first, ``/models``).
      concurrency: the most requests in flight (the connection pool's size).
      retries: attempts after a failed one (connection errors, 429 and 5xx answers), waiting
        0.5, 1, 2, ... s between them.
      timeout: seconds to wait for one answer.
    Raises:
      DataError: the server cannot be reached or lists no model (on creation).
    """

    def __init__(self, url: str, model: str | None = None, *, concurrency: int = 8, retries: int = 5, timeout=600):
        self.url, self.timeout = url.rstrip("/"), timeout
        retry = Retry(
            total=retries, backoff_factor=0.5, status_forcelist=(429, 500, 502, 503, 504), allowed_methods=None
        )
        self.session = requests.Session()
        adapter = HTTPAdapter(max_retries=retry, pool_connections=concurrency, pool_maxsize=concurrency)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        if model is None:
            try:
                listed = self.session.get(f"{self.url}/models", timeout=60).json()["data"]
                model = listed[0]["id"]
            except (requests.RequestException, ValueError, KeyError, IndexError, TypeError) as e:
                raise DataError(
                    f"cannot list the models of {self.url} ({type(e).__name__}); is the server up, and is "
                    "the URL its API root (such as http://localhost:8000/v1)? or give --server-model"
                ) from None
        self.model = model

    def chat(self, messages: list[dict], max_tokens: int) -> tuple[str, str]:
        """The greedy answer (temperature 0, seed 0) to ``messages``: ``(text, finish_reason)``.

        Raises:
          DataError: the server failed after every retry or answered something else than a chat
            completion (the status and the start of its answer named).
        """
        body = {"model": self.model, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0, "seed": 0}
        try:
            r = self.session.post(f"{self.url}/chat/completions", json=body, timeout=self.timeout)
        except requests.RequestException as e:
            raise DataError(f"{self.url}: the request failed after retries ({type(e).__name__}: {e})") from None
        try:
            choice = r.json()["choices"][0]
            return choice["message"]["content"], choice.get("finish_reason") or "stop"
        except (ValueError, KeyError, IndexError, TypeError):
            raise DataError(f"{self.url} answered HTTP {r.status_code}: {r.text[:200]!r}") from None
