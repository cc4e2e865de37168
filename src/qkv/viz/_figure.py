"""The Figure class of :mod:`qkv.viz`: matplotlib's, plus the methods a notebook displays.

Imported only when a figure is made, since matplotlib is optional.
"""

from __future__ import annotations

import io

from matplotlib.figure import Figure

__all__ = ["DisplayFigure"]


class DisplayFigure(Figure):
    """A :class:`matplotlib.figure.Figure` that shows itself in a notebook whatever the backend.

    A figure built without ``pyplot`` (as every figure of :mod:`qkv.viz` is) has no display of
    its own: Jupyter shows ``<Figure size 720x900 with 7 Axes>`` unless ``%matplotlib inline``
    registered matplotlib's formatter first. :meth:`_repr_png_` is that display, built from the
    figure itself: a cell ending with the figure shows the picture (and where matplotlib's own
    inline formatter is registered, IPython uses that one: still one picture, never two).
    """

    def _repr_png_(self) -> bytes:
        buf = io.BytesIO()
        self.savefig(buf, format="png", dpi=self.dpi, bbox_inches="tight")
        return buf.getvalue()
