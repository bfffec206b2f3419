"""The run loop: host-side sampling and accounting around one compiled round.

::

  host (NumPy)                          device (one jitted function)
  sample cohort -> padded ids + mask -> gather client rows, program.round_step
  accounting.on_round(cohort)           (while the round runs)
  metrics.jsonl, progress bar   <-      metrics

The *program* is a :class:`fedjax_dp.round.Round` (the static structure of
the one round) run with its ``hparams``: the jitted step is
:func:`fedjax_dp.round.compiled_step`, cached per Round, so two runs that
differ only in hyper-parameters share one compilation (and so does the
test-set evaluation, cached per model). ``metrics`` holds per-client arrays
``client_loss``, ``update_norm`` and ``mask`` (others pass through when
scalar).

Released and diagnostic outputs. A run's records keep apart what the privacy
guarantee covers from raw statistics it does not:

* covered (top level of each ``metrics.jsonl`` row and of ``summary.json``):
  the test accuracy and loss of the released model, and the scalar metrics a
  program lists in ``released_metrics`` (computed only from the noisy
  release, e.g. the norm of the noisy aggregate, an adaptive clip bound set
  from noisy statistics);
* public by design: the round number, the configuration, and the accounting
  fields (epsilon and its parts are functions of public settings);
* raw diagnostics, under ``diagnostics``: the realized cohort size, client
  losses, pre-clip update norms and the fraction clipped, every other program
  metric, the timings, how many accounting workers ran and how many epsilons
  they computed (:mod:`fedjax_dp.privacy.ahead`), and the sampler's capacity
  (which grows with a large draw). None of these is noised.

``release="private"`` writes (and returns) only the first two groups, and
draws the mechanism's randomness from the operating system's entropy: with
``release="all"`` the recorded seed fixes every draw (the noise included), so
it is secret, not public (:data:`RANDOMNESS`, the release block's
``randomness``).

Files in ``output_dir``: ``metrics.jsonl`` (one record per round),
``summary.json``, with ``release="all"`` ``norms.npz`` (every real client's
pre-clip update norm per round, :class:`_Log`), and with ``tensorboard``
TensorBoard event files in ``tensorboard/`` (the records' numbers as scalars
tagged by their ``metrics.jsonl`` names, the diagnostics under
``diagnostics/`` with a histogram of the update norms; with
``release="private"`` only the released values).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import pathlib
import secrets
import threading
import time
import weakref
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp import outputs
from fedjax_dp import provenance as run_provenance
from fedjax_dp.checkpoint import params_sha256
from fedjax_dp.errors import check, check_choice
from fedjax_dp.jsonio import dumps

PLACEMENTS = ("device", "host")
RELEASES = ("all", "private")
ROW_COVERED = ("test_accuracy", "test_loss", "diverged")
# params_sha256: a hash of the released model (post-processing of it, like its test accuracy).
SUMMARY_COVERED = ("final_accuracy", "final_test_loss", "diverged", "params_sha256")
# Computed on the test set: covered only when it is apart from the clients' data.
FROM_TEST_SET = ("test_accuracy", "test_loss", "diverged", "final_accuracy", "final_test_loss")
PUBLIC_BY_DESIGN = ("round", "rounds", "config (its seed: see 'randomness')", "noise_multiplier",
                    "model", "data", "provenance",
                    "epsilon and every field of the "
                    "privacy report (functions of the public settings and, for example-level runs, of "
                    "the public participation and example counts)")
# What the release block says of the seed (``randomness``), by release mode.
RANDOMNESS = {
    "all": "secret, not public: config.seed fixes every draw of the mechanism (the cohorts, the "
           "noise, the sign flips, the clients' batches), so whoever holds it can recompute the "
           "noise and subtract it; the guarantee holds against an adversary who does not. It is "
           "recorded so that the simulation can be re-run; release 'private' draws these from the "
           "operating system's entropy instead and records nothing of them",
    "private": "the mechanism's draws (the cohorts, the noise, the sign flips, the clients' "
               "batches) came from 128 bits of the operating system's entropy, recorded nowhere, "
               "so this run cannot be re-run to the same outputs; config.seed fixed only what is "
               "public by design: the data partition, the initial model, and shared public "
               "randomness (DDGauss's rotation, SP-FL's privacy classes)",
}


def _any_guarantee(report: dict) -> bool:
  """Whether a privacy report (summary fields) gives a formal guarantee to any client: the
  whole run's, or one privacy class's (example-level runs)."""
  return bool(report.get("formal_guarantee")) or any(
      c.get("formal_guarantee") for c in (report.get("classes") or {}).values())


def is_released(name: str, released_metrics) -> bool:
  """Whether a program metric is in ``released_metrics`` (names; a trailing ``*`` is a prefix)."""
  return any(name == r or (r.endswith("*") and name.startswith(r[:-1])) for r in released_metrics)


def _flat(record: dict, prefix: str = "") -> dict:
  """``{"diagnostics": {"update_norm": {"q50": x}}}`` -> ``{"update_norm.q50": x}`` (numbers only)."""
  out = {}
  for k, v in record.items():
    if isinstance(v, dict):
      out.update(_flat(v, "" if k == "diagnostics" else f"{prefix}{k}."))
    elif isinstance(v, (int, float)) and not isinstance(v, bool) or v is None:
      out[prefix + k] = v
  return out


class Stopped(Exception):
  """A run ended before its last round because its caller asked it to (:func:`run_group`'s
  ``stop``)."""


@dataclasses.dataclass
class RunResult:
  """A finished run.

  Attributes:
    history: one record per round (as written to ``metrics.jsonl``).
    summary: the run's summary (as written to ``summary.json``).
    state: the final :class:`fedjax_dp.round.RoundState` (``state.params``: the model). It is
      the simulation's whole state, released or not, under either ``release``: besides the
      model it holds every client's raw per-client state rows (``state.rows``: DP-RSA's
      workers' local models, which no mechanism protects) and the server's state; what a run
      releases is its model and what it writes.
  """

  history: list
  summary: dict
  state: Any

  @property
  def metrics(self) -> dict:
    """Per-round metrics as arrays ``[rounds]``: name -> float64 values, NaN where a round has
    none (test accuracy between evaluations). Diagnostics are flattened into the same names
    (``train_loss``, ``update_norm.q50``, ...)."""
    rows = [_flat(r) for r in self.history]
    names = sorted({k for r in rows for k in r})
    return {k: np.array([np.nan if r.get(k) is None else float(r[k]) for r in rows])
            for k in names}

  def to_dataframe(self):
    """The per-round metrics as a pandas ``DataFrame`` indexed by round, an integer (needs
    pandas)."""
    try:
      import pandas as pd
    except ImportError as e:
      raise ImportError("RunResult.to_dataframe needs pandas (pip install pandas); "
                        "RunResult.metrics has the same columns as NumPy arrays") from e
    m = self.metrics
    if "round" not in m:
      return pd.DataFrame(m)
    return pd.DataFrame(m).astype({"round": np.int64}).set_index("round")


@functools.lru_cache(maxsize=64)
def _evaluate_fn(model, experiments: Optional[str] = None):
  """The jitted test-set evaluation of ``model``, compiled once per model and test-set shape.

  ``experiments``: None for one model; "shared": parameters with a leading
  experiment axis, one test set; "stacked": a test set per experiment too.
  """
  from fedjax_dp.models import masked_sums

  def evaluate(params, xs, ys, ms):
    def chunk(args):
      x, y, m = args
      return masked_sums(model.apply(params, x), y, m)
    loss, correct, n = (jnp.sum(a) for a in jax.lax.map(chunk, (xs, ys, ms)))
    return correct / n, loss / n

  if experiments is not None:
    evaluate = jax.vmap(evaluate, in_axes=(0, None, None, None) if experiments == "shared" else 0)
  return jax.jit(evaluate)


def _test_chunks(test_x: np.ndarray, test_y: np.ndarray, batch_size: int):
  """The test set as ``[chunks, batch]`` arrays and a mask of its real examples."""
  n = len(test_y)
  bs = min(batch_size, n)
  chunks = -(-n // bs)
  pad = chunks * bs - n
  xs = np.concatenate([test_x, np.zeros((pad,) + test_x.shape[1:], test_x.dtype)])
  ys = np.concatenate([test_y, np.zeros((pad,) + test_y.shape[1:], test_y.dtype)])
  ms = (np.arange(chunks * bs) < n).astype(np.float32)
  return (xs.reshape((chunks, bs) + test_x.shape[1:]), ys.reshape((chunks, bs) + test_y.shape[1:]),
          ms.reshape(chunks, bs))


def make_evaluator(model, test_x: np.ndarray, test_y: np.ndarray, batch_size: int = 1024,
                   experiments: Optional[str] = None):
  """``params -> (accuracy, loss)`` over the whole test set, in fixed-size chunks (jitted once).

  ``experiments`` (:func:`_evaluate_fn`): "shared" or "stacked" evaluate
  parameters with a leading experiment axis, on one test set or (then
  ``test_x``, ``test_y`` are sequences) on each experiment's own.
  """
  if experiments == "stacked":
    arrays = [np.stack(a) for a in zip(*[_test_chunks(x, y, batch_size)
                                         for x, y in zip(test_x, test_y)])]
  else:
    arrays = _test_chunks(test_x, test_y, batch_size)
  xs, ys, ms = (jnp.asarray(a) for a in arrays)
  fn = _evaluate_fn(model, experiments)
  return lambda params: fn(params, xs, ys, ms)


def quantiles(values) -> dict:
  """``{"q10", "q50", "q90"}``: the 10th, 50th and 90th percentiles of ``values`` (NaN when
  there are none); the one summary of a round's client norms in summaries, reports and plots."""
  values = np.asarray(values, float)
  probs = [0.1, 0.5, 0.9]
  if not values.size:
    q = [math.nan] * 3
  elif np.isfinite(values).all():
    q = np.quantile(values, probs)
  else:  # a diverged client: NumPy's interpolation between two equal infinities is inf - inf
    with np.errstate(invalid="ignore"):
      q = np.quantile(values, probs)
    lo, hi = (np.quantile(values, probs, method=m) for m in ("lower", "higher"))
    q = np.where(lo == hi, lo, q)
  return {"q10": float(q[0]), "q50": float(q[1]), "q90": float(q[2])}


