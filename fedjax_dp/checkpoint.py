"""Checkpoint and resume one run with orbax (``fedjax-dp run --checkpoint-every K``, ``--resume``).

Every ``K`` rounds, and after the last, :class:`Checkpointer` saves the whole
run to ``OUTPUT_DIR/checkpoints/<round>/``, two orbax items:

* ``state``: every leaf of the :class:`fedjax_dp.round.RoundState` (global
  model, server optimizer state, aggregator state, per-client rows, the
  algorithm's server state such as adaptive clip bounds, the round counter),
  restored into the structure of the resumed run's freshly built state;
* ``host`` (JSON): the round, the run's whole configuration and release mode,
  the sampler's state (its NumPy Generator's exact bit-generator state, the
  capacity and how often it grew), the accounting's composed privacy events
  (:meth:`fedjax_dp.privacy.PrivacyLedger.state`; per client for
  example-level accounting), the records' state (the last evaluation, whether
  the run diverged, the clients' norms of every round so far), and each
  state leaf's path, shape and dtype.

Orbax writes a checkpoint into a temporary folder and renames it when it is
complete, so a run killed while saving leaves a temporary folder that is never
loaded (it is removed when the run next saves one); Ctrl-C or SIGTERM during a save takes
effect when the save has finished (:func:`_uninterrupted`); the last :data:`KEEP` checkpoints
are kept. The ``host`` item is saved with the SHA-256 of the state and of itself, and a resume
whose files do not match them is refused. Resuming truncates ``metrics.jsonl`` to the
checkpoint's round and recomputes the rounds after it: round ``r``'s key is
``fold_in(k_run, r)`` (:func:`fedjax_dp.round.run_keys`) and the sampler
continues from its saved state, so on the same machine a resumed run ends with
the same parameters, bit for bit, as an uninterrupted one
(:func:`params_sha256`), and ``metrics.jsonl`` has every round once.

A resumed run may have more rounds than the checkpoint's run planned (:func:`check_extension`:
extending a finished run) where no round it released changes: its noise multiplier was given,
not calibrated for ``target_epsilon`` over its rounds. The extended run equals, bit for bit, a
run of its rounds from the start; the rows it keeps are the ones the shorter run released, the
last of them with the evaluation that ended it. A resumed run that writes
TensorBoard events drops those past the checkpoint's round from ``tensorboard/``'s files in the
same way, and writes the rounds after it to a file of its own, so each step is there once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import pathlib
import struct
from typing import Optional

import jax
import numpy as np

from fedjax_dp import interrupts, outputs
from fedjax_dp.algorithms import unread_fields
from fedjax_dp.config import make_config
from fedjax_dp.errors import ConfigError, check
from fedjax_dp.observers import Start
from fedjax_dp.paths import is_dir

KEEP = 2  # checkpoints kept


def params_sha256(params) -> str:
  """SHA-256 of a pytree of arrays, independent of its container types and of the host's byte
  order: for every leaf in the order of its path (``jax.tree_util.keystr``, sorted), the path,
  the dtype and the shape, then the leaf's bytes, little-endian."""
  h = hashlib.sha256()
  leaves = [(jax.tree_util.keystr(p), np.asarray(leaf))
            for p, leaf in jax.tree_util.tree_flatten_with_path(params)[0]]
  for path, a in sorted(leaves, key=lambda kv: kv[0]):
    a = np.ascontiguousarray(a, a.dtype.newbyteorder("<"))
    h.update(f"{path}|{a.dtype.str}|{a.shape};".encode())
    h.update(a.tobytes())
  return h.hexdigest()


def _manager(folder: pathlib.Path, saves: bool = True):
  """Orbax's manager of ``folder``: one that ``saves`` removes the temporary folders of saves
  that never finished (awaited by its first save); one that only reads starts no such thread."""
  import orbax.checkpoint as ocp  # lazy: a slow import, which runs without checkpoints skip
  return ocp.CheckpointManager(folder.absolute(), options=ocp.CheckpointManagerOptions(
      max_to_keep=KEEP, enable_async_checkpointing=False, create=False,
      cleanup_tmp_directories=saves))


