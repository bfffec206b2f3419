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

Files in ``output_dir``: ``metrics.jsonl`` (one record per round), ``metrics.csv`` (its rows as
a table, :class:`fedjax_dp.observers.MetricsTable`), ``summary.json``, with ``release="all"``
``norms.npz`` (every real client's pre-clip update norm per round,
:class:`fedjax_dp.observers.NormsFile`), and with ``tensorboard`` TensorBoard event files in
``tensorboard/`` (the records' numbers as scalars tagged by their ``metrics.jsonl`` names, the
diagnostics under ``diagnostics/`` with a histogram of the update norms; with
``release="private"`` only the released values). With ``wandb`` the same numbers and the
configuration go to a Weights & Biases run (:class:`fedjax_dp.observers.WandB`), wherever W&B
writes.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
import numbers
import pathlib
import secrets
import threading
import time
import weakref
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from fedjax_dp import compilation
from fedjax_dp import provenance as run_provenance
# The module, not its names: tests replace round.compiled_step to watch the programs.
from fedjax_dp import round as round_lib
from fedjax_dp.checkpoint import Checkpointer, params_sha256
from fedjax_dp.data import FederatedData
from fedjax_dp.errors import check, check_choice
from fedjax_dp.models import METRIC_LABELS, METRICS, evaluation_sums, num_params, ratios
from fedjax_dp.observers import (Checkpoint, History, MetricsFile, MetricsTable, NormsFile,
                                 Observer, Observers, ProgressBar, ProgressLines, Record,
                                 ReleasePolicy, Start, SummaryFile, TensorBoard, WandB, flat,
                                 is_released)
from fedjax_dp.privacy.ahead import Ahead, workers_for
from fedjax_dp.sampling import Cohort

PLACEMENTS = ("device", "host")
RELEASES = ("all", "private")
# A Weights & Biases project name (RunOptions.wandb): at most this many characters, none of these.
WANDB_PROJECT_CHARS = 128
WANDB_FORBIDDEN = "/\\#?%:"
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
    rows = [flat(r) for r in self.history]
    names = sorted({k for r in rows for k in r})
    return {k: np.array([np.nan if r.get(k) is None else float(r[k]) for r in rows])
            for k in names}

  def to_dataframe(self):
    """The per-round metrics as a table: the way to them from a notebook.

    Returns:
      A pandas ``DataFrame`` of :attr:`metrics`: a row per round, indexed by ``round`` (an
      integer), a float64 column per name, NaN where a round has no value.

    Raises:
      ImportError: pandas is not installed.
    """
    try:  # lazy: pandas is optional
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
  multi_label = getattr(model, "multi_label", False)

  def evaluate(params, xs, ys, ms):
    """``{"loss": (sum, count), metric: (sum, count), ...}`` of ``params`` over the test set's
    chunks, for the metrics of :data:`fedjax_dp.models.METRICS` of the model's labels
    (:func:`fedjax_dp.models.ratios` divides them).

    Args:
      params: the model's parameters (with a leading experiment axis when vmapped).
      xs: the test inputs, ``[chunks, batch, *example_shape]``.
      ys: their labels, ``[chunks, batch, *label_shape]``.
      ms: 1 for a real example, 0 for padding, ``[chunks, batch]``.
    """
    def chunk(args):
      x, y, m = args
      return evaluation_sums(model.apply(params, x), y, m, multi_label)
    return jax.tree_util.tree_map(jnp.sum, jax.lax.map(chunk, (xs, ys, ms)))

  if experiments is not None:
    evaluate = jax.vmap(evaluate, in_axes=(0, None, None, None) if experiments == "shared" else 0)
  return jax.jit(evaluate)