def client_norms(metrics: dict, shards: int = 1) -> np.ndarray:
  """The real (unmasked) clients' pre-clip update norms of one round's ``metrics``, in the
  cohort's order (its slots dealt out over ``shards`` devices by :func:`_pad_cohort`)."""
  mask = np.asarray(metrics["mask"])
  slots = _dealt_slots(len(mask), shards)
  return np.asarray(metrics["update_norm"])[slots[mask[slots] > 0]]


def summarize_round(metrics: dict, clip: Optional[float], released_metrics=()) -> tuple:
  """Host-side summary of one round's metrics: ``(released, diagnostics)``.

  ``released`` holds the scalar metrics named in ``released_metrics``;
  ``diagnostics`` the realized cohort size, the real clients' mean loss, the
  quantiles of their pre-clip update norms (``ClientOut.norm``: the raw local update, before
  any transform), the fraction of those above the clip bound (``fraction_clipped``; where a
  transform precedes the clip, LUS's sparsification, the clip sees a smaller norm, so this is
  an upper bound on the fraction it scales down) and every other scalar metric (raw, not
  covered by any guarantee).
  """
  mask = np.asarray(metrics["mask"]) > 0
  diag = {"cohort_size": int(mask.sum())}
  losses = np.asarray(metrics["client_loss"])[mask]
  diag["train_loss"] = float(losses.mean()) if losses.size else None
  norms = client_norms(metrics)
  diag["update_norm"] = {"mean": float(norms.mean()), **quantiles(norms)} if norms.size else {}
  if clip is not None and norms.size:
    diag["fraction_clipped"] = float(np.mean(norms > clip))
  released = {}
  for k, v in metrics.items():
    if k not in ("client_loss", "update_norm", "mask") and np.ndim(v) == 0:
      (released if is_released(k, released_metrics) else diag)[k] = float(v)
  return released, diag


