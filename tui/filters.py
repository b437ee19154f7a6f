"""The rank filter typed after ``/``: ``0-3,7``, ``pp=1``, ``dp=0 tp=1``, ``node=1``, ``host=gpu-b``, or nothing
for every rank."""

from __future__ import annotations

import re
from collections.abc import Callable

from meshtop.probes.errors import MeshtopError
from meshtop.tui.view_records import RankView

COORDINATE = re.compile(r"^(pp|dp|tp|node)=(\d+)$")
HOST = re.compile(r"^host=(\S+)$")
RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


class FilterError(MeshtopError):
    """A rank filter that does not parse."""


def parse_rank_filter(text: str) -> Callable[[RankView], bool]:
    """A predicate on ranks: ranks and ranges by number (``0-3,7``) and / or mesh coordinates (``pp=1``)."""
    ranks: set[int] = set()
    coordinates: dict[str, int] = {}
    hosts: set[str] = set()
    for word in re.split(r"[,\s]+", text.strip()):
        if not word:
            continue
        if match := COORDINATE.match(word):
            coordinates[match.group(1)] = int(match.group(2))
        elif match := HOST.match(word):
            hosts.add(match.group(1))
        elif match := RANGE.match(word):
            first = int(match.group(1))
            last = int(match.group(2)) if match.group(2) else first
            if last < first:
                raise FilterError(f"rank range {word} runs backwards: write {last}-{first}")
            ranks.update(range(first, last + 1))
        else:
            raise FilterError(
                f"{word!r} is not a rank filter: use ranks (0-3,7), mesh positions (pp=1 dp=0), "
                "a node (node=1) or a host (host=NAME)"
            )

    def keep(view: RankView) -> bool:
        if ranks and view.rank not in ranks:
            return False
        if hosts and view.host not in hosts:
            return False
        return all(
            getattr(view, "node" if dim == "node" else f"{dim}_rank") == value for dim, value in coordinates.items()
        )

    return keep


def every_rank(view: RankView) -> bool:
    return True
