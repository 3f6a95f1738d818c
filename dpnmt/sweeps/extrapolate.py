"""What more epochs would buy: a saturating fit of a measured validation BLEU curve.

BLEU(e) = a − b·exp(−e/τ) (a: the plateau the curve approaches) fitted by least
squares (scipy) to the measured points. Its values past the last measured epoch
are EXTRAPOLATED, not measured: `describe` says so in every line it writes,
and names no plateau when the fitted time scale τ exceeds half the measured
epochs (the data then do not pin the plateau down).
"""

import dataclasses
import math

import numpy as np
from scipy import optimize

MIN_POINTS = 4  # Three parameters: fewer points fit any curve exactly.
LABEL = "EXTRAPOLATED (not measured)"


@dataclasses.dataclass(frozen=True)
class SaturatingFit:
    """BLEU(e) = plateau − drop·exp(−e/scale), fitted on points up to `last_epoch`."""

    plateau: float
    drop: float
    scale: float
    last_epoch: float
    num_points: int
    rms_residual: float

    def at(self, epoch: float) -> float:
        """The fitted BLEU at `epoch` (extrapolated past `last_epoch`)."""
        return self.plateau - self.drop * math.exp(-epoch / self.scale)


def fit(epochs, bleu) -> SaturatingFit | None:
    """Fits the curve; None when fewer than `MIN_POINTS` points or the fit does not converge.

    Args:
      epochs: [P] epochs of the validation points (> 0).
      bleu: [P] validation BLEU at those epochs.
    """
    e, y = np.asarray(epochs, np.float64), np.asarray(bleu, np.float64)
    if e.size < MIN_POINTS or e.size != y.size:
        return None

    def curve(x, plateau, drop, scale):
        return plateau - drop * np.exp(-x / scale)

    start = (float(y.max()), float(y.max() - y.min()) or 1.0, float(e.max()) / 2 or 1.0)
    bounds = ([0.0, -np.inf, 1e-3], [100.0, np.inf, 1e3 * float(e.max())])
    try:
        params, _ = optimize.curve_fit(curve, e, y, p0=start, bounds=bounds, maxfev=10000)
    except (RuntimeError, ValueError):
        return None
    residual = float(np.sqrt(np.mean((curve(e, *params) - y) ** 2)))
    return SaturatingFit(*map(float, params), float(e.max()), int(e.size), residual)


def describe(name: str, curve: list[dict], at_epochs: float | None = None) -> str:
    """One labelled line: the fit of a run's validation BLEU curve and its extrapolation.

    Args:
      name: the run's name.
      curve: `runs_table.validation_curve` points.
      at_epochs: where to extrapolate (default: twice the last measured epoch).
    """
    points = [(p["epoch"], p["bleu"]) for p in curve if "bleu" in p and p["epoch"] > 0]
    result = fit([p[0] for p in points], [p[1] for p in points])
    if result is None:
        return f"- {name}: no extrapolation ({len(points)} validation BLEU points, or no fit)."
    target = at_epochs or 2 * result.last_epoch
    flattened = result.scale <= result.last_epoch / 2
    plateau = (
        f"plateau {result.plateau:.2f}"
        if flattened
        else "plateau not identified (the curve has not flattened: τ > half the measured epochs)"
    )
    sign = "−" if result.drop >= 0 else "+"  # A negative drop: the fitted curve falls.
    falls = "" if result.drop >= 0 else "; the fitted curve falls"
    first = points[0][0]
    if result.scale < first / 2:  # The rise ended before the first point: b is not identified.
        shape = (
            f"flat from the first point: the fitted rise ends before epoch {first:.1f} "
            f"(τ {result.scale:.2f}), so only the plateau is fitted"
        )
        falls = ""
    else:
        shape = f"{result.plateau:.2f} {sign} {abs(result.drop):.2f}·exp(−epoch/{result.scale:.2f})"
    return (
        f"- {name}: measured validation BLEU {points[-1][1]:.2f} at epoch "
        f"{result.last_epoch:.1f}; {LABEL}: {result.at(target):.2f} at epoch {target:.1f}, "
        f"{plateau} (fit {shape} to {result.num_points} points, "
        f"rms residual {result.rms_residual:.2f} BLEU{falls})."
    )
