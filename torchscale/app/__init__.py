"""Use cases: what each ``torchscale`` command does, apart from how the command line reads
options and prints. Each command of ``cli/`` calls exactly one of them.

Each use case takes a typed request (a dataclass) and returns a typed outcome; it writes nothing
to stdout. Lines meant for the user during the work (where results go, a tool warning) go through
a ``notify`` callback that the CLI points at stderr. Heavy modules (torch, pandas) are imported
inside the functions, so ``torchscale --help`` and config errors stay torch-free.
"""

from typing import Callable

Notify = Callable[[str], None]
"""Where a use case sends a line for the user while it works (the CLI: stderr)."""
