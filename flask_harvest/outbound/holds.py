"""Episodes of an endpoint held back by its rate limit, and when one is long enough to tell. Pure.

A delivery held by its rate limit is told how long until its turn (:func:`~.rate.take`): it
cannot be sent before then, so the endpoint is known to be held back from that hold until that
turn. An *episode* is one unbroken stretch of such holds: it starts at a hold when none is going
on, and each later hold stretches it to its own turn if that is later. It ends when no delivery
is held for ``gap`` microseconds past the latest turn handed out (the backlog drained, and stayed
drained that long), and the next hold starts a new one.

An episode is *long* once it spans ``threshold`` microseconds from its first hold to its latest
known turn; :func:`note_hold` says so exactly once per episode, however many deliveries are held
in it and however many processes ask (the Redis script in
:mod:`~flask_harvest.outbound.hold_episodes` runs the same arithmetic atomically).

Times are integer microseconds, as in :mod:`~flask_harvest.outbound.rate`. No Flask, SQL, Redis or
HTTP here.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HoldEpisode", "expires_in", "note_hold"]


@dataclass(frozen=True)
class HoldEpisode:
    """One endpoint's episode: ``since`` (its first hold), ``until`` (the latest turn handed out),
    and whether it was told already (``told``)."""

    since: int
    until: int
    told: bool = False

    @property
    def span(self) -> int:
        """Microseconds from the first hold to the latest turn known."""
        return self.until - self.since


def note_hold(
    episode: HoldEpisode | None, now: int, wait: int, *, threshold: int, gap: int
) -> tuple[HoldEpisode, bool]:
    """Count a hold at ``now`` whose turn is ``wait`` microseconds away.

    Returns the episode after it, and whether this hold is the one that makes it long (``True``
    once per episode: the caller tells then). ``episode`` is ``None`` when none is known (or it
    expired: :func:`expires_in`).
    """
    if episode is None or now > episode.until + gap:
        episode = HoldEpisode(since=now, until=now)
    until = max(episode.until, now + max(0, wait))
    tell = not episode.told and until - episode.since >= threshold
    return HoldEpisode(episode.since, until, episode.told or tell), tell


def expires_in(episode: HoldEpisode, now: int, gap: int) -> int:
    """Microseconds after which ``episode`` is over (no hold came ``gap`` past its latest turn):
    it can be forgotten then, and ``note_hold(None, ...)`` answers as it would."""
    return max(0, episode.until + gap - now)
