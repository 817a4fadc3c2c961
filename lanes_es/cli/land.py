"""`lanes-es land SLUG [--onto BRANCH]`: a completed batch onto your branch, by fast-forward only."""

from __future__ import annotations

import argparse
from typing import Any

DESCRIPTION = """\
Fast-forward your branch to the completed batch's branch imm/SLUG: the branch checked out in this
checkout, or --onto BRANCH. Only a fast-forward: refused (exit 2, nothing changed) when the batch did
not complete or its final verification failed, when your branch has commits the batch branch does not,
or when an uncommitted change in the checkout is one the fast-forward would overwrite. Then the batch's
state and report are written into this checkout (where `lanes-es verify` reads them) and its
coordinator worktree is removed, unless it holds uncommitted work (it is kept, and said so)."""


def register(commands: Any) -> None:
    from lanes_es.cli.main import SLUG_HELP

    command = commands.add_parser("land", help="fast-forward your branch to a completed batch's branch",
                                  description=DESCRIPTION)
    command.add_argument("slug", metavar="SLUG", help=SLUG_HELP)
    command.add_argument("--onto", default=None, metavar="BRANCH",
                         help="the branch to land on (default: the branch checked out here)")
    command.set_defaults(func=_land)


def _land(args: argparse.Namespace) -> int:
    from lanes_es.cli.main import deps_of
    from lanes_es.usecases.land import land

    print(land(deps_of(args), args.slug, args.onto).text())
    return 0