def metric_names(model) -> tuple:
  """The metrics a test-set evaluation of ``model`` reports, headline first
  (:data:`fedjax_dp.models.METRICS`: ``("accuracy",)``, or for a multi-label model
  ``("recall_at_5", "precision")``)."""
  return METRICS[bool(getattr(model, "multi_label", False))]


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
                   experiments: Optional[str] = None, all_metrics: bool = False):
  """``params -> (metric, loss)`` over the whole test set, in fixed-size chunks (jitted once).

  ``metric`` is the headline of :func:`metric_names`: the accuracy, or for a multi-label model
  (:attr:`fedjax_dp.models.Model.multi_label`) the recall at 5.

  Args:
    model: the model (its ``apply``, and ``multi_label`` where it has one).
    test_x: the test inputs ``[n, *example_shape]`` (a sequence of them with "stacked").
    test_y: their labels ``[n, *label_shape]`` (likewise).
    batch_size: examples per chunk (the test set is padded to a whole number of chunks, the
      padding masked out).
    experiments: None for one model's parameters; "shared" or "stacked"
      (:func:`_evaluate_fn`): parameters with a leading experiment axis, on one test set or on
      each experiment's own.
    all_metrics: return every metric by name instead.

  Returns:
    The evaluation, ``params -> (metric, loss)`` (per experiment with ``experiments``); with
    ``all_metrics``, ``params -> {"loss": ..., name: ...}`` for each of :func:`metric_names`:
    float64 numpy values, each a ratio of sums computed on the device and divided on the host
    (:func:`fedjax_dp.models.ratios`), so that a run alone and in a vmapped group agree.
  """
  if experiments == "stacked":
    arrays = [np.stack(a) for a in zip(*[_test_chunks(x, y, batch_size)
                                         for x, y in zip(test_x, test_y)])]
  else:
    arrays = _test_chunks(test_x, test_y, batch_size)
  xs, ys, ms = (jnp.asarray(a) for a in arrays)
  fn = _evaluate_fn(model, experiments)

  def metrics(params):
    """``{"loss": ..., name: ...}`` of ``params`` on the test set, divided on the host."""
    return ratios(fn(params, xs, ys, ms))

  if all_metrics:
    return metrics
  headline = metric_names(model)[0]

  def evaluate(params):
    """``(metric, loss)`` of ``params`` on the test set."""
    out = metrics(params)
    return out[headline], out["loss"]

  return evaluate


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

  Args:
    metrics: the round's metrics on the host (``mask``, ``client_loss``, ``update_norm`` per
      client slot, and scalars).
    clip: the clip bound, for ``fraction_clipped`` (None: none).
    released_metrics: the names of the metrics computed from the noisy release only
      (:func:`fedjax_dp.observers.is_released`).

  Returns:
    ``(released, diagnostics)``: ``released`` holds the scalar metrics named in
    ``released_metrics``; ``diagnostics`` the realized cohort size, the real clients' mean
    loss, the quantiles of their pre-clip update norms (``ClientOut.norm``: the raw local
    update, before any transform), the fraction of those above the clip bound
    (``fraction_clipped``; where a transform precedes the clip, LUS's sparsification, the clip
    sees a smaller norm, so this is an upper bound on the fraction it scales down) and every
    other scalar metric (raw, not covered by any guarantee).
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

  Args:
    model: the run's model (its ``name``, ``input_shape``, ``num_classes``).
    state: its final :class:`fedjax_dp.round.RoundState` (its parameters are counted).
    data: its :class:`fedjax_dp.data.FederatedData`.

  Returns:
    ``{"model": {...}, "data": {...}}``.
  """
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



@dataclasses.dataclass(frozen=True)
class RunOptions:
  """How a run (or a group of experiments) runs and what it writes, apart from what it computes:
  checked once, when made.

  Attributes:
    eval_every: evaluate on the test set every this many rounds (and after the last).
    placement: "device" keeps every client's data on the accelerator and gathers the cohort
      inside the compiled round; "host" keeps the clients' data on the host and gathers each
      cohort's rows there (``data.rows(ids)``), the next round's while the current one runs
      (for populations that do not fit on the device: device memory O(cohort)).
    client_chunk: run the cohort in blocks of this many vmapped clients on each device
      (:func:`fedjax_dp.round.run_clients`); None: all at once.
    devices: split the cohort's clients over this many devices (default: every device JAX
      sees; :func:`fedjax_dp.round.compiled_step`); cohorts are padded with inert slots to a
      multiple of the device count.
    accounting_workers: worker processes computing a PLD run's per-round epsilons ahead of its
      rounds (:mod:`fedjax_dp.privacy.ahead`; the same values); None: automatic (none on a
      CPU). A group has one set of workers; experiments that report the same epsilon share it.
    release: "all" keeps the raw diagnostics under ``diagnostics`` in every record and in the
      summary; "private" leaves them out, so the outputs hold only what the guarantee covers
      and what is public by design (module docstring; :class:`fedjax_dp.observers.ReleasePolicy`),
      and draws the mechanism's randomness (the rounds' keys, the cohorts) from secret entropy
      instead of the seed (:data:`RANDOMNESS`); checkpoints are refused with it.
    progress: show a progress bar (a sweep's programs share one,
      :class:`fedjax_dp.observers.SweepProgress`).
    progress_every: without a bar, a progress line on stderr every this many seconds (> 0;
      :class:`fedjax_dp.observers.ProgressLines`); None: none.
    output_dir: the command's folder: a run's ``metrics.jsonl``, ``summary.json`` (and
      ``norms.npz``, module docstring) go there; a sweep's ``results.json`` and its
      experiments' folders. In a group each experiment writes to its own
      (:attr:`Experiment.output_dir`). None: nothing is written.
    overwrite: replace an earlier run's files in ``output_dir`` (removed when the new run
      writes its first round; :func:`fedjax_dp.outputs.check_output_dir`).
    tensorboard: also write TensorBoard event files to each ``output_dir/tensorboard/``
      (needs tensorboardX: ``pip install 'fedjax_dp[tensorboard]'``).
    wandb: also log each experiment's configuration and records to a Weights & Biases run in
      this project (:class:`fedjax_dp.observers.WandB`; needs wandb:
      ``pip install 'fedjax_dp[wandb]'``); None: no W&B.
    checkpoint_every: save the whole run every this many rounds (and after the last) into
      ``output_dir/checkpoints/`` (:mod:`fedjax_dp.checkpoint`; one experiment only).
    resume: continue the run in ``output_dir`` from its latest checkpoint (same configuration,
      or more rounds where :func:`fedjax_dp.checkpoint.check_extension` allows them;
      ``checkpoint_every`` then says how often to go on saving, default as the checkpoint's run).
    compilation_cache: keep the programs this run compiles in JAX's persistent compilation
      cache and read them from it when another run (in this or a later process) compiles the
      same program (:func:`fedjax_dp.compilation.enable`: in ``$FEDJAX_DP_JAX_CACHE``, default
      ``$XDG_CACHE_HOME/fedjax_dp/jax``; ``FEDJAX_DP_JAX_CACHE=off`` turns it off everywhere).
      False leaves JAX's cache settings as they are.

  Raises:
    ConfigError: on a value outside the ranges above, a private release with checkpoints,
      TensorBoard without tensorboardX, or W&B without wandb.
  """

  eval_every: int = 1
  placement: str = "device"
  client_chunk: Optional[int] = None
  devices: Optional[int] = None
  accounting_workers: Optional[int] = None
  release: str = "all"
  progress: bool = False
  progress_every: Optional[float] = None
  output_dir: Optional[str] = None
  overwrite: bool = False
  tensorboard: bool = False
  wandb: Optional[str] = None
  checkpoint_every: Optional[int] = None
  resume: bool = False
  compilation_cache: bool = True

  def __post_init__(self):
    check(_integer(self.eval_every) and self.eval_every >= 1, "eval_every", self.eval_every,
          "must be >= 1")
    check_choice("placement", self.placement, PLACEMENTS)
    check(self.client_chunk is None or _integer(self.client_chunk) and self.client_chunk >= 1,
          "client_chunk", self.client_chunk, "must be >= 1")
    check(self.accounting_workers is None or _integer(self.accounting_workers)
          and self.accounting_workers >= 0, "accounting_workers", self.accounting_workers,
          "must be an integer >= 0 or unset")
    check_choice("release", self.release, RELEASES)
    check(self.progress_every is None or isinstance(self.progress_every, (int, float))
          and not isinstance(self.progress_every, bool) and 0 < self.progress_every < math.inf,
          "progress_every", self.progress_every, "must be a finite number of seconds > 0 or unset")
    check(self.checkpoint_every is None or _integer(self.checkpoint_every)
          and self.checkpoint_every >= 1, "checkpoint_every", self.checkpoint_every,
          "must be an integer >= 1")
    check_checkpoint_release(self.release, self.checkpoint_every)
    if self.tensorboard:
      check(importlib.util.find_spec("tensorboardX") is not None, "tensorboard", True,
            "needs the tensorboardX package: pip install 'fedjax_dp[tensorboard]'")
    if self.wandb is not None:
      check(isinstance(self.wandb, str) and 0 < len(self.wandb) <= WANDB_PROJECT_CHARS
            and not set(self.wandb) & set(WANDB_FORBIDDEN), "wandb", self.wandb,
            f"must be a W&B project name: 1 to {WANDB_PROJECT_CHARS} characters, none of "
            f"{' '.join(WANDB_FORBIDDEN)}")
      check(importlib.util.find_spec("wandb") is not None, "wandb", self.wandb,
            "needs the wandb package: pip install 'fedjax_dp[wandb]'")

  @property
  def checkpointed(self) -> bool:
    """Whether the run saves (or resumes from) checkpoints."""
    return self.checkpoint_every is not None or self.resume


def _integer(value) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@dataclasses.dataclass
class Experiment:
  """One run of a group that shares a :class:`fedjax_dp.round.Round` (:func:`run_group`).

  Attributes:
    hparams: its hyper-parameters (name -> array).
    data: its :class:`fedjax_dp.data.FederatedData`.
    sampler: its host sampler (``sample() -> Cohort``).
    seed: its PRNG seed (:func:`fedjax_dp.round.run_keys`).
    accounting: its privacy accounting (``on_round``, ``report``), or None.
    output_dir: where its ``metrics.jsonl`` and ``summary.json`` go (none: not written).
    config: its configuration, copied into the summary.
    settings: its whole configuration (JSON-able), stored in its checkpoints, which a resumed
      run's must equal (default: ``config``).
    observers: its own :class:`fedjax_dp.observers.Observer` s, called after the run's outputs
      with each round's record as the release policy shows it.
  """

  hparams: dict
  data: Any
  sampler: Any
  seed: int = 0
  accounting: Any = None
  output_dir: Optional[str] = None
  config: Optional[dict] = None
  settings: Optional[dict] = None
  observers: Sequence[Observer] = ()


def run(program, experiment: Experiment, rounds: int,
        options: Optional[RunOptions] = None) -> RunResult:
  """Runs ``rounds`` federated rounds of one experiment and returns its history and summary.

  Args:
    program: the algorithm's :class:`fedjax_dp.round.Round`.
    experiment: its hyper-parameters, data, sampler, seed (same seed, same result), accounting,
      output folder and observers (:class:`Experiment`).
    rounds: number of rounds T.
    options: how it runs and what it writes (:class:`RunOptions`; default: ``RunOptions()``).
      ``options.output_dir`` is the experiment's folder unless it names its own.

  Returns:
    Its :class:`RunResult`.

  Raises:
    ConfigError: on bad input, before anything compiles.
  """
  options = options or RunOptions()
  if experiment.output_dir is None and options.output_dir is not None:
    experiment = dataclasses.replace(experiment, output_dir=options.output_dir)
  return run_group(program, [experiment], rounds, options)[0]


def _epsilons_ahead(experiments, rounds: int, requested: Optional[int]):
  """Worker processes (:class:`fedjax_dp.privacy.ahead.Ahead`, None without workers:
  :func:`fedjax_dp.privacy.ahead.workers_for`) given, in round order, the PLD epsilons that
  the experiments' next ``rounds`` reports will give when they are known before the rounds
  (a ledger whose event does not depend on the draw, ``upcoming``); the reports that depend
  on the cohorts (``pending``) are given to them as each round is accounted
  (:meth:`Records.account`)."""
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
  experiments' models leave the CPU's cache and every client block runs while any experiment
  has a real client in it, so a vmapped grid runs slower than its runs one after another (the
  sweep benchmarks measure it)."""
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
  real = np.flatnonzero(cohort.mask > 0)
  slots = _dealt_slots(capacity, shards)[:len(real)]
  ids, mask = np.zeros(capacity, cohort.ids.dtype), np.zeros(capacity, cohort.mask.dtype)
  ids[slots], mask[slots] = cohort.ids[real], cohort.mask[real]
  return Cohort(ids, mask)


class Records:
  """One experiment's records: each round's :class:`fedjax_dp.observers.Record`, its last
  evaluation, and its summary.

  Args:
    program: the group's :class:`fedjax_dp.round.Round` (its ``released_metrics``, its clip).
    experiment: the :class:`Experiment`.
    options: the run's :class:`RunOptions` (its release, client block, checkpoints).
    shards: the devices the cohort's slots are dealt out over (:func:`_pad_cohort`).
  """

  def __init__(self, program, experiment: Experiment, options: RunOptions, shards: int = 1):
    self.e = experiment
    self.options = options
    self.shards = shards
    self.slots = 0  # the most client slots a round has run on each device
    self.released_metrics = tuple(getattr(program, "released_metrics", ()))
    self.clip = clip_bound(program, experiment.hparams)
    self.accuracy = self.loss = None
    # A multi-label model's metrics by name (recall_at_5, precision): rows hold them as
    # test_<name>, the summary as final_<name>, beside the headline fields; none for accuracy.
    names = metric_names(program.model)
    self.headline = names[0]
    self.extra_names = names if len(names) > 1 else ()
    self.extra = dict.fromkeys(self.extra_names)
    self.diverged = False
    self.resumed_from = None  # the checkpoint's round, once resumed (:meth:`resume`)
    # The provenance blocks of the processes that ran the rounds before a resume, in order.
    self.earlier_provenance = []
    self._environment = None

  @property
  def writes_norms(self) -> bool:
    """Whether the run writes ``norms.npz`` (with an output folder, under release "all")."""
    return self.e.output_dir is not None and self.options.release == "all"

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

  def round(self, r: int, rounds: int, metrics: dict, accounted: dict, evaluation,
            seconds: float) -> Record:
    """Round ``r``'s whole record; the release policy hides what an observer may not see.

    Args:
      r: the round, 0-based.
      rounds: the run's rounds.
      metrics: the experiment's metrics of the round, on the host.
      accounted: the accounting's fields (:meth:`account`).
      evaluation: ``{"loss": l, name: m, ...}`` on the test set (:func:`metric_names`), or None
        where the round evaluated none.
      seconds: the round's wall time (a raw diagnostic).

    Returns:
      The :class:`fedjax_dp.observers.Record`: the released values, ``accounted``, the
      evaluation, and under ``diagnostics`` the raw statistics (:func:`summarize_round`) with
      ``seconds``.
    """
    released, diag = summarize_round(metrics, self.clip, self.released_metrics)
    rec = {"round": r + 1, **released, **accounted}
    if evaluation is not None:
      self.accuracy, self.loss = evaluation[self.headline], evaluation["loss"]
      rec["test_accuracy"], rec["test_loss"] = self.accuracy, self.loss
      for name in self.extra_names:
        self.extra[name] = rec[f"test_{name}"] = evaluation[name]
      if not math.isfinite(self.loss):
        rec["diverged"] = self.diverged = True
    rec["diagnostics"] = dict(diag, seconds=seconds)
    return Record(r + 1, rounds, rec, client_norms(metrics, self.shards))

  def environment(self) -> dict:
    """This process's provenance block (:func:`fedjax_dp.provenance.environment`), read once."""
    if self._environment is None:
      self._environment = run_provenance.environment()
    return self._environment

  def state(self) -> dict:
    """What a checkpoint keeps of these records besides ``metrics.jsonl``'s rows and the norms:
    the last evaluation and whether the run diverged, the provenance of every process that ran
    its rounds so far (JSON)."""
    processes = list(self.earlier_provenance)
    if not processes or processes[-1] != self.environment():
      processes.append(self.environment())
    state = {"accuracy": self.accuracy, "loss": self.loss, "diverged": self.diverged,
             "provenance": processes}
    if self.extra_names:
      state["metrics"] = dict(self.extra)
    return state

  def resume(self, start: Start) -> None:
    """Continues from a checkpoint (``start.log``: :meth:`state` as saved)."""
    if start.log is None:
      return
    self.resumed_from = start.done
    log = start.log
    self.accuracy, self.loss, self.diverged = log["accuracy"], log["loss"], log["diverged"]
    self.extra.update({k: v for k, v in log.get("metrics", {}).items() if k in self.extra})
    self.earlier_provenance = list(log.get("provenance", []))  # none in older checkpoints

  def summary(self, program, state, rounds: int, timing: dict) -> dict:
    """The run's ``summary.json``.

    Args:
      program: the group's :class:`fedjax_dp.round.Round` (its model).
      state: the experiment's final :class:`fedjax_dp.round.RoundState`.
      rounds: the run's rounds.
      timing: the run's timings (:meth:`_Timer.timing`).

    Returns:
      The final evaluation, the privacy report, the configuration, the model's hash, what the
      run used (:func:`provenance`), the release block and, under release "all", the raw
      diagnostics (``timing`` among them).
    """
    e = self.e
    summary = {"final_accuracy": self.accuracy, "final_test_loss": self.loss,
               "diverged": self.diverged, "rounds": rounds}
    if self.extra_names:
      summary.update({f"final_{name}": v for name, v in self.extra.items()},
                     accuracy_metric=self.headline)
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
    summary["provenance"] = self._provenance(program)
    summary["release"] = self._release(_any_guarantee(summary), from_clients)
    if self.options.release == "all":
      summary["diagnostics"] = self._diagnostics(timing, test_examples)
    return summary

  def _provenance(self, program) -> dict:
    """The ``provenance`` block: this process's environment, how the rounds ran (clients per
    vmapped block, None for the whole cohort at once, and the implementation of each
    convolution layer as the compiled round traced it) and, for a resumed run, which library,
    packages and source ran the rounds before."""
    # Blocks as wide as a device's share of the padded cohort are the whole cohort at once
    # (round.run_clients).
    chunk = self.options.client_chunk
    block = chunk if (chunk or 0) < self.slots else None
    out = dict(self.environment(), client_block=block,
               conv_layers=round_lib.traced_conv_layers(program))
    if self.resumed_from is not None:
      out["resumed"] = {"from_round": self.resumed_from,
                        "earlier_processes": self.earlier_provenance}
    return out

  def _release(self, guarantee: bool, from_clients: bool) -> dict:
    """The ``release`` block: what the guarantee covers (nothing without one for any client;
    not the test-set figures where the test set is the clients' own held-out data), what is
    public by design, what the seed is, and what is raw."""
    release = self.options.release
    rows = [f"test_{name}" for name in self.extra_names]
    finals = [f"final_{name}" for name in self.extra_names]
    covered = ({"summary": list(SUMMARY_COVERED) + finals,
                "metrics_rows": list(ROW_COVERED) + rows + list(self.released_metrics)}
               if guarantee else
               {"summary": [], "metrics_rows": [],
                "note": "no formal guarantee holds for any client of this run: nothing is covered"})
    if from_clients and covered["summary"]:
      from_test_set = FROM_TEST_SET + tuple(rows + finals)
      covered = {k: [f for f in v if f not in from_test_set] for k, v in covered.items()}
      covered["note"] = (", ".join(from_test_set) + ": computed on the clients' own held-out "
                         "examples (the natural partition's test set), so raw statistics of "
                         "their private data: not covered")
    block = {
        "mode": release,
        "covered_by_guarantee": covered,
        "public_by_design": list(PUBLIC_BY_DESIGN),
        "randomness": RANDOMNESS[release],
        "diagnostics": ("raw, unnoised statistics (realized cohort sizes, client losses, pre-clip "
                        "norms, timings, the sampler's capacity): not covered by the guarantee"
                        + (", and left out of this run's outputs" if release == "private" else
                           ", grouped under 'diagnostics'")
                        + ("; norms.npz holds every sampled client's pre-clip update norm of "
                           "every round, raw" if self.writes_norms else "")),
    }
    if self.options.checkpointed:
      block["checkpoints"] = (
          "checkpoints/ holds the whole run at its last saves, to resume it: every client's raw "
          "state rows (e.g. DP-RSA's workers' models), the server's state, the sampler's state "
          "and the accounting's events: raw, not covered, and with config.seed they give every "
          "draw of the rounds after a save; keep it private or remove it before sharing the "
          "folder")
    return block

  def _diagnostics(self, timing: dict, test_examples: Optional[int]) -> dict:
    """The summary's raw diagnostics: the clients' data's sizes (unnoised; public only under
    example-level DP), the ``timing``, and the sampler's capacity."""
    counts = np.asarray(self.e.data.counts)
    sampler = self.e.sampler
    return {
        "data": {"train_examples": int(counts.sum()),
                 "examples_per_client": {"min": int(counts.min()),
                                         "median": float(np.median(counts)),
                                         "max": int(counts.max())},
                 **({"test_examples": test_examples} if test_examples is not None else {})},
        **timing,
        "cohort_capacity": int(sampler.capacity),
        "capacity_grew": int(getattr(sampler, "capacity_grew", 0)),
    }


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
    words = np.asarray(multihost_utils.broadcast_one_to_all(words))
  return [sum(int(w) << (32 * i) for i, w in enumerate(row)) for row in words.reshape(count, 4)]


def _check_group(experiments, rounds: int, options: RunOptions) -> None:
  """Refuses what a group cannot run, before anything compiles."""
  check(rounds >= 1, "rounds", rounds, "must be >= 1")
  check(len(experiments) >= 1, "experiments", len(experiments), "need at least one")
  if options.tensorboard:
    for e in experiments:
      check(e.output_dir is not None, "tensorboard", True,
            "needs an output_dir: the event files go to OUTPUT_DIR/tensorboard/")
  check(not options.checkpointed or len(experiments) == 1, "checkpoint_every",
        options.checkpoint_every, "checkpoints one run only, not a group of experiments (a "
        "sweep): run each experiment alone")
  check(options.release == "all" or not any(getattr(e.data, "test_from_clients", False)
                                             for e in experiments), "release", options.release,
        "'private' writes only what the guarantee covers, and this data set's test set holds "
        "its clients' own held-out examples (a natural partition), so its test accuracy is not "
        "covered: use release='all' (the release block says what is raw) or a pooled partition")
  if options.placement == "device":
    for e in experiments:
      check(type(e.data).rows is FederatedData.rows, "placement", options.placement,
            f"'device' needs the clients' arrays, but data set {e.data.name!r} generates its "
            "rows on demand: use placement='host'")


class _Program:
  """A group's compiled program, prepared: its initial state and keys on the device mesh, its
  step, its evaluator, and how each round's cohorts become the step's inputs.

  The state, hyper-parameters and run keys start where every round leaves them (replicated
  over the mesh), so round 2 reuses round 1's compilation. ``placement="device"`` gathers the
  cohort inside the step from the data sets placed once (:func:`placed_arrays`); "host"
  gathers the cohort's rows on the host and sends them (the next round's while a round runs,
  unless the run is checkpointed: a checkpoint must see the sampler as it stands after the
  round it saves).
  """

  def __init__(self, program, experiments, options: RunOptions):
    self.program = program
    self.experiments = experiments
    self.single = len(experiments) == 1
    self.mode = group_mode(experiments)
    self.step = round_lib.compiled_step(program, options.placement, self.mode, options.client_chunk,
                              options.devices,
                              in_sequence=self.mode is not None and not experiments_vmapped())
    mesh = round_lib.client_mesh(options.devices)
    self.shards = mesh.size
    self.replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    self.prefetch = options.placement == "host" and not options.checkpointed
    self.round_keys = _round_keys(self.single, self.replicated)
    self.evaluate = self._evaluator()
    self.arrays = self._arrays() if options.placement == "device" else None

  def stack(self, trees):
    """One experiment's tree as it is, several experiments' stacked on a leading axis."""
    return trees[0] if self.single else jax.tree_util.tree_map(lambda *xs: np.stack(xs), *trees)

  def unstack(self, tree, i: int):
    """Experiment ``i``'s part of a (stacked) tree."""
    return tree if self.single else jax.tree_util.tree_map(lambda a: a[i], tree)

  def initial(self, release: str) -> tuple:
    """``(state, hparams, run keys)`` placed on the mesh. A private release draws its rounds'
    keys and its cohorts from secret entropy (:data:`RANDOMNESS`): each sampler is reseeded."""
    experiments = self.experiments
    hps = [{k: jnp.asarray(v) for k, v in e.hparams.items()} for e in experiments]
    secrets_ = (secret_entropy(len(experiments)) if release == "private"
                else [None] * len(experiments))
    for e, secret in zip(experiments, secrets_):
      if secret is not None:
        e.sampler.reseed(secret)
    keys = [round_lib.run_keys(e.seed, secret) for e, secret in zip(experiments, secrets_)]
    states = [self.program.init(k_init, h) for (k_init, _), h in zip(keys, hps)]
    state = jax.tree_util.tree_map(jnp.asarray, self.stack(states))
    del states
    return jax.tree_util.tree_map(  # every process holds the same (NaN included)
        lambda a: jax.make_array_from_callback(np.shape(a), self.replicated,
                                               lambda index, a=np.asarray(a): a[index]),
        (state, self.stack(hps), self.stack([k_run for _, k_run in keys])))

  def _evaluator(self):
    """The test-set evaluation of the experiments' parameters (:func:`make_evaluator`)."""
    model = self.program.model
    if self.mode == "stacked":
      datas = [e.data for e in self.experiments]
      return make_evaluator(model, [d.test_x for d in datas], [d.test_y for d in datas],
                            experiments=self.mode, all_metrics=True)
    data = self.experiments[0].data
    return make_evaluator(model, data.test_x, data.test_y, experiments=self.mode,
                          all_metrics=True)

  def _arrays(self):
    """The clients' arrays on the device: one data set's, or each distinct data set once and
    which one each experiment reads (:class:`fedjax_dp.round.DataSets`)."""
    fields = ("x", "y", "counts")
    if self.mode != "stacked":
      return placed_arrays(tuple(getattr(self.experiments[0].data, f) for f in fields))
    datas = [e.data for e in self.experiments]
    distinct = list({id(d): d for d in datas}.values())
    which = {id(d): i for i, d in enumerate(distinct)}
    return round_lib.DataSets(
        placed_arrays(tuple(getattr(d, f) for d in distinct for f in fields),
                      lambda: tuple(jnp.asarray(np.stack([getattr(d, f) for d in distinct]))
                                    for f in fields)),
        jnp.asarray([which[id(d)] for d in datas], jnp.int32))

  def inputs(self, records) -> tuple:
    """The next round's cohorts and the step's inputs for them, each cohort padded to the
    group's largest capacity, a multiple of the device count (``records``' ``slots`` grow)."""
    cohorts = [e.sampler.sample() for e in self.experiments]
    n = self.shards
    capacity = -(-max(len(c.ids) for c in cohorts) // n) * n
    for rec in records:
      rec.slots = max(rec.slots, capacity // n)
    padded = [_pad_cohort(c, capacity, n) for c in cohorts]
    if self.arrays is not None:
      return cohorts, (self.stack([c.ids for c in padded]), self.stack([c.mask for c in padded]))
    batches = [round_lib.CohortBatch(*e.data.rows(c.ids), c.ids, c.mask)  # gathered on the host
               for e, c in zip(self.experiments, padded)]
    return cohorts, jax.device_put(self.stack(batches))

  def call(self, state, hp, inputs, key):
    """One round of every experiment: ``(state, metrics)``.

    Args:
      state: the experiments' :class:`fedjax_dp.round.RoundState` (stacked for several).
      hp: their hyper-parameters.
      inputs: the cohorts' step inputs (:meth:`inputs`).
      key: the round's key (:func:`_round_keys`).
    """
    if self.arrays is not None:
      return self.step(state, hp, self.arrays, *inputs, key)
    return self.step(state, hp, inputs, key)


def _observers(experiment: Experiment, records: Records, options: RunOptions, checkpointer,
               bar: Optional[Observer]) -> tuple:
  """``(history, observers)``: the experiment's :class:`fedjax_dp.observers.History` and every
  observer of its records in order: the history, its files (``metrics.jsonl``, ``metrics.csv``,
  TensorBoard, ``norms.npz`` under release "all"), its W&B run, its checkpoints, the group's
  progress bar, ``summary.json`` (last, when the other files are whole), then its own observers."""
  history = History()
  run = [history]
  tensorboard = norms = None
  if experiment.output_dir is not None:
    folder = pathlib.Path(experiment.output_dir)
    run += [MetricsFile(folder), MetricsTable(folder)]
    if options.tensorboard:
      run.append(tensorboard := TensorBoard(folder, experiment.config,
                                            private=options.release == "private"))
    if records.writes_norms:
      run.append(norms := NormsFile(folder, records.clip))
  if options.wandb is not None:
    run.append(WandB(options.wandb, experiment.config, private=options.release == "private"))
  if checkpointer is not None:
    run.append(Checkpoint(checkpointer, experiment, records, norms, tensorboard))
  if bar is not None:
    run.append(bar)
  if experiment.output_dir is not None:
    run.append(SummaryFile(pathlib.Path(experiment.output_dir)))
  return history, Observers(ReleasePolicy(options.release), run + list(experiment.observers))


def _checkpointer(experiment: Experiment, options: RunOptions):
  """The run's :class:`fedjax_dp.checkpoint.Checkpointer`, None when it is not checkpointed."""
  if not options.checkpointed:
    return None
  settings = experiment.settings if experiment.settings is not None else experiment.config
  return Checkpointer(options.checkpoint_every, settings or {}, options.resume)


class _Timer:
  """A run's timings (raw diagnostics): the whole run, its first round and the rounds after."""

  def __init__(self):
    self.start = time.perf_counter()
    self.first_round = None

  def round(self, seconds: float) -> None:
    if self.first_round is None:
      self.first_round = seconds

  def timing(self, rounds: int, done: int, experiments: int, ahead) -> dict:
    """The summary's timing fields.

    Args:
      rounds: the run's rounds.
      done: those that ran before this process (a resumed run's checkpoint round).
      experiments: the experiments in the group.
      ahead: the run's accounting workers (:func:`_epsilons_ahead`), or None.
    """
    total = time.perf_counter() - self.start
    timing = {"seconds_total": total, "seconds_first_round": self.first_round,
              "seconds_per_round_after_first": None if self.first_round is None else
              (total - self.first_round) / max(rounds - done - 1, 1)}
    if done:
      timing["resumed_from_round"] = done
    if experiments > 1:
      timing["experiments_in_group"] = experiments
    if ahead is not None and ahead.started:
      timing["accounting_workers"] = ahead.started
      timing["epsilons_from_accounting_workers"] = ahead.computed
    return timing


def run_group(program, experiments, rounds: int, options: Optional[RunOptions] = None,
              stop=None) -> list:
  """Runs experiments that share one :class:`fedjax_dp.round.Round` as one compiled program.

  One experiment runs the round's jitted step; several run it ``vmap``-ed over
  a leading experiment axis of ``(state, hparams, cohort, key)`` (and of the
  data sets when they differ, :func:`group_mode`), so the whole group compiles
  once and each round is one call. Each experiment keeps its own sampler,
  accounting, keys, records and observers, so its results equal its run alone (up to
  floating-point reassociation): a cohort is padded with inert slots to the
  group's largest capacity, and padded clients change nothing. A round's
  ``seconds`` is the whole group's.

  Args:
    program: the group's :class:`fedjax_dp.round.Round`.
    experiments: the :class:`Experiment` s.
    rounds: number of rounds T.
    options: :class:`RunOptions` (default: ``RunOptions()``); checkpoints need one experiment.
    stop: a :class:`threading.Event` that, once set, ends the run with :class:`Stopped` before
      its next round (a sweep's other programs running at once failed or were interrupted).

  Returns:
    One :class:`RunResult` per experiment, in order.

  Raises:
    ConfigError: on bad input, before anything compiles.
    Stopped: when ``stop`` was set.
  """
  options = options or RunOptions()
  _check_group(experiments, rounds, options)
  if options.compilation_cache:
    compilation.enable()
  prepared = _Program(program, experiments, options)
  state, hp, run_key = prepared.initial(options.release)
  records = [Records(program, e, options, prepared.shards) for e in experiments]
  checkpointer = _checkpointer(experiments[0], options)
  private, bar = options.release == "private", None
  if options.progress:
    bar = ProgressBar(len(experiments), private, METRIC_LABELS[metric_names(program.model)[0]])
  elif options.progress_every is not None:
    bar = ProgressLines(options.progress_every, len(experiments), private,
                        metric=METRIC_LABELS[metric_names(program.model)[0]])
  runs = [_observers(e, rec, options, checkpointer if i == 0 else None, bar if i == 0 else None)
          for i, (e, rec) in enumerate(zip(experiments, records))]
  ahead = None
  try:
    start = Start(rounds)
    if checkpointer is not None:
      state, start = checkpointer.begin(state, experiments[0], rounds, prepared.shards,
                                        options.release, options.tensorboard)
    for rec, (_, observers) in zip(records, runs):
      rec.resume(start)
      observers.start(start)
    timer = _Timer()
    ahead = _epsilons_ahead(experiments, rounds - start.done, options.accounting_workers)
    state = _rounds(prepared, (state, hp, run_key), records, [o for _, o in runs],
                    (start.done, rounds, options.eval_every), ahead, stop, timer)
    timing = timer.timing(rounds, start.done, len(experiments), ahead)
    return [_finish(prepared, rec, history, observers, prepared.unstack(state, i), rounds, timing)
            for i, (rec, (history, observers)) in enumerate(zip(records, runs))]
  finally:
    for _, observers in runs:
      observers.close()
    if ahead is not None:
      ahead.close()


def _finish(prepared: _Program, records: Records, history: History, observers: Observers,
            state, rounds: int, timing: dict) -> RunResult:
  """An experiment's :class:`RunResult` after ``rounds`` from its final ``state``, given to its
  observers."""
  result = RunResult(history.rows, records.summary(prepared.program, state, rounds, timing), state)
  observers.finish(result)
  return result


def _rounds(prepared: _Program, initial: tuple, records, observers, span: tuple, ahead, stop,
            timer: _Timer):
  """Runs rounds ``done`` to ``rounds - 1`` (``span``: ``(done, rounds, eval_every)``) from
  ``initial`` ``(state, hparams, run key)``, giving each experiment's record to its
  ``observers``; returns the final state."""
  state, hp, run_key = initial
  done, rounds, eval_every = span
  pending = None
  for r in range(done, rounds):
    if stop is not None and stop.is_set():
      raise Stopped(f"stopped before round {r + 1} of {rounds}")
    t0 = time.perf_counter()
    cohorts, ready = pending if pending is not None else prepared.inputs(records)
    state, metrics = prepared.call(state, hp, ready, prepared.round_keys(run_key, r))
    # The step runs asynchronously: its privacy cost is accounted, and the next cohort drawn,
    # gathered and sent, meanwhile.
    accounted = [rec.account(c, ahead) for rec, c in zip(records, cohorts)]
    pending = prepared.inputs(records) if prepared.prefetch and r + 1 < rounds else None
    metrics = jax.device_get(metrics)
    seconds = time.perf_counter() - t0
    evaluation = None
    if (r + 1) % eval_every == 0 or r + 1 == rounds:
      evaluation = {k: np.atleast_1d(v) for k, v in
                    jax.device_get(prepared.evaluate(prepared.program.eval_params(state))).items()}
    timer.round(seconds)
    for i, (rec, obs) in enumerate(zip(records, observers)):
      ev = None if evaluation is None else {k: float(v[i]) for k, v in evaluation.items()}
      record = rec.round(r, rounds, prepared.unstack(metrics, i), accounted[i], ev, seconds)
      obs.round(dataclasses.replace(record, state=state) if prepared.single else record)
  return state