def provenance(model, state, data) -> dict:
  """What the run actually used: the model (name, parameter count, shapes) and the data set.

  Public by design: the population size and the test set are part of the
  setting; per-client example counts are raw and go to the diagnostics.
  """
  from fedjax_dp.models import num_params
  params = state.params
  return {
      "model": {"name": getattr(model, "name", type(model).__name__),
                "parameters": int(num_params(params)),
                "input_shape": list(getattr(model, "input_shape", ())),
                "num_classes": getattr(model, "num_classes", None)},
      "data": {"name": data.name, "num_clients": int(data.num_clients),
               "example_shape": list(data.example_shape), "num_classes": int(data.num_classes),
               "test_examples": int(len(data.test_y))},
  }


def noise_multiplier(accounting) -> Optional[float]:
  """The noise multiplier of a run's mechanism (``accounting.mechanism``), None without one."""
  return getattr(getattr(accounting, "mechanism", None), "noise_multiplier", None)


def run_keys(seed: int, secret: Optional[int] = None):
  """``(k_init, k_run)``: the initial state is ``program.init(k_init, hparams)``, round ``r``'s
  key ``fold_in(k_run, r)`` (a builder that must see the initial model uses ``k_init`` too).
  ``secret``: a 128-bit integer folded into ``k_run`` only (a private release's entropy), so the
  rounds' draws do not follow from ``seed`` while the initial model still does."""
  k_init, k_run = jax.random.split(jax.random.PRNGKey(seed))
  if secret is not None:
    for word in range(4):
      k_run = jax.random.fold_in(k_run, (secret >> (32 * word)) & 0xFFFFFFFF)
  return k_init, k_run


def check_checkpoint_release(release: str, every) -> None:
  """Refuses checkpoints (``every``: how often, None without) of a private release: they would
  hold its secret draws (the sampler's state, the round key) and every client's raw state."""
  check(every is None or release != "private", "checkpoint_every", every,
        "is refused with release='private': a checkpoint would hold the run's secret randomness "
        "(the sampler's state and round key) and every client's raw state; run with "
        "release='all' to checkpoint")


def clip_bound(program, hparams) -> Optional[float]:
  """The L2 bound of the round's clip transform (for ``fraction_clipped``), or None."""
  bound = getattr(program.client, "bound", None)
  return None if bound is None else float(hparams[bound])


@dataclasses.dataclass
class Experiment:
  """One run of a group that shares a :class:`fedjax_dp.round.Round` (:func:`run_group`).

  Attributes:
    hparams: its hyper-parameters (name -> array).
    data: its :class:`fedjax_dp.data.FederatedData`.
    sampler: its host sampler (``sample() -> Cohort``).
    seed: its PRNG seed (:func:`run_keys`).
    accounting: its privacy accounting (``on_round``, ``report``), or None.
    output_dir: where its ``metrics.jsonl`` and ``summary.json`` go (none: not written).
    config: its configuration, copied into the summary.
    on_round: called with each of its round records.
    tensorboard: also write TensorBoard event files to ``output_dir/tensorboard/`` (needs
      ``output_dir`` and tensorboardX: ``pip install 'fedjax_dp[tensorboard]'``).
  """

  hparams: dict
  data: Any
  sampler: Any
  seed: int = 0
  accounting: Any = None
  output_dir: Optional[str] = None
  config: Optional[dict] = None
  on_round: Optional[Callable[[dict], None]] = None
  tensorboard: bool = False


def run(program, data, sampler, rounds: int, *, hparams: Optional[dict] = None, seed: int = 0,
        accounting=None,
        eval_every: int = 1, output_dir: Optional[str] = None, tensorboard: bool = False,
        progress: bool = True,
        config: Optional[dict] = None, placement: str = "device",
        on_round: Optional[Callable[[dict], None]] = None, release: str = "all",
        client_chunk: Optional[int] = None, devices: Optional[int] = None,
        checkpoint=None, accounting_workers: Optional[int] = None) -> RunResult:
  """Runs ``rounds`` federated rounds and returns the history and a summary.

  Args:
    program: the algorithm's :class:`fedjax_dp.round.Round`.
    hparams: its hyper-parameters (name -> array).
    data: a :class:`fedjax_dp.data.FederatedData`.
    sampler: a host sampler with ``sample() -> Cohort``.
    rounds: number of rounds T.
    seed: PRNG seed: same seed, same result.
    accounting: privacy accounting (``on_round``, ``report``), or None.
    eval_every: evaluate on the test set every this many rounds (and at the end).
    output_dir: if given, ``metrics.jsonl`` gets one line per round (flushed as
      it goes) and ``summary.json`` is written at the end (and ``norms.npz``, module
      docstring).
    tensorboard: also write TensorBoard event files to ``output_dir/tensorboard/``
      (:class:`Experiment`).
    progress: show a progress bar.
    config: the run's configuration, copied into the summary.
    placement: "device" keeps every client's data on the accelerator and
      gathers the cohort inside the compiled round; "host" keeps the clients'
      data on the host and gathers each cohort's rows there (``data.rows(ids)``),
      the next round's while the current one runs (for populations that do not
      fit on the device: device memory O(cohort)).
    on_round: optional callback with each round's record.
    release: "all" (default) keeps the raw diagnostics under ``diagnostics``
      in every record and in the summary; "private" leaves them out, so the
      outputs hold only what the guarantee covers and what is public by
      design (module docstring), and draws the mechanism's randomness (the
      rounds' keys, the cohorts) from secret entropy instead of ``seed``
      (:data:`RANDOMNESS`); checkpoints are refused with it.
    client_chunk: run the cohort in blocks of this many vmapped clients on each device
      (:func:`fedjax_dp.round.run_clients`); None: all at once.
    devices: split the cohort's clients over this many devices (default: all).
    checkpoint: a :class:`fedjax_dp.checkpoint.Checkpointer`: save the run every K
      rounds into ``output_dir/checkpoints/``, or resume it from there.
    accounting_workers: worker processes computing a PLD run's per-round epsilons ahead of
      its rounds (:mod:`fedjax_dp.privacy.ahead`; the same values); None: automatic (none on
      a CPU).
  """
  experiment = Experiment(dict(hparams or {}), data, sampler, seed, accounting, output_dir, config,
                          on_round, tensorboard)
  return run_group(program, [experiment], rounds, eval_every=eval_every, progress=progress,
                   placement=placement, release=release, client_chunk=client_chunk,
                   devices=devices, checkpoint=checkpoint,
                   accounting_workers=accounting_workers)[0]


