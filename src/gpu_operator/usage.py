"""A command used in a way it cannot run: an option missing, or one it cannot use as given.

In the lowest layer so that any command, the agents' included, can raise it where it finds the
problem; :mod:`gpu_operator.cli_errors` turns it into one line and exit code 2 (usage)."""

from __future__ import annotations


class UsageProblem(ValueError):
    """An option missing or unusable: ``what`` says which and why, ``todo`` what to pass
    instead. A ValueError, as argparse's own refusals are about values; its own kind so the
    exit code says usage (2), not bad input (1)."""

    def __init__(self, what: str, todo: str = "") -> None:
        self.what, self.todo = what, todo
        super().__init__(f"{what}: {todo}" if todo else what)