@contextlib.contextmanager
def _opened(folder: pathlib.Path):
  """A :func:`_manager` that only reads, closed when the block ends."""
  manager = _manager(folder, saves=False)
  try:
    yield manager
  finally:
    manager.close()


@contextlib.contextmanager
def _uninterrupted():
  """Ctrl-C and SIGTERM during the block (a checkpoint being saved, which orbax's threads write)
  take effect as a KeyboardInterrupt when it ends, so a save is never cut off half written."""
  caught = []
  with interrupts.handling(lambda signum, frame: caught.append(signum)):
    yield
  if caught:
    raise KeyboardInterrupt


def _host_sha256(host: dict) -> str:
  """SHA-256 of a ``host`` item's JSON (keys sorted), its own digests left out."""
  body = {k: v for k, v in host.items() if k not in ("sha256", "host_sha256")}
  return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def latest_round(output_dir) -> Optional[int]:
  """The round of the run's latest complete checkpoint in ``output_dir``, or None."""
  folder = pathlib.Path(output_dir) / outputs.CHECKPOINTS
  if not folder.is_dir():
    return None
  with _opened(folder) as manager:
    return manager.latest_step()


def _restore(manager, step: int, **items):
  import orbax.checkpoint as ocp  # lazy: a slow import, which runs without checkpoints skip
  try:
    return manager.restore(step, args=ocp.args.Composite(**items))
  except (OSError, ValueError, KeyError) as e:
    raise ConfigError("resume", str(manager.directory / str(step)), "the checkpoint cannot be "
                      f"read ({type(e).__name__}: {str(e)[:200]})") from None


# What resuming reads of a checkpoint's ``host`` item, and its JSON type.
_HOST = {"round": int, "config": dict, "release": str, "checkpoint_every": int, "sampler": dict,
         "accounting": (dict, type(None)), "log": dict, "leaves": list, "log_arrays": dict}
_HOST_LOG = ("accuracy", "loss", "diverged")  # what Records.resume reads of ``host["log"]``


def check_extension(stored: dict, rounds: int, where: str) -> None:
  """Refuses continuing the run whose configuration is ``stored`` (a checkpoint's, JSON) to
  ``rounds`` rounds where that would change a round it released: fewer rounds than it planned
  (a run is extended, never shortened), or more where its noise was calibrated for
  ``target_epsilon`` over its planned rounds (more rounds would need more noise in every round,
  those already released too). A fixed ``noise_multiplier`` reads no number of rounds: nothing
  else a round computes does (the evaluation after the last round adds one to the shorter run's
  last row, and the accounting composes the new rounds with those before).

  Args:
    stored: the configuration the checkpoint holds (its JSON: ``rounds``, ``target_epsilon``).
    rounds: the rounds the continued run asks for.
    where: the checkpoint, named in the error.

  Raises:
    ConfigError: naming ``rounds`` and the setting that forbids it (``where``: the checkpoint).
  """
  planned = stored.get("rounds")
  if rounds == planned:
    return
  check(isinstance(planned, int) and rounds > planned, "rounds", rounds,
        f"is below the resumed run's rounds={planned} ({where}): a run is extended, never "
        "shortened; leave --rounds out to continue it")
  config = make_config(stored)
  if config.target_epsilon is not None and "target_epsilon" not in unread_fields(config):
    raise ConfigError("rounds", rounds, f"cannot extend the resumed run ({where}): its noise "
                      f"was calibrated for target_epsilon={config.target_epsilon:g} over its "
                      f"{planned} rounds, and more rounds would need more noise in every round, "
                      "those it released too; start a new run (a run with a fixed "
                      "noise_multiplier can be extended)")


def _damaged(where: str, what: str) -> ConfigError:
  return ConfigError("resume", where, f"{what}: its files were changed or damaged; delete that "
                     "checkpoint to resume from the one before, or start again with --overwrite")