def _epsilons_ahead(experiments, rounds: int, requested: Optional[int]):
  """Worker processes (:class:`fedjax_dp.privacy.ahead.Ahead`, None without workers:
  :func:`fedjax_dp.privacy.ahead.workers_for`) given, in round order, the PLD epsilons that
  the experiments' next ``rounds`` reports will give when they are known before the rounds
  (a ledger whose event does not depend on the draw, ``upcoming``); the reports that depend
  on the cohorts (``pending``) are given to them as each round is accounted
  (:meth:`_Log.account`)."""
  from fedjax_dp.privacy.ahead import Ahead, workers_for
  workers = workers_for(requested, jax.default_backend())
  if not workers:
    return None
  ahead = Ahead(workers)
  per_run = [e.accounting.upcoming(rounds) for e in experiments
             if hasattr(e.accounting, "upcoming")]
  ahead.submit([key for same_round in zip(*[k for k in per_run if k]) for key in same_round])
  return ahead


@functools.lru_cache(maxsize=None)
def _round_keys(single: bool, sharding) -> Callable:
  """``fn(run_key, r)``: round ``r``'s key, ``fold_in(k_run, r)``, of one experiment's run key
  or of every experiment's (stacked), in one compiled call, placed by ``sharding``."""
  return jax.jit(jax.random.fold_in if single else
                 jax.vmap(jax.random.fold_in, in_axes=(0, None)), out_shardings=sharding)


def group_mode(experiments) -> Optional[str]:
  """How a group's data sets enter its vmapped step (:func:`fedjax_dp.round.compiled_step`):
  None for one experiment; "shared" when every experiment has the same data set (held once);
  "stacked" when they differ (each distinct population once, indexed per experiment,
  :class:`fedjax_dp.round.DataSets`; a test set per experiment), which needs equal shapes
  (``ConfigError`` otherwise: such experiments are different groups).
  """
  first = experiments[0].data
  if len(experiments) == 1:
    return None
  if all(e.data is first for e in experiments):
    return "shared"
  for e in experiments[1:]:
    d = e.data
    check(d.x.shape == first.x.shape and d.y.shape == first.y.shape
          and d.test_x.shape == first.test_x.shape, "experiments", d.name,
          "a group's data sets must have the same shapes (clients, examples, test set)")
  return "stacked"


def experiments_vmapped() -> bool:
  """Whether a group's experiments run side by side (``vmap``) in its compiled round: on
  accelerators, yes (that is what fills them); on a CPU (one device or several) they run one
  after another inside the round (``lax.map``), at par with separate runs: vmapped, the
  experiments' models leave the cache and every client block runs while any experiment has a
  real client in it (Cheng et al.'s 12-experiment MNIST grid ran at 0.55-0.65x the runs one
  after another, benchmarks/RESULTS.md)."""
  return jax.default_backend() != "cpu"


