"""Matplotlib figures of the experiments (imported lazily).

Every figure is a `matplotlib.figure.Figure` drawn and saved directly (no
pyplot, no global backend switch), so importing the experiments never
changes a user's matplotlib state.

Figures are kept small (about 6x4 inches at 80 dpi) so the committed PNGs
stay well under 200 KB.
"""

import os

import numpy as np

DPI = 80


def _figure(figsize):
    from matplotlib.figure import Figure

    return Figure(figsize=figsize)


def _subplots(figsize, rows=1, cols=1, squeeze=True):
    fig = _figure(figsize)
    axes = fig.subplots(rows, cols, squeeze=squeeze)
    return fig, axes


def _save(fig, path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    return path


def lines(path, series, title, xlabel, ylabel="test accuracy", logx=False,
          hlines=None):
    """Curves with std bands.

    Args:
        series: list of (label, x (T,), mean (T,), std (T,) or None).
        hlines: optional list of (label, y) horizontal references.
    """
    fig, ax = _subplots((6, 4))
    for label, x, mean, std in series:
        x, mean = np.asarray(x, float), np.asarray(mean, float)
        (line,) = ax.plot(x, mean, marker="o", ms=3, label=label)
        if std is not None:
            std = np.asarray(std, float)
            ax.fill_between(x, mean - std, mean + std, alpha=0.2,
                            color=line.get_color())
    for label, y in hlines or []:
        ax.axhline(y, ls="--", color="gray", label=label)
    if logx:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def curve_panels(path, panels, title, xlabel="optimizer steps",
                 ylabel="test accuracy"):
    """One subplot per panel, each with several curves.

    Args:
        panels: list of (panel title, series) with series as in `lines`.
    """
    fig, axes = _subplots((4 * len(panels), 3.6), 1, len(panels),
                          squeeze=False)
    for ax, (panel_title, series) in zip(axes[0], panels):
        for label, x, mean, std in series:
            x, mean = np.asarray(x, float), np.asarray(mean, float)
            (line,) = ax.plot(x, mean, label=label)
            if std is not None:
                std = np.asarray(std, float)
                ax.fill_between(x, mean - std, mean + std, alpha=0.2,
                                color=line.get_color())
        ax.set_title(panel_title, fontsize=9)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def scatter_panels(path, panels, title):
    """t-SNE panels: list of (panel title, points (N, 2), groups (N,) int)."""
    fig, axes = _subplots((3.6 * len(panels), 3.6), 1, len(panels),
                          squeeze=False)
    for ax, (panel_title, points, groups) in zip(axes[0], panels):
        ax.scatter(points[:, 0], points[:, 1], c=groups, cmap="tab20", s=4,
                   linewidths=0)
        ax.set_title(panel_title, fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def matrix_panels(path, panels, labels, title):
    """Confusion matrices: list of (panel title, (c, c) row-normalised)."""
    fig, axes = _subplots((3.6 * len(panels), 3.8), 1, len(panels),
                          squeeze=False)
    for ax, (panel_title, matrix) in zip(axes[0], panels):
        ax.imshow(matrix, vmin=0, vmax=1, cmap="Blues")
        ax.set_title(panel_title, fontsize=9)
        ticks = np.arange(len(labels))
        ax.set_xticks(ticks)
        ax.set_yticks(ticks)
        ax.set_xticklabels(labels, rotation=90, fontsize=5)
        ax.set_yticklabels(labels, fontsize=5)
        ax.set_xlabel("predicted", fontsize=7)
    axes[0][0].set_ylabel("true", fontsize=7)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def heatmap(path, matrix, row_labels, col_labels, title, vmin=-1, vmax=1):
    """A signed heat map (e.g. correlations), with a colour bar."""
    fig, ax = _subplots((7, 3.5))
    image = ax.imshow(matrix, aspect="auto", vmin=vmin, vmax=vmax,
                      cmap="coolwarm")
    ax.set_yticks(np.arange(len(row_labels)))
    ax.set_yticklabels(row_labels, fontsize=6)
    if col_labels is not None:
        ax.set_xticks(np.arange(len(col_labels)))
        ax.set_xticklabels(col_labels, rotation=90, fontsize=5)
    fig.colorbar(image, ax=ax)
    ax.set_title(title, fontsize=9)
    return _save(fig, path)


def band_panels(path, panels, title, xlabel="optimizer steps",
                ylabel="validation accuracy", ncols=2):
    """Mean curves with 95% confidence bands, one subplot per panel.

    Args:
        panels: list of (panel title, series); series: list of (label,
            x (T,), mean (T,), low (T,) or None, high (T,) or None).
    """
    rows = int(np.ceil(len(panels) / ncols))
    cols = min(ncols, len(panels))
    fig, axes = _subplots((4.6 * cols, 3.4 * rows), rows, cols, squeeze=False)
    for ax in axes.ravel()[len(panels):]:
        ax.set_visible(False)
    for ax, (panel_title, series) in zip(axes.ravel(), panels):
        for label, x, mean, low, high in series:
            x, mean = np.asarray(x, float), np.asarray(mean, float)
            (line,) = ax.plot(x, mean, label=label, lw=1.2)
            if low is not None:
                ax.fill_between(x, np.asarray(low, float),
                                np.asarray(high, float), alpha=0.18,
                                color=line.get_color(), lw=0)
        ax.set_title(panel_title, fontsize=9)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)