def _read_host(manager, step: int) -> dict:
  """The ``host`` item of checkpoint ``step``, checked to hold what resuming reads (:data:`_HOST`):
  a damaged one is refused naming the checkpoint and what it lacks."""
  import orbax.checkpoint as ocp  # lazy: a slow import, which runs without checkpoints skip
  host = _restore(manager, step, host=ocp.args.JsonRestore()).host
  where = str(manager.directory / str(step))
  if not isinstance(host, dict):
    raise _damaged(where, f"its host item is a JSON {type(host).__name__}, not an object")
  missing = [k for k in _HOST if k not in host]
  if missing:
    raise _damaged(where, f"its host item lacks {missing}")
  bounds = {"round": lambda v: v == step, "checkpoint_every": lambda v: v >= 1}
  wrong = [k for k, kind in _HOST.items()
           if not isinstance(host[k], kind) or kind is int and isinstance(host[k], bool)
           or not bounds.get(k, lambda v: True)(host[k])]
  if wrong:
    raise _damaged(where, f"its host item has an invalid {wrong}")
  missing = [f"log.{k}" for k in _HOST_LOG if k not in host["log"]]
  if missing:
    raise _damaged(where, f"its host item lacks {missing}")
  if host.get("host_sha256", _host_sha256(host)) != _host_sha256(host):  # older: none saved
    raise _damaged(where, "its host item (configuration, sampler, privacy accounting) does not "
                   "match the SHA-256 saved with it")
  return host


def read_meta(output_dir) -> dict:
  """The ``host`` item of the latest checkpoint in ``output_dir`` (its ``config``, ``release``,
  ``checkpoint_every``, ``round``, ...); :class:`ConfigError` when there is none."""
  check(is_dir(output_dir, "resume"), "resume", str(output_dir),
        "is not an existing folder: name the folder of the run to continue")
  step = latest_round(output_dir)
  check(step is not None, "resume", str(output_dir),
        f"holds no complete checkpoint in {outputs.CHECKPOINTS}/: nothing to resume (a run saves "
        "one every --checkpoint-every K rounds)")
  with _opened(pathlib.Path(output_dir) / outputs.CHECKPOINTS) as manager:
    return _read_host(manager, step)


def _leaves(state) -> list:
  """Each leaf of ``state`` as ``[path, shape, dtype]`` (JSON)."""
  return [[jax.tree_util.keystr(p), list(np.shape(leaf)), str(jax.numpy.result_type(leaf))]
          for p, leaf in jax.tree_util.tree_flatten_with_path(state)[0]]


def _by_index(leaves) -> dict:
  return {f"{i:05d}": leaf for i, leaf in enumerate(leaves)}


def _placed_like(host: np.ndarray, leaf):
  """``host`` (a restored leaf) placed as ``leaf`` (the fresh run's) is: with its sharding (the
  engine places the initial state replicated over the device mesh, where every round leaves
  it), so the first resumed round reuses the step compiled for the later ones."""
  sharding = getattr(leaf, "sharding", None)
  if sharding is None:
    return jax.numpy.asarray(host)
  return jax.make_array_from_callback(np.shape(host), sharding, lambda index: host[index])


def _kept_rows(path: pathlib.Path, rounds: int) -> list:
  """The first ``rounds`` rows of ``metrics.jsonl`` (rounds 1, 2, ...), to which the file is
  truncated: rows a killed run wrote after its checkpoint are recomputed. Read as bytes: what
  follows them (a partial row, bytes that are not UTF-8) is dropped, never decoded."""
  lines = path.read_bytes().split(b"\n")[:-1][:rounds] if path.exists() else []
  rows = []
  for i, line in enumerate(lines):
    try:
      row = json.loads(line.decode("utf-8"))
    except ValueError:  # json.JSONDecodeError, UnicodeDecodeError
      row = None
    if not isinstance(row, dict) or row.get("round") != i + 1:
      break
    rows.append(row)
  check(len(rows) == rounds, "resume", str(path),
        f"holds {len(rows)} complete rows of rounds 1, 2, ... but the checkpoint is at round "
        f"{rounds}: the folder's files are not one run's")
  kept = b"".join(line + b"\n" for line in lines)
  outputs.write_atomic(path, lambda tmp: tmp.write_bytes(kept))
  return rows


