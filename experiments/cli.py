"""What the experiments' command lines share: argument types (a bad number is argparse's one-line
usage error, exit 2, not a traceback from deep inside a run) and the reports' "mean ± s.e." cell."""
from __future__ import annotations

import argparse
import math

from torchgeo_int._validate import check_int, check_real


def number(kind: str, lo, **kw):
    """An argparse type: the project's own check (``check_int`` / ``check_real``) of the parsed
    number, its ValueError turned into argparse's usage error (no traceback)."""
    def parse(text):
        value = int(text) if kind == "int" else float(text)   # argparse: "invalid int value: 'x'"
        try:
            return check_int(value, "the value", lo) if kind == "int" else check_real(value, "the value", lo, **kw)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err).replace("the value ", "")) from None
    parse.__name__ = kind
    return parse


def known(ap: argparse.ArgumentParser, flag: str, given, allowed) -> None:
    """Names given to ``flag`` that are not among ``allowed``: argparse's usage error."""
    unknown = [g for g in given if g not in allowed]
    if unknown:
        ap.error(f"{flag}: unknown {', '.join(map(repr, unknown))}; known: {', '.join(map(str, allowed))}")


def mean_pm_se(mean, se) -> str:
    """A report's cell: "mean ± s.e.", the mean alone where the s.e. is not finite (one seed),
    "—" without a mean."""
    if mean is None:
        return "—"
    return f"{mean:.3g} ± {se:.2g}" if se is not None and math.isfinite(se) else f"{mean:.3g}"
