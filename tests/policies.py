"""Scripted policies for the engine tests: arm choices fixed in advance, no learning."""
from __future__ import annotations


class Blocks:
    """Arm 0 for `length` steps, then arm 1 for `length`, and so on: switches make lazy drafts catch up."""

    def __init__(self, length: int = 2) -> None:
        self.length = length
        self.t = -1

    def select(self) -> int:
        self.t += 1
        return (self.t // self.length) % 2

    def update(self, arm: int, reward: float) -> None:
        return None