def _kept_events(folder: pathlib.Path, rounds: int) -> None:
  """Drops from the TensorBoard event files in ``folder`` every event past step ``rounds`` and
  what follows a partial record (a killed run's last write), as :func:`_kept_rows` truncates
  ``metrics.jsonl``: the resumed run writes the rounds after its checkpoint again, each once.

  An event file is a sequence of records (a little-endian uint64 length, its CRC, an ``Event``
  protobuf, its CRC); the records kept are copied byte for byte."""
  # Lazy: tensorboardX is optional (fedjax_dp[tensorboard]), read only by a run that writes events.
  from google.protobuf.message import DecodeError
  from tensorboardX.proto import event_pb2
  for path in sorted(folder.glob("events.out.tfevents.*")) if folder.is_dir() else []:
    data, i, kept = path.read_bytes(), 0, []
    while i + 12 <= len(data):
      (n,) = struct.unpack("<Q", data[i:i + 8])
      end = i + 12 + n + 4
      if end > len(data):
        break
      try:
        step = event_pb2.Event.FromString(data[i + 12:i + 12 + n]).step
      except DecodeError:
        break
      if step <= rounds:
        kept.append(data[i:end])
      i = end
    new = b"".join(kept)
    if new != data:
      outputs.write_atomic(path, lambda tmp, new=new: tmp.write_bytes(new))


