"""A plugin that calls sys.exit() when imported (it must not take the host down)."""

import sys

sys.exit("this plugin exits on import")
