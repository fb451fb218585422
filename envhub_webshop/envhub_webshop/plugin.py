"""Registers the WebShop environments and the ``envhub webshop`` commands with envhub."""

from envhub import hookimpl

ENTRY = "envhub_webshop.env:WebShopEnv"
MAX_TURNS = 15


@hookimpl
def register_envs(register):
    register(
        "webshop/WebShop-v0",
        ENTRY,
        kwargs={"split": "train"},
        max_turns=MAX_TURNS,
        description="1,000-product shop, synthetic goals 1500+ (5,410 train goals), 15 turns",
    )
    register(
        "webshop/WebShopEval-v0",
        ENTRY,
        kwargs={"split": "eval"},
        max_turns=MAX_TURNS,
        description="1,000-product shop, synthetic goals 500-1499 (eval split), 15 turns",
    )
    register(
        "webshop/WebShopTest-v0",
        ENTRY,
        kwargs={"split": "test"},
        max_turns=MAX_TURNS,
        description="1,000-product shop, synthetic goals 0-499 (test split), 15 turns",
    )
    register(
        "webshop/WebShopTools-v0",
        "envhub_webshop.tools_env:WebShopToolsEnv",
        kwargs={"split": "train"},
        max_turns=MAX_TURNS,
        description="WebShop-v0 with tools: search(query), click(target), buy(); same shop, goals and reward, 15 turns",
    )


@hookimpl
def register_commands(cli):
    from envhub_webshop.commands import webshop

    cli.add_command(webshop)
