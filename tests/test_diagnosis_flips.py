"""A loss that flips between NaN and finite every few lines (issue 45): `progress.track` does work linear in the
chunk, not a scan to the chunk's end per flip. Checked by counting the bytes its pattern searches pass over (an
injected counter around the patterns), not by timing: before the fix, a 3,000-flip chunk had its patterns scan the
chunk thousands of times over."""

from __future__ import annotations

import re

import pytest

from tasks.diagnosis import progress

FLIPS = 3000
SHAPES = {
    "keyed": (b"step {n} | loss: nan | grad_norm: nan", b"step {n} | loss: 2.{n} | grad_norm: 0.5"),
    "bare tensor": (b"tensor(nan, device='cuda:0')", b"tensor(2.{n}, device='cuda:0')"),
    "progress bar": (b"{n}/9000 [00:01<00:09, 21.7it/s, d=0.7, g=nan]", b"{n}/9000 [00:01<00:09, 21.7it/s, d=0.7, g=1.{n}]"),
}


class _Counted:
    """A compiled pattern whose searches add the bytes they pass over (from `pos` to the match's end, or to the end
    of the range searched) to a shared count."""

    def __init__(self, pattern: re.Pattern[bytes], scanned: list[int]) -> None:
        self.pattern, self.scanned = pattern, scanned

    def search(self, low: bytes, pos: int = 0, endpos: int | None = None) -> re.Match[bytes] | None:
        stop = len(low) if endpos is None else min(endpos, len(low))
        m = self.pattern.search(low, pos, stop)
        self.scanned[0] += (stop if m is None else m.end()) - pos
        return m


def _flipping(nan_line: bytes, finite_line: bytes) -> tuple[bytes, int]:
    """A chunk of FLIPS rounds of 2 NaN prints then 3 finite ones, ending on 2 NaN prints; the first line of that
    last NaN run."""
    lines = []
    for k in range(FLIPS):
        lines += [(nan_line if i < 2 else finite_line).replace(b"{n}", str(5 * k + i).encode()) for i in range(5)]
    lines += [nan_line.replace(b"{n}", b"0")] * 2
    return b"\n".join(lines) + b"\n", len(lines) - 1


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_flipping_loss_is_tracked_in_work_linear_in_the_chunk(shape: str, monkeypatch: pytest.MonkeyPatch) -> None:
    low, last_run = _flipping(*SHAPES[shape])
    scanned = [0]
    for name in ("_TOKENS", "_FINITE", "_NONFINITE"):
        monkeypatch.setattr(progress, name, tuple(_Counted(p, scanned) for p in getattr(progress, name)))
    loss, _ = progress.track(low)
    assert (loss.first, loss.last_start, loss.end) == (1, last_run, "nan")
    # Each pattern passes over the chunk a few times at most: 20 chunk lengths is generous; a re-scan to the chunk's
    # end per flip is thousands.
    assert scanned[0] < 20 * len(low), f"{scanned[0] / len(low):.1f} chunk lengths scanned"


def test_the_next_match_is_remembered_but_not_past_a_rewind() -> None:
    """The cursor answers a later position from its last search, and searches again for an earlier one."""
    low, scanned = b"a nan b nan c", [0]
    cursor = progress._Next(_Counted(re.compile(rb"nan"), scanned), low)
    assert [cursor.at(0), cursor.at(2), cursor.at(3), cursor.at(9), cursor.at(0)] == [2, 2, 8, None, 2]
    assert cursor.searches == 4
