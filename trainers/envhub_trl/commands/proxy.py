"""``envhub proxy``: serve a model as an OpenAI-compatible endpoint that records each session's calls token-exactly."""

from __future__ import annotations

import click

from envhub.error import EnvhubError


def _env_ids(ids: tuple[str, ...]) -> tuple[str, ...]:
    from envhub.registration import registry

    for env_id in ids:
        try:
            registry.get(env_id)
        except EnvhubError as exc:
            raise click.BadParameter(str(exc).strip("'\""), param_hint="--env") from None
    return ids


def _loader(kind: str) -> str:
    from envhub_trl.generators import loaders

    if kind not in loaders():
        raise click.BadParameter(f"{kind!r} cannot load a model folder; choose one of {', '.join(loaders())}")
    return kind


@click.command("proxy")
@click.option("--model", "model_path", required=True, help="tiny, smollm2-135m, a Hugging Face model folder or a hub id.")
@click.option("--generator", "kind", default="hf", show_default=True, callback=lambda ctx, param, value: _loader(value),
              help="A generator that loads a model folder: hf (transformers), vllm, or one a plugin registered.")
@click.option("--served-name", default=None, help="The model name requests must give (default: --model as given; '*' takes any).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0 for every interface).")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True, help="Port to listen on.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=256, show_default=True, help="A reply's token budget when a request gives none.")
@click.option("--max-body-bytes", type=click.IntRange(min=1), default=1 << 20, show_default=True,
              help="The largest request body read; a larger one is answered 413.")
@click.option("--env", "env_ids", multiple=True, callback=lambda ctx, param, value: _env_ids(value),
              help="An env id agents may play on the proxy (POST /v1/envhub/sessions/ID/env/reset); repeat it. Default: every registered env.")
@click.option("--max-envs", type=click.IntRange(min=1), default=1024, show_default=True,
              help="The most envs hosted at once; a reset past it is answered 429 until a session ends.")
def proxy_command(model_path: str, kind: str, served_name: str | None, host: str, port: int, max_tokens: int, max_body_bytes: int,
                  env_ids: tuple[str, ...], max_envs: int) -> None:
    """Serve MODEL at http://HOST:PORT/v1 as an OpenAI chat-completions endpoint, recording every call.

    A client sends its session id as its API key (or the X-Envhub-Session header); each session's
    calls are recorded with their prompt token ids, sampled token ids and log-probs. Read a session
    at GET /v1/envhub/sessions/ID (DELETE to take it and free it), post its reward to POST /v1/envhub/sessions/ID/reward, and see
    how many calls folded into trajectories at GET /v1/envhub/stats. An agent may play an envhub env
    the proxy hosts for its session (envhub_trl.proxy.client.ProxyEnv), which then scores the session.
    """
    from envhub.cli import _check_listen_address
    from envhub_trl.generators import load_generator
    from envhub_trl.models import resolve_model
    from envhub_trl.proxy import ChatProxy, HostedEnvs
    from envhub_trl.proxy.server import create_app

    _check_listen_address(host, port)
    try:
        generator = load_generator(kind, resolve_model(model_path))
        proxy = ChatProxy(generator, generator.tokenizer, model=served_name or model_path, default_max_tokens=max_tokens)
    except (EnvhubError, ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    import uvicorn

    click.echo(f"serving {model_path} ({kind}) on http://{host}:{port}/v1 as model {proxy.model!r}; "
               "each client's API key (or X-Envhub-Session header) is its session id", err=True)
    envs = HostedEnvs(proxy.store, env_ids=env_ids or None, max_envs=max_envs)
    try:
        uvicorn.run(create_app(proxy, max_body_bytes=max_body_bytes, envs=envs), host=host, port=port, log_level="warning")
    finally:
        envs.close()
