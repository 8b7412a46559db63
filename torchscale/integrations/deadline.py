"""Every call into an integration ends within its deadline, answered or not.

An MLflow server that accepts connections and never answers, or a tracking folder on a hung
network mount, would otherwise hold the sweep: MLflow's own client retries with back-off for
minutes. Each call runs in a daemon thread that the caller waits for at most its deadline
(a tracking server: ``--integration-timeout``, :data:`DEFAULT_TIMEOUT_S`; a local store:
:func:`local_deadline`); a call still running then is left behind (it never touches the results)
and the caller stops using that integration, so a dead server costs the deadline once.
"""

from __future__ import annotations

import ssl
import threading
import urllib.error
import urllib.request
from typing import Any, Callable, Dict, Optional, TypeVar

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 5.0
"""How long one call to a tracking server may take (``--integration-timeout``)."""
LOCAL_TIMEOUT_S = 60.0
"""How long one call into a local store (TensorBoard event files, an MLflow folder or SQLite
file) may take, unless ``--integration-timeout`` is longer: that is disk and CPU work (MLflow
creates its SQLite tables in seconds), which a loaded host slows down without anything being
wrong; only a hung file system takes this long."""


def local_deadline(timeout_s: float) -> float:
    return max(timeout_s, LOCAL_TIMEOUT_S)


class Unanswered(Exception):
    """The call did not return within its deadline."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        super().__init__(f"no answer within {timeout_s:g} s")


def call_with_deadline(timeout_s: float, function: Callable[..., T], *args: Any) -> T:
    """``function(*args)``'s value or exception, or :class:`Unanswered` after ``timeout_s``."""
    outcome: Dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = function(*args)
        except BaseException as exc:  # handed to the caller
            outcome["error"] = exc

    thread = threading.Thread(target=run, name="torchscale-integration", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise Unanswered(timeout_s)
    if "error" in outcome:
        raise outcome["error"]
    value: T = outcome["value"]
    return value


def unreachable(url: str, timeout_s: float) -> Optional[str]:
    """Why the HTTP server at ``url`` cannot be reached (refused, no answer within ``timeout_s``,
    no such host), or None: any HTTP answer, an error status or a TLS handshake included, means
    it is there."""

    def ask() -> None:
        with urllib.request.urlopen(url, timeout=timeout_s):  # http(s) only
            pass

    try:
        call_with_deadline(timeout_s, ask)
    except urllib.error.HTTPError:
        return None
    except Unanswered as exc:
        return str(exc)
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ssl.SSLError):  # it answered; MLflow has its own TLS settings
            return None
        if isinstance(exc.reason, TimeoutError):  # urlopen's own timeout won the race
            return str(Unanswered(timeout_s))
        return str(exc.reason)
    except TimeoutError:  # the socket's timeout, the same limit as the deadline's
        return str(Unanswered(timeout_s))
    except OSError as exc:  # a reset connection
        return str(exc) or type(exc).__name__
    return None
