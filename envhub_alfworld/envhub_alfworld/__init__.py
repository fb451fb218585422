"""ALFWorld for envhub: the official games when downloaded, and tasks generated offline."""

from envhub_alfworld.tasks import TASK_TYPES, generate_task, official_tasks

__all__ = ["TASK_TYPES", "generate_task", "official_tasks"]

# Importing the package registers its ids with envhub and Gymnasium (Gymnasium 1.x loads no plugins).
from envhub.plugins import load_on_import as _load_on_import  # noqa: E402

_load_on_import("alfworld")
