"""Ctrl-C (SIGINT) and SIGTERM, handled alike by the command line and by a checkpoint's save."""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Callable, Iterator


@contextlib.contextmanager
def handling(handler: Callable) -> Iterator[None]:
  """During the block, Ctrl-C and SIGTERM call ``handler(signum, frame)``; the earlier handlers
  come back after it. Only the main thread can set handlers: elsewhere nothing changes. A signal
  the process was started ignoring (SIGINT in a shell's background job) stays ignored."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  signals = [s for s in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(s) != signal.SIG_IGN]
  previous = {s: signal.signal(s, handler) for s in signals}
  try:
    yield
  finally:
    for s, earlier in previous.items():
      signal.signal(s, earlier)
