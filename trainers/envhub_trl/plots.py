"""The learning-curve picture ``envhub train`` leaves in its output folder."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def plot_learning_curve(
    log_history: Sequence[Mapping[str, Any]],
    path: str | Path,
    held_out: Mapping[str, Mapping[int, float]] | None = None,
    title: str = "",
) -> Path:
    """Draw the training batches' success rate and mean return per step, and held-out success.

    Args:
        log_history: ``trainer.state.log_history`` (entries with ``step`` and ``env/...`` keys).
        path: where to write the PNG.
        held_out: held-out success rates to mark, by label, each by optimizer step (e.g. before
            and after RL).
        title: the figure's title.

    Returns:
        ``path``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [entry for entry in log_history if "env/success_rate" in entry]
    steps = [entry["step"] for entry in rows]
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(steps, [entry["env/success_rate"] for entry in rows], label="training batches (sampled)", color="tab:blue")
    for label, points in (held_out or {}).items():
        left.plot(list(points), list(points.values()), "o--", label=label)
    left.set_xlabel("optimizer step")
    left.set_ylabel("success rate")
    left.set_ylim(-0.02, 1.02)
    left.legend(loc="lower right", fontsize="small")
    right.plot(steps, [entry["env/mean_return"] for entry in rows], color="tab:green")
    right.set_xlabel("optimizer step")
    right.set_ylabel("mean episode return (training batches)")
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