def _dealt_slots(capacity: int, shards: int) -> np.ndarray:
  """The slot of a cohort's k-th client, for every k: the cohort dealt out over the ``shards``
  devices' equal shares of ``capacity`` slots, the k-th client to share k mod shards."""
  assert capacity % shards == 0, (capacity, shards)  # the devices' equal shares
  k = np.arange(capacity)
  return (k % shards) * (capacity // shards) + k // shards


def _pad_cohort(cohort, capacity: int, shards: int = 1):
  """``cohort``'s real clients in ``capacity`` slots, the others inert (client 0, mask 0), dealt
  out over the ``shards`` devices' equal shares of the slots (the cohort's k-th real client in
  share k mod shards), so that each device runs as many real clients as the others: a device
  runs its share in client blocks and skips those that hold padding only (a Poisson cohort is
  padded far past its mean). Every draw a client's slot could decide is keyed by its id (client
  keys, attacks), so the slots change only the order of float sums."""
  from fedjax_dp.sampling import Cohort
  real = np.flatnonzero(cohort.mask > 0)
  slots = _dealt_slots(capacity, shards)[:len(real)]
  ids, mask = np.zeros(capacity, cohort.ids.dtype), np.zeros(capacity, cohort.mask.dtype)
  ids[slots], mask[slots] = cohort.ids[real], cohort.mask[real]
  return Cohort(ids, mask)


class _Log:
  """One experiment's records: its history, its open ``metrics.jsonl``, its last evaluation.

  With an output folder and ``release="all"`` it keeps each round's client norms and writes
  them to ``norms.npz`` beside ``summary.json`` at the end of the run: arrays
  ``round`` ``[R]`` (int32), ``offsets`` ``[R + 1]`` (int64), ``norms`` (float32, every round's
  real clients' pre-clip update norms one after another: round ``round[i]``'s are
  ``norms[offsets[i]:offsets[i + 1]]``) and ``clip`` (the clip bound; NaN without one). With
  the experiment's ``tensorboard`` it writes each record to ``tensorboard/`` (module docstring).
  """

  def __init__(self, program, experiment: Experiment, release: str,
               client_block: Optional[int] = None, checkpointed: bool = False, shards: int = 1):
    self.e = experiment
    self.shards = shards  # the devices the cohort's slots are dealt out over (_pad_cohort)
    self.release = release
    self.client_block = client_block
    self.slots = 0  # the most client slots a round has run on each device
    self.checkpointed = checkpointed  # the run saves checkpoints/ beside its outputs
    self.released_metrics = tuple(getattr(program, "released_metrics", ()))
    self.clip = clip_bound(program, experiment.hparams)
    self.history = []
    self.accuracy = self.loss = None
    self.diverged = False
    self.out_dir = pathlib.Path(experiment.output_dir) if experiment.output_dir else None
    self.file = None
    if self.out_dir is not None:
      self.file = outputs.MetricsFile(self.out_dir)
    self.norms = [] if self.out_dir is not None and release == "all" else None
    self.writer = None
    self.resumed_from = None  # the checkpoint's round, once resumed (:meth:`resume`)
    # The provenance blocks of the processes that ran the rounds before a resume, in order.
    self.earlier_provenance = []
    self._environment = None

  def account(self, cohort, ahead=None) -> dict:
    """Composes a round of ``cohort`` in the experiment's accounting and returns the epsilon
    fields of its record (none without accounting). A round's privacy cost depends on its
    cohort's draw, never on its results, so :func:`run_group` asks while the round runs.
    ``ahead``: the run's accounting workers, given what the report is about to compute."""
    accounting = self.e.accounting
    if accounting is None:
      return {}
    accounting.on_round(cohort)
    if ahead is not None and hasattr(accounting, "pending"):
      ahead.submit(accounting.pending())
    rep = accounting.report()
    return {"epsilon": rep.get("epsilon"),
            **{k: v for k, v in rep.items() if k.startswith("epsilon_")}}

  def round(self, r: int, metrics: dict, accounted: dict, evaluation, seconds: float) -> dict:
    released, diag = summarize_round(metrics, self.clip, self.released_metrics)
    rec = {"round": r + 1, **released, **accounted}
    if evaluation is not None:
      self.accuracy, self.loss = evaluation
      rec["test_accuracy"], rec["test_loss"] = self.accuracy, self.loss
      if not math.isfinite(self.loss):
        rec["diverged"] = self.diverged = True
    if self.release == "all":
      rec["diagnostics"] = dict(diag, seconds=seconds)
    self.history.append(rec)
    if self.file is not None:
      self.file.write(dumps(rec) + "\n")
      self.file.flush()
    norms = client_norms(metrics, self.shards)
    if self.norms is not None:
      self.norms.append(norms.astype(np.float32))
    if self.e.tensorboard:
      self._tensorboard(rec, norms)
    if self.e.on_round is not None:
      self.e.on_round(rec)
    return rec

  def _tensorboard(self, rec: dict, norms: np.ndarray) -> None:
    """The record's numbers as scalars at step ``round`` (diagnostics under ``diagnostics/``,
    with a histogram of the clients' update norms)."""
    if self.writer is None:  # after metrics.jsonl: its first write removed an earlier run's files
      from tensorboardX import SummaryWriter
      # A resumed run's file has a name of its own: tensorboardX names a file by the second it
      # opens it and truncates a file of that name (one the checkpoint's run opened that second).
      suffix = "" if self.resumed_from is None else f".resumed-{self.resumed_from}"
      self.writer = SummaryWriter(str(self.out_dir / outputs.TENSORBOARD), flush_secs=10,
                                  filename_suffix=suffix)
    step = rec["round"]
    scalars = _flat({k: v for k, v in rec.items() if k not in ("round", "diagnostics")})
    if "diagnostics" in rec:
      scalars.update({f"diagnostics/{k}": v for k, v in _flat(rec["diagnostics"]).items()})
      if norms.size:
        self.writer.add_histogram("diagnostics/update_norm", norms, step)
    for tag, v in scalars.items():
      if v is not None:
        self.writer.add_scalar(tag, v, step)

  def environment(self) -> dict:
    """This process's provenance block (:func:`fedjax_dp.provenance.environment`), read once."""
    if self._environment is None:
      self._environment = run_provenance.environment()
    return self._environment

  def state(self) -> tuple:
    """``(host, arrays)``: what a checkpoint keeps of these records besides ``metrics.jsonl``'s
    rows: the last evaluation and whether the run diverged (JSON), the provenance of every
    process that ran its rounds so far, the rounds' client norms."""
    processes = list(self.earlier_provenance)
    if not processes or processes[-1] != self.environment():
      processes.append(self.environment())
    host = {"accuracy": self.accuracy, "loss": self.loss, "diverged": self.diverged,
            "provenance": processes}
    if self.norms is None:
      return host, {}
    return host, {"norms": np.concatenate(self.norms).astype(np.float32),
                  "norm_counts": np.array([len(n) for n in self.norms], np.int64)}

  def resume(self, rows: list, host: dict, arrays: dict) -> None:
    """Continues from a checkpoint: ``rows`` (those ``metrics.jsonl`` keeps) and :meth:`state`'s
    parts; new rows are appended to ``metrics.jsonl``."""
    self.history = list(rows)
    self.resumed_from = len(rows)
    self.accuracy, self.loss, self.diverged = host["accuracy"], host["loss"], host["diverged"]
    self.earlier_provenance = list(host.get("provenance", []))  # none in older checkpoints
    if self.norms is not None:
      self.norms = np.split(arrays["norms"], np.cumsum(arrays["norm_counts"])[:-1])
    if self.out_dir is not None:
      self.file = outputs.MetricsFile(self.out_dir, append=True)

  def close(self):
    if self.file is not None:
      self.file.close()
    if self.writer is not None:
      self.writer.close()

  def _write_norms(self) -> None:
    rounds = np.array([rec["round"] for rec in self.history], np.int32)
    offsets = np.concatenate([[0], np.cumsum([len(n) for n in self.norms])]).astype(np.int64)
    clip = np.float64(np.nan if self.clip is None else self.clip)

    def write(tmp):
      with open(tmp, "wb") as f:
        np.savez(f, round=rounds, offsets=offsets, norms=np.concatenate(self.norms), clip=clip)
    outputs.write_atomic(self.out_dir / outputs.NORMS, write)

  def finish(self, program, state, rounds: int, timing: dict) -> RunResult:
    from fedjax_dp.round import traced_conv_layers
    e = self.e
    summary = {
        "final_accuracy": self.accuracy,
        "final_test_loss": self.loss,
        "diverged": self.diverged,
        "rounds": rounds,
    }
    if e.accounting is not None:
      summary.update(e.accounting.report())
    noise = noise_multiplier(e.accounting)
    if noise is not None:
      summary["noise_multiplier"] = noise
    summary["config"] = e.config
    summary["params_sha256"] = params_sha256(state.params)
    summary.update(provenance(program.model, state, e.data))
    summary["data"]["partition"] = run_provenance.partition(e.config)
    summary["data"]["data_dir"] = run_provenance.data_dir(e.config)
    from_clients = getattr(e.data, "test_from_clients", False)
    # The natural partition's test set is the clients' own held-out data: its size is raw too.
    test_examples = summary["data"].pop("test_examples") if from_clients else None
    # How the rounds ran: clients per vmapped block (None: the whole cohort at once), and the
    # implementation of each convolution layer as the compiled round traced it.
    # Blocks as wide as a device's share of the padded cohort are the whole cohort at once
    # (round.run_clients).
    block = self.client_block if (self.client_block or 0) < self.slots else None
    summary["provenance"] = dict(self.environment(), client_block=block,
                                 conv_layers=traced_conv_layers(program))
    if self.resumed_from is not None:  # which library, packages and source ran the rounds before
      summary["provenance"]["resumed"] = {"from_round": self.resumed_from,
                                          "earlier_processes": self.earlier_provenance}
    covered = ({"summary": list(SUMMARY_COVERED),
                "metrics_rows": list(ROW_COVERED) + list(self.released_metrics)}
               if _any_guarantee(summary) else
               {"summary": [], "metrics_rows": [],
                "note": "no formal guarantee holds for any client of this run: nothing is covered"})
    if from_clients and covered["summary"]:
      covered = {k: [f for f in v if f not in FROM_TEST_SET] for k, v in covered.items()}
      covered["note"] = (", ".join(FROM_TEST_SET) + ": computed on the clients' own held-out "
                         "examples (the natural partition's test set), so raw statistics of "
                         "their private data: not covered")
    summary["release"] = {
        "mode": self.release,
        "covered_by_guarantee": covered,
        "public_by_design": list(PUBLIC_BY_DESIGN),
        "randomness": RANDOMNESS[self.release],
        "diagnostics": ("raw, unnoised statistics (realized cohort sizes, client losses, pre-clip "
                        "norms, timings, the sampler's capacity): not covered by the guarantee"
                        + (", and left out of this run's outputs" if self.release == "private" else
                           ", grouped under 'diagnostics'")
                        + ("; norms.npz holds every sampled client's pre-clip update norm of "
                           "every round, raw" if self.norms is not None else "")),
    }
    if self.checkpointed:
      summary["release"]["checkpoints"] = (
          "checkpoints/ holds the whole run at its last saves, to resume it: every client's raw "
          "state rows (e.g. DP-RSA's workers' models), the server's state, the sampler's state "
          "and the accounting's events: raw, not covered, and with config.seed they give every "
          "draw of the rounds after a save; keep it private or remove it before sharing the "
          "folder")
    if self.release == "all":
      counts = np.asarray(e.data.counts)
      summary["diagnostics"] = {
          # Raw statistics of the clients' data (unnoised; public only under example-level DP).
          "data": {"train_examples": int(counts.sum()),
                   "examples_per_client": {"min": int(counts.min()),
                                           "median": float(np.median(counts)),
                                           "max": int(counts.max())},
                   **({"test_examples": test_examples} if from_clients else {})},
          **timing,
          "cohort_capacity": int(e.sampler.capacity),
          "capacity_grew": int(getattr(e.sampler, "capacity_grew", 0)),
      }
    if self.norms is not None:
      self._write_norms()
    if self.out_dir is not None:
      outputs.write_text_atomic(self.out_dir / "summary.json",
                                dumps(summary, indent=2, default=str) + "\n")
    return RunResult(self.history, summary, state)


def _check_tensorboard(experiments) -> None:
  """An experiment that writes TensorBoard files needs an output folder, and tensorboardX."""
  import importlib.util
  for e in experiments:
    if e.tensorboard:
      check(e.output_dir is not None, "tensorboard", True,
            "needs an output_dir: the event files go to OUTPUT_DIR/tensorboard/")
      check(importlib.util.find_spec("tensorboardX") is not None, "tensorboard", True,
            "needs the tensorboardX package: pip install 'fedjax_dp[tensorboard]'")


# Device copies of data sets' arrays, by the host arrays they copy: weak references both ways, so
# an entry lives only while a program still holds the copy (placed_arrays).
_PLACED: dict = {}
_PLACED_LOCK = threading.Lock()


def placed_arrays(host: tuple, place: Optional[Callable[[], tuple]] = None) -> tuple:
  """The device arrays ``place()`` makes from the arrays ``host`` (default: ``host`` as they are,
  on the default device), shared with any program that still holds them: a sweep's programs
  running at once in threads (:func:`fedjax_dp.sweep.run_configs`) read one device copy of their
  data sets instead of one each, and the copy goes when the last program holding it ends
  (programs one after another place it again, as a run alone does)."""
  key = tuple(id(a) for a in host)
  with _PLACED_LOCK:
    for k in [k for k, (src, dev) in _PLACED.items()
              if any(r() is None for r in src + dev)]:
      del _PLACED[k]  # its host arrays or its last program are gone
    # A kept entry's host arrays are alive, so the ids in ``key`` are theirs: ``host`` itself.
    arrays = tuple(r() for r in _PLACED[key][1]) if key in _PLACED else ()
    if arrays and all(a is not None for a in arrays):  # its last program may just have ended
      return arrays
    arrays = place() if place is not None else tuple(jnp.asarray(a) for a in host)
    _PLACED[key] = (tuple(weakref.ref(a) for a in host), tuple(weakref.ref(a) for a in arrays))
    return arrays


def secret_entropy(count: int) -> list:
  """``count`` secret 128-bit integers (:mod:`secrets`) for a private release, the same on
  every process of a multi-process run: process 0 draws them and broadcasts them, so every
  process samples the same cohorts and adds the same noise, and the ledger describes that one
  draw (each process drawing its own would mix several runs in one)."""
  words = np.array([[secrets.randbits(32) for _ in range(4)] for _ in range(count)], np.uint32)
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    words = np.asarray(multihost_utils.broadcast_one_to_all(words))
  return [sum(int(w) << (32 * i) for i, w in enumerate(row)) for row in words.reshape(count, 4)]


def run_group(program, experiments, rounds: int, *, eval_every: int = 1, progress: bool = True,
              placement: str = "device", release: str = "all",
              client_chunk: Optional[int] = None, devices: Optional[int] = None,
              checkpoint=None, accounting_workers: Optional[int] = None,
              stop=None) -> list:
  """Runs experiments that share one :class:`fedjax_dp.round.Round` as one compiled program.

  One experiment runs the round's jitted step; several run it ``vmap``-ed over
  a leading experiment axis of ``(state, hparams, cohort, key)`` (and of the
  data sets when they differ, :func:`group_mode`), so the whole group compiles
  once and each round is one call. Each experiment keeps its own sampler,
  accounting, keys and records, so its results equal its run alone (up to
  floating-point reassociation): a cohort is padded with inert slots to the
  group's largest capacity, and padded clients change nothing. Arguments as
  :func:`run`; returns one :class:`RunResult` per experiment. A round's
  ``seconds`` is the whole group's. ``client_chunk``: clients per block on each device
  (:func:`fedjax_dp.round.run_clients`). ``devices``: the cohort's clients are
  split over this many devices (default: every device JAX sees;
  :func:`fedjax_dp.round.compiled_step`); cohorts are padded with inert slots
  to a multiple of the device count. ``checkpoint``: one experiment only (a
  group is not checkpointed). ``accounting_workers``: as :func:`run` (one set of workers for
  the group; experiments that report the same epsilon share it). ``stop``: a
  :class:`threading.Event` that, once set, ends the run with :class:`Stopped` before its next
  round (a sweep's other programs running at once failed or were interrupted).
  """
  check(rounds >= 1, "rounds", rounds, "must be >= 1")
  check(eval_every >= 1, "eval_every", eval_every, "must be >= 1")
  check(accounting_workers is None or accounting_workers >= 0, "accounting_workers",
        accounting_workers, "must be an integer >= 0 or unset")
  check_choice("placement", placement, PLACEMENTS)
  check_choice("release", release, RELEASES)
  check(len(experiments) >= 1, "experiments", len(experiments), "need at least one")
  _check_tensorboard(experiments)
  check(checkpoint is None or len(experiments) == 1, "checkpoint_every",
        getattr(checkpoint, "every", None), "checkpoints one run only, not a group of "
        "experiments (a sweep): run each experiment alone")
  check_checkpoint_release(release, None if checkpoint is None else checkpoint.every)
  check(release == "all" or not any(getattr(e.data, "test_from_clients", False)
                                     for e in experiments), "release", release,
        "'private' writes only what the guarantee covers, and this data set's test set holds "
        "its clients' own held-out examples (a natural partition), so its test accuracy is not "
        "covered: use release='all' (the release block says what is raw) or a pooled partition")
  from fedjax_dp.round import CohortBatch, DataSets, client_mesh, compiled_step
  single = len(experiments) == 1
  mode = group_mode(experiments)
  stack = (lambda trees: trees[0]) if single else (
      lambda trees: jax.tree_util.tree_map(lambda *xs: np.stack(xs), *trees))
  hps = [{k: jnp.asarray(v) for k, v in e.hparams.items()} for e in experiments]
  hp = stack(hps)
  # A private release draws its rounds' keys and its cohorts from secret entropy (RANDOMNESS).
  secrets_ = secret_entropy(len(experiments)) if release == "private" else [None] * len(experiments)
  for e, secret in zip(experiments, secrets_):
    if secret is not None:
      e.sampler.reseed(secret)
  keys = [run_keys(e.seed, secret) for e, secret in zip(experiments, secrets_)]
  states = [program.init(k_init, h) for (k_init, _), h in zip(keys, hps)]
  state = jax.tree_util.tree_map(jnp.asarray, stack(states))
  del states
  datas = [e.data for e in experiments] if mode == "stacked" else [experiments[0].data]
  if mode == "stacked":
    evaluate = make_evaluator(program.model, [d.test_x for d in datas], [d.test_y for d in datas],
                              experiments=mode)
  else:
    evaluate = make_evaluator(program.model, datas[0].test_x, datas[0].test_y, experiments=mode)
  check(client_chunk is None or client_chunk >= 1, "client_chunk", client_chunk, "must be >= 1")
  step = compiled_step(program, placement, mode, client_chunk, devices,
                       in_sequence=mode is not None and not experiments_vmapped())
  mesh = client_mesh(devices)
  n_devices = mesh.size
  # Host placement gathers the next cohort while a round runs; a checkpoint must see the
  # sampler as it stands after the round it saves, so checkpointed runs do not prefetch.
  prefetch = placement == "host" and checkpoint is None
  # The state and hyper-parameters start where every round leaves them (replicated over the
  # mesh), so round 2 reuses round 1's compilation; so do the experiments' run keys.
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  state, hp, run_key = jax.tree_util.tree_map(  # every process holds the same (NaN included)
      lambda a: jax.make_array_from_callback(np.shape(a), replicated,
                                             lambda index, a=np.asarray(a): a[index]),
      (state, hp, stack([k_run for _, k_run in keys])))
  round_keys = _round_keys(single, replicated)

  if placement == "device":
    from fedjax_dp.data import FederatedData
    for d in datas:
      check(type(d).rows is FederatedData.rows, "placement", placement,
            f"'device' needs the clients' arrays, but data set {d.name!r} generates its rows on "
            "demand: use placement='host'")
    fields = ("x", "y", "counts")
    if mode == "stacked":  # each distinct data set once, and which one each experiment reads
      distinct = list({id(d): d for d in datas}.values())
      which = {id(d): i for i, d in enumerate(distinct)}
      arrays = DataSets(
          placed_arrays(tuple(getattr(d, f) for d in distinct for f in fields),
                        lambda: tuple(jnp.asarray(np.stack([getattr(d, f) for d in distinct]))
                                      for f in fields)),
          jnp.asarray([which[id(d)] for d in datas], jnp.int32))
      del distinct
    else:
      arrays = placed_arrays(tuple(getattr(datas[0], f) for f in fields))
    del datas

    def inputs(cohorts):
      return stack([c.ids for c in cohorts]), stack([c.mask for c in cohorts])

    def call(state, inputs, key):
      return step(state, hp, arrays, *inputs, key)
  else:
    def inputs(cohorts):  # gathered on the host, sent on its way to the devices
      batches = [CohortBatch(*e.data.rows(c.ids), c.ids, c.mask)
                 for e, c in zip(experiments, cohorts)]
      return jax.device_put(stack(batches))

    def call(state, inputs, key):
      return step(state, hp, inputs, key)

  def prepare():
    """The next round's cohorts and the step's inputs for them."""
    cohorts = [e.sampler.sample() for e in experiments]
    capacity = -(-max(len(c.ids) for c in cohorts) // n_devices) * n_devices
    for log in logs:
      log.slots = max(log.slots, capacity // n_devices)
    return cohorts, inputs([_pad_cohort(c, capacity, n_devices) for c in cohorts])

  logs = [_Log(program, e, release, client_chunk, checkpoint is not None, n_devices)
          for e in experiments]
  start = 0
  if checkpoint is not None:
    try:
      state, start = checkpoint.begin(state, experiments[0], logs[0])
    except BaseException:
      checkpoint.close()
      raise
  bar = None
  if progress:
    from tqdm.auto import tqdm
    bar = tqdm(total=rounds, initial=start, unit="round", dynamic_ncols=True)
  t_start = time.perf_counter()
  first_round_s = None
  ahead = None
  try:
    ahead = _epsilons_ahead(experiments, rounds - start, accounting_workers)
    pending = None
    for r in range(start, rounds):
      if stop is not None and stop.is_set():
        raise Stopped(f"stopped before round {r + 1} of {rounds}")
      t0 = time.perf_counter()
      cohorts, ready = pending if pending is not None else prepare()
      state, metrics = call(state, ready, round_keys(run_key, r))
      # The step runs asynchronously: its privacy cost is accounted, and the next cohort drawn,
      # gathered and sent, meanwhile.
      accounted = [log.account(c, ahead) for log, c in zip(logs, cohorts)]
      pending = prepare() if prefetch and r + 1 < rounds else None
      metrics = jax.device_get(metrics)
      seconds = time.perf_counter() - t0
      evaluation = None
      if (r + 1) % eval_every == 0 or r + 1 == rounds:
        acc, tl = jax.device_get(evaluate(program.eval_params(state)))
        evaluation = (np.atleast_1d(acc), np.atleast_1d(tl))
      if first_round_s is None:
        first_round_s = seconds
      for i, log in enumerate(logs):
        m = metrics if single else jax.tree_util.tree_map(lambda a: a[i], metrics)
        ev = None if evaluation is None else (float(evaluation[0][i]), float(evaluation[1][i]))
        log.round(r, m, accounted[i], ev, seconds)
      if checkpoint is not None:
        checkpoint.after_round(r + 1, rounds, state, experiments[0], logs[0])
      if bar is not None:
        log = logs[0]
        post = {"acc": f"{log.accuracy:.4f}" if log.accuracy is not None else "-"}
        diag = log.history[-1].get("diagnostics", {})
        if diag.get("train_loss") is not None:  # the clients' raw loss, a diagnostic
          post["raw loss"] = f"{diag['train_loss']:.3f}"
        if log.history[-1].get("epsilon") is not None:
          post["eps"] = f"{log.history[-1]['epsilon']:.2f}"
        if not single:
          post["experiments"] = len(experiments)
        bar.set_postfix(post, refresh=False)
        bar.update(1)
  finally:
    if bar is not None:
      bar.close()
    for log in logs:
      log.close()
    if checkpoint is not None:
      checkpoint.close()
    if ahead is not None:
      ahead.close()
  total = time.perf_counter() - t_start
  timing = {"seconds_total": total, "seconds_first_round": first_round_s,
            "seconds_per_round_after_first": None if first_round_s is None else
            (total - first_round_s) / max(rounds - start - 1, 1)}
  if start:
    timing["resumed_from_round"] = start
  if not single:
    timing["experiments_in_group"] = len(experiments)
  if ahead is not None and ahead.started:
    timing["accounting_workers"] = ahead.started
    timing["epsilons_from_accounting_workers"] = ahead.computed
  return [log.finish(program, state if single else jax.tree_util.tree_map(lambda a: a[i], state),
                     rounds, timing)
          for i, log in enumerate(logs)]
