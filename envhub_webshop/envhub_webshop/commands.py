"""``envhub webshop ...``: the plugin's command-line group (``serve``)."""

from __future__ import annotations

import click

from envhub_webshop.catalog import FULL, SMALL
from envhub_webshop.errors import DataNotFound


@click.group(name="webshop")
def webshop() -> None:
    """The WebShop environment: serve the shop as web pages."""


@webshop.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0 for every interface).")
@click.option("--port", default=3000, show_default=True, type=click.IntRange(0, 65535), help="Port (0 picks a free one).")
@click.option("--split", default="test", show_default=True, type=click.Choice(["test", "eval", "train", "all"]), help="Goals new visitors get.")
@click.option("--data", "data_dir", type=click.Path(file_okay=False), default=None, help="Data directory (default: $ENVHUB_WEBSHOP_DATA or ~/.cache/envhub/webshop).")
@click.option("--setting", default=SMALL, show_default=True, type=click.Choice([SMALL, FULL]), help="1,000 products or the full set.")
@click.option("--no-quirks", is_flag=True, help="Fix upstream's colour-normalisation quirk in the reward.")
@click.option("--verbose", is_flag=True, help="Log every request.")
@click.option("--max-connections", default=1024, show_default=True, type=click.IntRange(min=1),
              help="Connections served at once (a thread each); more get an immediate 503. Each read waits 10 s at most.")
@click.option("--max-sessions", default=1000, show_default=True, type=click.IntRange(min=1),
              help="Sessions remembered, per tier: new visitors, and visitors who came back (a flood of new ones never evicts the latter).")
@click.option("--idle-minutes", default=60.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="A session unused this long expires.")
def serve(
    host: str, port: int, split: str, data_dir: str | None, setting: str, no_quirks: bool, verbose: bool,
    max_connections: int, max_sessions: int, idle_minutes: float,
) -> None:
    """Serve the shop as web pages, one session per visitor, until Ctrl-C."""
    from envhub_webshop.server import make_server
    from envhub_webshop.shop import load_shop

    try:
        shop = load_shop(data_dir, setting=setting)
    except DataNotFound as exc:
        raise click.ClickException(str(exc)) from None
    try:
        server = make_server(
            shop, host, port, shop.goal_set.split(split), upstream_quirks=not no_quirks,
            max_connections=max_connections, max_sessions=max_sessions, idle_seconds=60 * idle_minutes,
        )
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror or exc}; try another --port") from None
    server.verbose = verbose
    click.echo(f"WebShop: {len(shop.catalog)} products, {len(server.split_indices)} {split} goals, title nouns by {shop.nouns.name}")
    click.echo(f"Serving on {server.url}/ (Ctrl-C to stop)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        click.echo("stopped")
    finally:
        server.server_close()
