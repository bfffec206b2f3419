"""The run loop: host-side sampling and accounting around one compiled round.

::

  host (NumPy)                          device (one jitted function)
  sample cohort -> padded ids + mask -> gather client rows, program.round_step
  accounting.on_round(cohort)  <-       metrics -> metrics.jsonl, progress bar

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
  metric, the timings, and the sampler's capacity (which grows with a large
  draw). None of these is noised.

``release="private"`` writes (and returns) only the first two groups.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import pathlib
import time
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.errors import check, check_choice
from fedjax_dp.jsonio import dumps

PLACEMENTS = ("device", "host")
RELEASES = ("all", "private")
ROW_COVERED = ("test_accuracy", "test_loss", "diverged")
SUMMARY_COVERED = ("final_accuracy", "final_test_loss", "diverged")
PUBLIC_BY_DESIGN = ("round", "rounds", "config", "noise_multiplier", "model", "data",
                    "epsilon and every field of the "
                    "privacy report (functions of the public settings and, for example-level runs, of "
                    "the public participation and example counts)")


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


@dataclasses.dataclass
class RunResult:
  """A finished run.

  Attributes:
    history: one record per round (as written to ``metrics.jsonl``).
    summary: the run's summary (as written to ``summary.json``).
    state: the final :class:`fedjax_dp.round.RoundState` (``state.params``: the model).
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
    """The per-round metrics as a pandas ``DataFrame`` indexed by round (needs pandas)."""
    try:
      import pandas as pd
    except ImportError as e:
      raise ImportError("RunResult.to_dataframe needs pandas (pip install pandas); "
                        "RunResult.metrics has the same columns as NumPy arrays") from e
    m = self.metrics
    return pd.DataFrame(m).set_index("round") if "round" in m else pd.DataFrame(m)


@functools.lru_cache(maxsize=64)
def _evaluate_fn(model):
  """The jitted test-set evaluation of ``model``, compiled once per model and test-set shape."""
  from fedjax_dp.models import cross_entropy

  @jax.jit
  def evaluate(params, xs, ys, ms):
    def chunk(args):
      x, y, m = args
      logits = model.apply(params, x)
      correct = jnp.sum((jnp.argmax(logits, -1) == y) * m)
      return correct, cross_entropy(logits, y, m) * jnp.sum(m)
    correct, loss = jax.lax.map(chunk, (xs, ys, ms))
    n = jnp.sum(ms)
    return jnp.sum(correct) / n, jnp.sum(loss) / n

  return evaluate


