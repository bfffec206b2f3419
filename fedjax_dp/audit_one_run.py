"""A whole DP-FedAvg run audited in one run: many canary clients, one training run.

``fedjax-dp audit --one-run`` runs user-level DP-FedAvg with Poisson sampling through the
library's engine (:func:`fedjax_dp.engine.run`, as ``fedjax-dp run --algorithm dp_fedavg``
does), on the bundled digits data, with ``m`` canary clients added to the population, and
bounds epsilon from below by the method of Steinke, Nasr and Jagielski ("Privacy Auditing with
One (1) Training Run", NeurIPS 2023; :func:`fedjax_dp.lower_bounds.one_run_epsilon`).

The canaries. Each of the ``m`` canary clients is included in the run independently with
probability 1/2 (a seeded draw, recorded in the report). An included canary's update, whatever
its local training gave, is replaced by ``canary_norm * u_i``: a fixed direction ``u_i``,
uniform on the unit sphere of the model's parameters and a function of the audit's seed and the
client's id (:func:`fedjax_dp.transforms.replace_by_canary`, a client transform before the
clip). An excluded canary keeps its slot in the population but sends nothing (a zero update):
with the mean's public denominator ``qN`` the release is then exactly what it is without that
client, which is the add/remove relation the run's ledger claims (the same as the one-round
audit ``dp_fedavg-poisson``'s absent canary). These are white-box "gradient canaries": a
user-level guarantee bounds what any one client contributes through the clip, whatever its
update, so an arbitrary update is within what it covers. Nothing is bypassed: the round is the
dp_fedavg builder's own with one more client transform before its clip, and its sampler, its
noise and its accounting are the builder's.

The attack. All iterates of the global model are released under the run's guarantee. An
observer of the run reads each round's released aggregate ``a_t = (theta_t - theta_{t-1}) /
server_lr`` and projects it on every canary's direction, in units of the nominal noise:
``x_{t,i} = <a_t, u_i> qN / (z S)`` is ``N(0, 1)`` without the canary and ``N(1/z, 1)`` in a
round that samples it (``S`` the clip, ``z`` the noise multiplier the ledger accounts). A
canary's score is the log-likelihood ratio of its projections under that model, sampled with
the run's rate ``q`` in each round: ``sum_t log(1 - q + q exp(x_{t,i}/z - 1/(2 z^2)))``. The
auditor guesses the ``k`` highest scores included and the ``k`` lowest excluded, for each ``k``
of a set fixed in advance (:data:`GUESSES`); each ``k``'s bound holds at confidence ``1 - (1 -
confidence) / len(GUESSES)`` (Bonferroni), so the best of them holds at ``confidence``.

What it shows. A bound above the run's claimed epsilon shows, at the stated confidence, that
the run as the engine executed it (sampling, local training, clip, noise, server step) is not
(epsilon, delta)-DP as its ledger says. A bound below it shows little: with ``m`` canaries the
bound cannot pass about ``log(m)`` whatever the run does, and the guesses of one run resolve far
less than the many releases of the one-round audits (:mod:`fedjax_dp.audit`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree
import numpy as np

from fedjax_dp import algorithms, engine
from fedjax_dp.algorithms.base import as_hparams
from fedjax_dp.algorithms.dp_fedavg import fedavg_pieces
from fedjax_dp.algorithms.fedavg import Training, fedavg_client
from fedjax_dp.config import make_config
from fedjax_dp.data import FederatedData
from fedjax_dp.errors import check
from fedjax_dp.experiment import load_data, options_for, recorded_config
from fedjax_dp.lower_bounds import one_run_epsilon
from fedjax_dp.models import Model
from fedjax_dp.models.zoo import MLP
from fedjax_dp.observers import Observer
from fedjax_dp.round import run_keys
from fedjax_dp.transforms import canary_direction

ONE_RUN = "dp_fedavg-run"  # the report's mechanism
# The guesses on each side (k included, k excluded), fixed before the run.
GUESSES = (10, 25, 50, 100, 200)
# The audited run's settings: user-level DP-FedAvg, Poisson sampling (add/remove one client).
SETTINGS = dict(algorithm="dp_fedavg", dataset="digits", num_clients=50,
                sampling="poisson", sampling_prob=0.05, noise_multiplier=1.5, clip=1.0,
                rounds=200, local_steps=2, batch_size=8, client_lr=0.1, server_lr=1.0,
                target_epsilon=None, delta=1e-5, eval_every=200)
HIDDEN = (32,)  # the MLP's hidden layer (8-by-8 inputs, 10 classes: 2,410 parameters)
CANARIES = 1000


class CanaryScores(Observer):
  """Scores every canary from each round's released aggregate (module docstring).

  Attributes:
    directions: ``[m, d]`` the canaries' unit directions, flattened as the model's parameters.
    scale: ``qN / (z S)``: an aggregate's projection in units of the nominal noise.
    signal: ``1 / z``: a sampled canary's mean projection in those units.
    rate: ``q``, the sampling rate.
    server_lr: the server's learning rate (the aggregate is the model's step over it).
    previous: the flattened model before the next round.
    scores: ``[m]`` the log-likelihood ratios so far.
  """

  def __init__(self, directions, initial, scale: float, signal: float, rate: float,
               server_lr: float):
    self.directions, self.previous = directions, initial
    self.scale, self.signal, self.rate, self.server_lr = scale, signal, rate, server_lr
    self.scores = np.zeros(directions.shape[0])

  def round(self, record) -> None:
    theta = np.asarray(ravel_pytree(record.state.params)[0], np.float64)
    x = self.directions @ ((theta - self.previous) / self.server_lr) * self.scale
    mu, q = self.signal, self.rate
    self.scores += np.logaddexp(math.log1p(-q), math.log(q) + mu * x - mu * mu / 2)
    self.previous = theta


def with_canaries(data: FederatedData, canaries: int) -> FederatedData:
  """``data`` with ``canaries`` more clients (the last ids), each holding one copy of client 0's
  first example: what they train on is replaced by their canary, or sent as nothing."""
  n, shape = data.num_clients, data.x.shape
  x = np.concatenate([data.x, np.zeros((canaries,) + shape[1:], data.x.dtype)])
  y = np.concatenate([data.y, np.zeros((canaries,) + data.y.shape[1:], data.y.dtype)])
  x[n:, 0], y[n:, 0] = data.x[0, 0], data.y[0, 0]
  counts = np.concatenate([data.counts, np.ones(canaries, np.int32)])
  return dataclasses.replace(data, x=x, y=y, counts=counts)


def canary_round(program, config):
  """``program`` (a dp_fedavg builder's round) with the ``canary`` transform before its client
  transforms (:func:`fedjax_dp.transforms.replace_by_canary`), each client's canary scale read
  from ``hp["canary"]`` by its id; the aggregator, the attack slot and the server step are
  ``program``'s. One Round per ``program`` and training settings, so its step compiles once."""
  return _canary_round(program, fedavg_pieces(config, True, "none", ("canary",)),
                       Training.of(config))


@functools.lru_cache(maxsize=8)
def _canary_round(program, pieces, training):
  hooks = program.hooks._replace(client_hparams=lambda server, hp, ids: (ids, hp["canary"][ids]))
  return dataclasses.replace(program, client=fedavg_client(program.model, pieces, training),
                             hooks=hooks)


@dataclasses.dataclass(frozen=True)
class CanaryRun:
  """A DP-FedAvg run with canary clients, ready to run (:func:`canary_run`).

  Attributes:
    config: its configuration (the population counts the canaries).
    data: the population: the real clients, then the canaries.
    setup: the dp_fedavg builder's :class:`fedjax_dp.algorithms.Setup` (sampler, accounting).
    program: :func:`canary_round` of the setup's round.
    hparams: the setup's hyper-parameters with the canaries' and the noise that runs.
    included: ``[m]`` whether each canary is in the run.
    real: the real clients (the canaries are ids ``real`` to ``real + m - 1``).
  """

  config: object
  data: FederatedData
  setup: object
  program: object
  hparams: dict
  included: np.ndarray
  real: int


def canary_run(canaries: int, seed: int, noise_factor: float = 1.0, canary_norm: float = 1.0,
               **settings) -> CanaryRun:
  """The audited run: :data:`SETTINGS` with ``settings``, ``canaries`` canary clients appended,
  each included with probability 1/2 (drawn from ``seed``), an included one's update
  ``canary_norm`` clip bounds long, the noise multiplied by ``noise_factor``.

  Args:
    canaries: ``m``, the canary clients.
    seed: the run's seed and the canaries' (their inclusion and directions).
    noise_factor: multiplies the noise that runs (the ledger accounts the nominal one).
    canary_norm: an included canary's update norm, in clip bounds.
    **settings: overrides of :data:`SETTINGS`.

  Returns:
    The :class:`CanaryRun`.

  Raises:
    ConfigError: on a bad setting, or one the audit fixes (the algorithm, the sampling, the
      denominator, the server's optimizer, a target epsilon).
  """
  check(isinstance(canaries, int) and not isinstance(canaries, bool) and canaries >= 2,
        "canaries", canaries, "must be an integer >= 2")
  check(isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed < 2 ** 31, "seed",
        seed, "must be an integer in [0, 2**31)")
  check(math.isfinite(noise_factor) and noise_factor > 0, "noise_factor", noise_factor,
        "must be a finite number > 0")
  check(math.isfinite(canary_norm) and canary_norm > 0, "canary_norm", canary_norm,
        "must be a finite number > 0")
  fixed = sorted(set(settings) & {"algorithm", "sampling", "denominator", "server_optimizer",
                                  "target_epsilon", "model"})
  check(not fixed, "settings", fixed, "are fixed by the one-run audit (user-level DP-FedAvg, "
        "Poisson sampling, the expected denominator, an SGD server, the noise multiplier as "
        "given, its MLP): leave them out")
  model = Model("mlp", MLP(10, hidden=HIDDEN), (8, 8, 1), 10)
  config = make_config(**{**SETTINGS, "model": model, "seed": seed, **settings})
  real = config.num_clients
  data = with_canaries(load_data(config), canaries)
  config = config.replace(num_clients=data.num_clients)
  setup = algorithms.build(config, data)
  included = np.random.default_rng([seed, 0x0E1]).random(canaries) < 0.5
  scale = np.full(data.num_clients, -1.0)
  scale[real:] = np.where(included, canary_norm * config.clip, 0.0)
  hp = dict(setup.hparams, **as_hparams({"canary": scale, "canary_seed": seed}))
  hp["noise_multiplier"] = np.asarray(hp["noise_multiplier"] * noise_factor, np.float32)
  return CanaryRun(config, data, setup, canary_round(setup.program, config), hp, included, real)


def canary_directions(params, seed: int, ids) -> np.ndarray:
  """The unit directions of canaries ``ids``, flattened as ``params``.

  Args:
    params: the model's parameters (their shapes and order).
    seed: the canaries' seed (``hp["canary_seed"]``).
    ids: the canaries' client ids.

  Returns:
    ``[len(ids), d]`` float64, each row :func:`fedjax_dp.transforms.canary_direction`'s.
  """
  fn = jax.jit(jax.vmap(lambda i: ravel_pytree(canary_direction(params, seed, i))[0]))
  return np.asarray(fn(jnp.asarray(ids, jnp.int32)), np.float64)


def best_guesses(scores: np.ndarray, included: np.ndarray, delta: float, confidence: float,
                 guesses: Sequence[int] = GUESSES) -> dict:
  """The bound of the guesses "the ``k`` highest scores are included, the ``k`` lowest are
  not", for each ``k`` of ``guesses`` (each at its Bonferroni share of ``1 - confidence``).

  Args:
    scores: ``[m]`` one score per canary (higher: more likely included).
    included: ``[m]`` whether each canary was included.
    delta: the delta at which epsilon is bounded.
    confidence: the probability that the best bound holds.
    guesses: the ``k`` (at most ``m / 2`` each), fixed before the scores were seen.

  Returns:
    ``{epsilon_lower_bound, guesses, correct, by_guesses}``: the best bound with its guesses
    ``r = 2k`` and correct guesses ``v``, and every ``k``'s ``{r, v, epsilon_lower_bound}``.
  """
  m = len(scores)
  check(all(1 <= k <= m // 2 for k in guesses), "guesses", tuple(guesses),
        f"must each be in [1, {m // 2}] (half the {m} canaries)")
  order = np.argsort(scores, kind="stable")
  each = 1.0 - (1.0 - confidence) / len(guesses)
  rows = []
  for k in guesses:
    v = int(np.sum(included[order[-k:]]) + np.sum(~included[order[:k]]))
    rows.append({"k": k, "r": 2 * k, "v": v,
                 "epsilon_lower_bound": one_run_epsilon(m, 2 * k, v, delta, each)})
  best = max(rows, key=lambda row: row["epsilon_lower_bound"])
  return {"epsilon_lower_bound": best["epsilon_lower_bound"], "guesses": best["r"],
          "correct": best["v"], "by_guesses": rows}


def one_run_audit(canaries: int = CANARIES, seed: int = 0, confidence: float = 0.95,
                  noise_factor: float = 1.0, canary_norm: float = 1.0,
                  guesses: Optional[Sequence[int]] = None, **settings) -> dict:
  """Audits one DP-FedAvg run with ``canaries`` canary clients (module docstring).

  Args:
    canaries: ``m``, the canary clients (each included with probability 1/2).
    seed: the run's seed and the canaries' (their inclusion and directions).
    confidence: the probability that the bound holds.
    noise_factor: multiplies the noise the run adds while its ledger accounts the nominal one:
      below 1 is a mis-calibrated run, which the audit should catch.
    canary_norm: an included canary's update norm, in clip bounds (the clip scales a longer one
      down to the bound).
    guesses: the ``k`` of :func:`best_guesses` (default: those of :data:`GUESSES` up to
      ``canaries / 2``).
    **settings: overrides of :data:`SETTINGS` (``rounds``, ``noise_multiplier``, ...); the
      algorithm, Poisson sampling, the expected denominator and the SGD server stay.

  Returns:
    The JSON-ready report: ``m``, ``r``, ``v``, ``epsilon_lower_bound``, ``epsilon_claimed`` (the
    run's own summary), ``delta``, ``confidence``, the run's settings and the canaries' draw
    (``included``: the numbers, 0 to ``m - 1``, of the canaries in the run).

  Raises:
    ConfigError: on a bad setting, before anything runs.
  """
  check(0 < confidence < 1, "confidence", confidence, "must be in (0, 1)")
  check(isinstance(canaries, int) and canaries >= 2 * GUESSES[0], "canaries", canaries,
        f"must be an integer >= {2 * GUESSES[0]} (the fewest guesses, {GUESSES[0]}, on each side)")
  if guesses is None:
    guesses = [k for k in GUESSES if k <= canaries // 2]
  t0 = time.perf_counter()
  run = canary_run(canaries, seed, noise_factor, canary_norm, **settings)
  config, data, setup, program, hp = run.config, run.data, run.setup, run.program, run.hparams
  real, included = run.real, run.included
  initial = program.init(run_keys(config.seed)[0], hp).params
  z, clip = float(setup.hparams["noise_multiplier"]), float(hp["clip"])
  scores = CanaryScores(canary_directions(initial, seed, np.arange(real, data.num_clients)),
                        np.asarray(ravel_pytree(initial)[0], np.float64),
                        float(hp["expected_size"]) / (z * clip), 1.0 / z,
                        config.sampling_prob, float(hp["server_lr"]))
  experiment = engine.Experiment(hp, data, setup.sampler, config.seed, setup.accounting,
                                 config=recorded_config(config), settings=config.to_dict(),
                                 observers=[scores])
  result = engine.run(program, experiment, config.rounds, options_for(config, program))
  summary = result.summary
  bound = best_guesses(scores.scores, included, summary["delta"], confidence, guesses)
  claimed = summary["epsilon"]
  return {"mechanism": ONE_RUN, "m": canaries, "r": bound["guesses"],
          "v": bound["correct"], "epsilon_lower_bound": bound["epsilon_lower_bound"],
          "epsilon_claimed": claimed, "delta": summary["delta"], "confidence": confidence,
          "noise_factor": noise_factor, "seed": seed,
          "tightness": bound["epsilon_lower_bound"] / claimed if claimed else None,
          "by_guesses": bound["by_guesses"], "canary_norm": canary_norm,
          "included": [int(i) for i in np.flatnonzero(included)],
          "formal_guarantee": summary["formal_guarantee"],
          "neighbouring_relation": summary.get("neighbouring_relation"),
          "settings": {**{k: getattr(config, k) for k in SETTINGS if k != "num_clients"},
                       "clients": real, "hidden": list(HIDDEN)},
          "final_accuracy": summary.get("final_accuracy"),
          "seconds": round(time.perf_counter() - t0, 2)}
