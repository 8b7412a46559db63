"""torchrun itself (``torch.distributed.run.main``, what the ``torchrun`` script calls), ended
without the interpreter's teardown once its workers are done.

With torch loaded, Python's teardown of the agent process takes ~0.6 s after ``main`` has
returned (measured on a 2-vCPU VM: workers done, ``main`` back 0.1 s later, the process gone
0.6 s after that), on every launch. Everything the agent does (rendezvous, workers, their exit
codes, the error file) is torchrun's; only the exit is ``os._exit``, with torchrun's exit code.
Nothing from torchscale is imported here.
"""

from __future__ import annotations

import os
import sys
import traceback


def _code(exc: SystemExit) -> int:
    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0
    print(exc.code, file=sys.stderr)  # what Python prints for sys.exit("message")
    return 1


def main() -> None:
    from torch.distributed.run import main as torchrun

    code = 0
    try:
        torchrun()
    except SystemExit as exc:
        code = _code(exc)
    except KeyboardInterrupt:
        code = 130
    except BaseException:  # a failed worker (ChildFailedError), a signal: as Python would report
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