def make_evaluator(model, test_x: np.ndarray, test_y: np.ndarray, batch_size: int = 1024):
  """``params -> (accuracy, loss)`` over the whole test set, in fixed-size chunks (jitted once)."""
  n = len(test_y)
  bs = min(batch_size, n)
  chunks = -(-n // bs)
  pad = chunks * bs - n
  xs = jnp.asarray(np.concatenate([test_x, np.zeros((pad,) + test_x.shape[1:], test_x.dtype)])
                   .reshape((chunks, bs) + test_x.shape[1:]))
  ys = jnp.asarray(np.concatenate([test_y, np.zeros(pad, test_y.dtype)]).reshape(chunks, bs))
  ms = jnp.asarray((np.arange(chunks * bs) < n).astype(np.float32).reshape(chunks, bs))
  fn = _evaluate_fn(model)
  return lambda params: fn(params, xs, ys, ms)


def _quantiles(values: np.ndarray) -> dict:
  if values.size == 0:
    return {}
  q = np.quantile(values, [0.1, 0.5, 0.9])
  return {"mean": float(values.mean()), "q10": float(q[0]), "q50": float(q[1]), "q90": float(q[2])}


def summarize_round(metrics: dict, clip: Optional[float], released_metrics=()) -> tuple:
  """Host-side summary of one round's metrics: ``(released, diagnostics)``.

  ``released`` holds the scalar metrics named in ``released_metrics``;
  ``diagnostics`` the realized cohort size, the real clients' mean loss, the
  quantiles of their pre-clip update norms, the fraction clipped and every
  other scalar metric (raw, not covered by any guarantee).
  """
  mask = np.asarray(metrics["mask"]) > 0
  diag = {"cohort_size": int(mask.sum())}
  losses = np.asarray(metrics["client_loss"])[mask]
  diag["train_loss"] = float(losses.mean()) if losses.size else None
  norms = np.asarray(metrics["update_norm"])[mask]
  diag["update_norm"] = _quantiles(norms)
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


def run_keys(seed: int):
  """``(k_init, k_run)``: the initial state is ``program.init(k_init, hparams)``, round ``r``'s
  key ``fold_in(k_run, r)`` (a builder that must see the initial model uses ``k_init`` too)."""
  return tuple(jax.random.split(jax.random.PRNGKey(seed)))


def clip_bound(program, hparams) -> Optional[float]:
  """The L2 bound of the round's clip transform (for ``fraction_clipped``), or None."""
  bound = getattr(program.client, "bound", None)
  return None if bound is None else float(hparams[bound])


def run(program, data, sampler, rounds: int, *, hparams: Optional[dict] = None, seed: int = 0,
        accounting=None,
        eval_every: int = 1, output_dir: Optional[str] = None, progress: bool = True,
        config: Optional[dict] = None, placement: str = "device",
        on_round: Optional[Callable[[dict], None]] = None, release: str = "all") -> RunResult:
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
      it goes) and ``summary.json`` is written at the end.
    progress: show a progress bar.
    config: the run's configuration, copied into the summary.
    placement: "device" keeps every client's data on the accelerator and
      gathers the cohort inside the compiled round; "host" gathers the cohort's
      rows with NumPy each round (for populations that do not fit).
    on_round: optional callback with each round's record.
    release: "all" (default) keeps the raw diagnostics under ``diagnostics``
      in every record and in the summary; "private" leaves them out, so the
      outputs hold only what the guarantee covers and what is public by
      design (module docstring).
  """
  check(rounds >= 1, "rounds", rounds, "must be >= 1")
  check(eval_every >= 1, "eval_every", eval_every, "must be >= 1")
  check_choice("placement", placement, PLACEMENTS)
  check_choice("release", release, RELEASES)
  released_metrics = tuple(getattr(program, "released_metrics", ()))
  out_dir = pathlib.Path(output_dir) if output_dir else None
  if out_dir is not None:
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics_file = open(out_dir / "metrics.jsonl", "w")
  k_init, k_run = run_keys(seed)
  from fedjax_dp.round import CohortBatch, compiled_step
  hp = {k: jnp.asarray(v) for k, v in dict(hparams or {}).items()}
  state = program.init(k_init, hp)
  evaluate = make_evaluator(program.model, data.test_x, data.test_y)
  step = compiled_step(program, placement)
  clip = clip_bound(program, hparams or {})

  if placement == "device":
    arrays = (jnp.asarray(data.x), jnp.asarray(data.y), jnp.asarray(data.counts))

    def call(state, cohort, key):
      return step(state, hp, arrays, cohort.ids, cohort.mask, key)
  else:
    def call(state, cohort, key):
      ids = cohort.ids
      batch = CohortBatch(data.x[ids], data.y[ids], data.counts[ids], ids, cohort.mask)
      return step(state, hp, batch, key)

  bar = None
  if progress:
    from tqdm.auto import tqdm
    bar = tqdm(total=rounds, unit="round", dynamic_ncols=True)
  history = []
  t_start = time.perf_counter()
  first_round_s = None
  accuracy = loss = None
  diverged = False
  try:
    for r in range(rounds):
      t0 = time.perf_counter()
      cohort = sampler.sample()
      state, metrics = call(state, cohort, jax.random.fold_in(k_run, r))
      metrics = jax.device_get(metrics)
      seconds = time.perf_counter() - t0
      if first_round_s is None:
        first_round_s = seconds
      released, diag = summarize_round(metrics, clip, released_metrics)
      rec = {"round": r + 1, **released}
      if accounting is not None:
        accounting.on_round(cohort)
        rep = accounting.report()
        rec["epsilon"] = rep.get("epsilon")
        for k, v in rep.items():
          if k.startswith("epsilon_"):
            rec[k] = v
      if (r + 1) % eval_every == 0 or r + 1 == rounds:
        acc, tl = jax.device_get(evaluate(program.eval_params(state)))
        accuracy, loss = float(acc), float(tl)
        rec["test_accuracy"], rec["test_loss"] = accuracy, loss
        if not math.isfinite(loss):
          rec["diverged"] = diverged = True
      if release == "all":
        rec["diagnostics"] = dict(diag, seconds=seconds)
      history.append(rec)
      if out_dir is not None:
        metrics_file.write(dumps(rec) + "\n")
        metrics_file.flush()
      if on_round is not None:
        on_round(rec)
      if bar is not None:
        post = {"acc": f"{accuracy:.4f}" if accuracy is not None else "-"}
        if release == "all" and diag.get("train_loss") is not None:
          post["loss"] = f"{diag['train_loss']:.3f}"
        if rec.get("epsilon") is not None:
          post["eps"] = f"{rec['epsilon']:.2f}"
        bar.set_postfix(post, refresh=False)
        bar.update(1)
  finally:
    if bar is not None:
      bar.close()
    if out_dir is not None:
      metrics_file.close()
  total = time.perf_counter() - t_start
  summary = {
      "final_accuracy": accuracy,
      "final_test_loss": loss,
      "diverged": diverged,
      "rounds": rounds,
  }
  if accounting is not None:
    summary.update(accounting.report())
  noise = getattr(getattr(accounting, "mechanism", None), "noise_multiplier", None)
  if noise is not None:
    summary["noise_multiplier"] = noise
  summary["config"] = config
  summary.update(provenance(program.model, state, data))
  summary["release"] = {
      "mode": release,
      "covered_by_guarantee": {"summary": list(SUMMARY_COVERED),
                               "metrics_rows": list(ROW_COVERED) + list(released_metrics)},
      "public_by_design": list(PUBLIC_BY_DESIGN),
      "diagnostics": ("raw, unnoised statistics (realized cohort sizes, client losses, pre-clip norms, "
                      "timings, the sampler's capacity): not covered by the guarantee"
                      + (", and left out of this run's outputs" if release == "private" else
                         ", grouped under 'diagnostics'")),
  }
  if release == "all":
    counts = np.asarray(data.counts)
    summary["diagnostics"] = {
        # Raw statistics of the clients' data (unnoised; public only under example-level DP).
        "data": {"train_examples": int(counts.sum()),
                 "examples_per_client": {"min": int(counts.min()), "median": float(np.median(counts)),
                                         "max": int(counts.max())}},
        "seconds_total": total,
        "seconds_first_round": first_round_s,
        "seconds_per_round_after_first": (total - first_round_s) / max(rounds - 1, 1),
        "cohort_capacity": int(sampler.capacity),
        "capacity_grew": int(getattr(sampler, "capacity_grew", 0)),
    }
  if out_dir is not None:
    (out_dir / "summary.json").write_text(dumps(summary, indent=2, default=str) + "\n")
  return RunResult(history, summary, state)
