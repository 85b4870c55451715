"""The arbiter's revision: one counter its parts share, so that what they derived can be reused."""

from __future__ import annotations


class Revision:
    """Bumped whenever capacity, claims or the line change.

    An answer derived from them (a group's last rejection, whether a gang fits
    one domain) stays good while the counter stays put: a storm of retried
    members of one gang costs one packing, not one per member.
    """

    __slots__ = ("version",)

    def __init__(self) -> None:
        self.version = 0

    def bump(self) -> None:
        self.version += 1
