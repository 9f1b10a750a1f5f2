"""Argument types of the `frenzy` commands: numbers with their allowed range, so bad input is an exit-2 message
naming the range instead of a traceback, a hang or a silently accepted value."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def bounded_int(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse type: an integer in [lo, hi], else a message with the range."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"{v} is out of range: give {lo} to {hi}")
        return v

    return parse


def bounded_float(lo: float, hi: float) -> Callable[[str], float]:
    """An argparse type: a finite number in [lo, hi] (the range the help states, both ends included)."""

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (math.isfinite(v) and lo <= v <= hi):
            raise argparse.ArgumentTypeError(f"{text} is out of range: give a number from {lo} to {hi}")
        return v

    return parse
