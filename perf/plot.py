"""One line plot of median time vs N for the benchmarks here (matplotlib, as `bootstrap bench --png`)."""
from __future__ import annotations

import sys
from typing import Mapping, Sequence


def line_plot(path: str, title: str, xs: Sequence[int], series: Mapping[str, Sequence[float | None]], *,
              xlabel: str, prefix: str) -> None:
    """Write a PNG with one line per series (None: no point there); without matplotlib, say so."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"{prefix}: no matplotlib: PNG skipped (pip install matplotlib, or pip install '.[png]' in the clone)",
              file=sys.stderr, flush=True)
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    try:
        for label, ys in series.items():
            ax.plot(list(xs), [float("nan") if y is None else y for y in ys], marker="o", label=label)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("wall time, median (s)")
        ax.set_ylim(bottom=0)
        ax.set_xticks(list(xs))
        ax.grid(alpha=0.3)
        ax.legend()
        ax.set_title(title)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
