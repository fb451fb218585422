"""The learning-curve picture ``envhub train`` leaves in its output folder."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def plot_learning_curve(
    log_history: Sequence[Mapping[str, Any]],
    path: str | Path,
    held_out: Mapping[str, Mapping[str, Mapping[int, float]]] | None = None,
    title: str = "",
) -> Path:
    """Draw the training batches' success rate per step with held-out success beside it, one
    panel per env (a mix logs each env's success as ``env/<id>/success_rate``), and the batches'
    mean return.

    Args:
        log_history: ``trainer.state.log_history`` (entries with ``step`` and ``env/...`` keys).
        path: where to write the PNG.
        held_out: per env id (``""`` for a single-env run), held-out success rates to mark, by
            label, each by optimizer step (e.g. before and after RL).
        title: the figure's title.

    Returns:
        ``path``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [entry for entry in log_history if "env/success_rate" in entry]
    steps = [entry["step"] for entry in rows]
    panels = list(held_out or {"": {}})
    figure, axes = plt.subplots(1, len(panels) + 1, figsize=(5 * (len(panels) + 1), 4), squeeze=False)
    for axis, env_id in zip(axes[0], panels):
        key = f"env/{env_id}/success_rate" if env_id else "env/success_rate"
        points = [(entry["step"], entry[key]) for entry in rows if key in entry]
        axis.plot([p[0] for p in points], [p[1] for p in points], label="training batches (sampled)", color="tab:blue")
        for label, marks in (held_out or {}).get(env_id, {}).items():
            axis.plot(list(marks), list(marks.values()), "o--", label=label)
        axis.set_xlabel("optimizer step")
        axis.set_ylabel("success rate")
        axis.set_ylim(-0.02, 1.02)
        axis.legend(loc="lower right", fontsize="small")
        if env_id:
            axis.set_title(env_id, fontsize="medium")
    right = axes[0][-1]
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
