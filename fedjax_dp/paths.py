"""Looking a path up without a traceback: each function names the setting the path came from.

The file system can refuse to look a path up (a name longer than it allows, a folder that may
not be entered, a loop of links) or the current folder can be gone; ``pathlib`` then raises an
OSError or answers False. These functions answer with a :class:`fedjax_dp.errors.ConfigError`
naming the setting and its value instead, so that the command line refuses the value in one line.
"""

from __future__ import annotations

import os
import pathlib
import stat
from typing import Optional

from fedjax_dp.errors import ConfigError


def absolute(path, field: str = "output_dir") -> pathlib.Path:
  """``path`` made absolute (a relative one joined to the current folder).

  Raises:
    ConfigError: naming ``field`` and ``path``, when ``path`` is relative and the current folder
      no longer exists (deleted after the command started in it).
  """
  try:
    return pathlib.Path(path).absolute()
  except FileNotFoundError:  # os.getcwd(): the current folder was deleted
    raise ConfigError(field, str(path), "is relative to the current folder, which no longer "
                      "exists (it was deleted): give an absolute path, or run the command from "
                      "an existing folder") from None


def _status(path, field: str) -> Optional[os.stat_result]:
  """``path``'s status (links followed); None where nothing is there.

  Raises:
    ConfigError: naming ``field`` and ``path``, when the file system cannot look ``path`` up (a
      name longer than it allows, a folder that may not be entered, a loop of links), where
      ``pathlib`` raises the OSError or answers False.
  """
  try:
    return os.stat(path)
  except (FileNotFoundError, NotADirectoryError):
    return None
  except OSError as e:
    raise ConfigError(field, str(path), f"cannot be looked up ({e.strerror or e})") from None


def is_dir(path, field: str) -> bool:
  """Whether ``path`` is a folder (:func:`_status`: a path the file system cannot look up is
  refused, naming ``field``)."""
  status = _status(path, field)
  return status is not None and stat.S_ISDIR(status.st_mode)


def is_file(path, field: str) -> bool:
  """Whether ``path`` is a regular file (:func:`_status`: a path the file system cannot look up
  is refused, naming ``field``)."""
  status = _status(path, field)
  return status is not None and stat.S_ISREG(status.st_mode)