class Checkpointer:
  """Checkpoints of one run: :func:`fedjax_dp.engine.run_group` makes it from the run's
  options, :meth:`begin` restores a resumed run before its first round, and the
  :class:`fedjax_dp.observers.Checkpoint` observer saves after the rounds :meth:`due` says.

  Args:
    every: save after every this many rounds (and after the last); None with ``resume``: as
      the checkpoint's run did.
    config: the run's whole configuration (JSON-able, e.g.
      :meth:`fedjax_dp.config.RunConfig.to_dict`): stored in every checkpoint, and
      a resumed run's must equal it.
    resume: continue from the latest checkpoint in the run's output folder
      instead of starting at round 0.
  """

  def __init__(self, every: Optional[int], config: dict, resume: bool = False):
    check(every is None and resume or isinstance(every, int) and not isinstance(every, bool)
          and every >= 1, "checkpoint_every", every, "must be an integer >= 1")
    check(jax.process_count() == 1, "checkpoint_every" if every else "resume",
          every if every else resume, f"is single-process, and this run has "
          f"{jax.process_count()} processes: orbax's save is collective (every process in one "
          "shared folder) and the runs' outputs are written by one process; run without it")
    self.every = every
    self.config = json.loads(json.dumps(config))  # as the JSON item stores it
    self.resume = resume
    self.folder = self.release = self.tensorboard = self.shards = None  # the run's, from begin
    self._manager = None

  def begin(self, state, experiment, rounds: int, shards: int, release: str,
            tensorboard: bool) -> tuple:
    """The run's starting point: round 0, or with ``resume`` the latest checkpoint's round, with
    the sampler and the accounting of ``experiment`` restored and the rows of ``metrics.jsonl``
    (and TensorBoard's events) past it dropped.

    A resumed run's ``shards``, ``release`` and ``tensorboard`` must equal the checkpoint's
    (another split sums the updates in another floating-point order).

    Args:
      state: the run's initial round state (a pytree; a restored one is placed on the devices
        as this one is).
      experiment: the run's experiment (its ``output_dir``, ``sampler`` and ``accounting``).
      rounds: the run's rounds ``T``.
      shards: the devices its clients are split over.
      release: what the run's records release (:data:`fedjax_dp.engine.RELEASES`).
      tensorboard: whether the run writes TensorBoard events.

    Returns:
      ``(state, start)``: the state to run from and its :class:`fedjax_dp.observers.Start`
      (with a resume: its round, the rows ``metrics.jsonl`` keeps, the saved record state and
      arrays).

    Raises:
      ConfigError: no output folder; a sampler or accounting without ``load_state``; with
        ``resume``: no complete checkpoint, a ``checkpoints/`` or (with ``tensorboard``)
        ``tensorboard/`` folder that takes no file (before anything is rewritten), or a
        checkpoint of another configuration, release, TensorBoard choice, split or state, or
        a damaged one.
    """
    check(experiment.output_dir is not None, "checkpoint_every", self.every,
          "needs an output_dir: checkpoints go to OUTPUT_DIR/checkpoints/")
    for part in (experiment.sampler, experiment.accounting):
      check(part is None or hasattr(part, "load_state"), "checkpoint_every", self.every,
            f"the run's {type(part).__name__} has no state/load_state to checkpoint")
    self.folder = pathlib.Path(experiment.output_dir)
    self.release, self.tensorboard, self.shards = release, bool(tensorboard), shards
    if not self.resume:
      return state, Start(rounds)
    step = latest_round(self.folder)
    check(step is not None, "resume", str(self.folder),
          f"holds no complete checkpoint in {outputs.CHECKPOINTS}/: nothing to resume")
    # The folders the resumed run writes into, checked before it rewrites anything (the rows
    # and events past the checkpoint): one that takes no file (read-only) refuses the resume.
    for name in (outputs.CHECKPOINTS, *([outputs.TENSORBOARD] if tensorboard else [])):
      outputs.check_writable(self.folder / name, "resume")
    with _opened(self.folder / outputs.CHECKPOINTS) as manager:
      host, where = _read_host(manager, step), str(manager.directory / str(step))
      self._check_same_run(host, where, release, tensorboard)
      check(host.get("shards", shards) == shards, "resume", where,
            f"the checkpoint's run split its clients over {host.get('shards')} devices and this "
            f"process over {shards} (--cpu-devices, devices): resume it on the split it ran on")
      check(host["leaves"] == _leaves(state), "resume", where,
            "the checkpoint's state has other leaves (paths, shapes, dtypes) than this run's")
      state, arrays = self._restored(manager, step, host, state)
    self._load(experiment, host, where)
    rows = _kept_rows(self.folder / outputs.METRICS, step)
    if step < rounds:  # a finished run extended: its summary and norms are written again at the end
      for name in (outputs.SUMMARY, outputs.NORMS):
        (self.folder / name).unlink(missing_ok=True)
    if tensorboard:  # the resumed run writes the rounds after ``step`` again
      _kept_events(self.folder / outputs.TENSORBOARD, step)
    return state, Start(rounds, step, tuple(rows), host["log"], arrays)

  def _check_same_run(self, host: dict, where: str, release: str, tensorboard: bool) -> None:
    """Refuses a checkpoint written by another configuration (but for more rounds, where
    :func:`check_extension` allows them), release or TensorBoard choice; takes its
    ``checkpoint_every`` where none was given."""
    differ = sorted(k for k in set(host["config"]) | set(self.config)
                    if host["config"].get(k) != self.config.get(k))
    if differ == ["rounds"]:
      check_extension(host["config"], self.config["rounds"], where)
      differ = []
    check(not differ, "resume", where,
          f"the checkpoint was written by another configuration (it differs in {differ})")
    check(host["release"] == release, "release", release,
          f"the checkpoint's run wrote release={host['release']!r} records")
    check(host.get("tensorboard", tensorboard) == tensorboard, "tensorboard", tensorboard,
          f"the checkpoint's run wrote tensorboard={host.get('tensorboard')} (TensorBoard events "
          "of every round or of none): resume it as it ran")
    self.every = self.every or host["checkpoint_every"]

  @staticmethod
  def _restored(manager, step: int, host: dict, state) -> tuple:
    """``(state, arrays)``: checkpoint ``step``'s state, placed as the run's initial ``state``
    is (:func:`_placed_like`), and its record arrays (``log``), checked against its SHA-256."""
    import orbax.checkpoint as ocp  # lazy: a slow import, which runs without checkpoints skip
    where = str(manager.directory / str(step))
    leaves, treedef = jax.tree_util.tree_flatten(state)
    # Restored into NumPy, then placed as the run's initial state was (_placed_like).
    try:
      log_arrays = {k: np.zeros(shape, dtype) for k, (shape, dtype) in host["log_arrays"].items()}
    except (TypeError, ValueError) as e:
      raise _damaged(where, "its host item's log_arrays cannot be read "
                     f"({type(e).__name__}: {str(e)[:200]})") from None
    target = {"round_state": _by_index([np.zeros(np.shape(a), a.dtype) for a in leaves]),
              "log": log_arrays}
    restored = _restore(manager, step, state=ocp.args.StandardRestore(target)).state
    digest = params_sha256(restored)
    if host.get("sha256", digest) != digest:
      raise _damaged(where, "the checkpoint's state does not match the SHA-256 saved with it")
    state = treedef.unflatten([_placed_like(restored["round_state"][k], leaf)
                               for k, leaf in _by_index(leaves).items()])
    return state, restored["log"]

  @staticmethod
  def _load(experiment, host: dict, where: str) -> None:
    """Restores ``experiment``'s sampler and accounting from a checkpoint's ``host`` item."""
    try:
      experiment.sampler.load_state(host["sampler"])
      if experiment.accounting is not None:
        experiment.accounting.load_state(host["accounting"])
    except ConfigError:
      raise
    except (KeyError, TypeError, ValueError, IndexError) as e:
      raise _damaged(where, "its host item's sampler or accounting state cannot be loaded "
                     f"({type(e).__name__}: {str(e)[:200]})") from None

  def close(self) -> None:
    """Stops the checkpoint manager's threads (the run has ended, or failed to begin)."""
    if self._manager is not None:
      self._manager.close()
      self._manager = None

  def due(self, done: int, rounds: int) -> bool:
    """Whether the run is saved after ``done`` of its ``rounds``: every ``every`` and the last."""
    return done % self.every == 0 or done == rounds

  def save(self, done: int, state, experiment, log_host: dict, log_arrays: dict) -> None:
    """Saves the run after round ``done``: ``state``, ``experiment``'s sampler and accounting,
    and the records' state, with SHA-256 digests that a resume checks.

    Args:
      done: the rounds done, the checkpoint's step.
      state: the round state (a pytree of arrays).
      experiment: the run's experiment (its ``sampler`` and ``accounting`` are saved).
      log_host: the records' JSON state (:meth:`fedjax_dp.engine.Records.state`).
      log_arrays: the records' arrays by name (NumPy).
    """
    import orbax.checkpoint as ocp  # lazy: a slow import, which runs without checkpoints skip
    # Opened at the first save: a new run's first record has removed an earlier run's folder,
    # and a resumed run's begin only read.
    if self._manager is None:
      (self.folder / outputs.CHECKPOINTS).mkdir(parents=True, exist_ok=True)
      self._manager = _manager(self.folder / outputs.CHECKPOINTS)
    accounting = experiment.accounting
    host = {"round": done, "config": self.config, "release": self.release,
            "checkpoint_every": self.every, "tensorboard": self.tensorboard,
            "shards": self.shards,
            "sampler": experiment.sampler.state(),
            "accounting": None if accounting is None else accounting.state(),
            "log": log_host, "leaves": _leaves(state),
            "log_arrays": {k: [list(v.shape), str(v.dtype)] for k, v in log_arrays.items()}}
    tree = {"round_state": _by_index(jax.tree_util.tree_leaves(state)), "log": log_arrays}
    # Checked on resume: a changed or damaged state or host item is refused.
    host["sha256"] = params_sha256(tree)
    host["host_sha256"] = _host_sha256(host)
    with _uninterrupted():
      self._manager.save(done, args=ocp.args.Composite(state=ocp.args.StandardSave(tree),
                                                       host=ocp.args.JsonSave(host)))
