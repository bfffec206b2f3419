"""One call from a configuration to a finished run: load data, build, run."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Optional, Sequence

import flax.linen as nn
import jax
import numpy as np

from fedjax_dp import algorithms, engine
from fedjax_dp.attacks import knowledge_of_unreleased
from fedjax_dp.config import RunConfig, make_config, nest, noise_warning
from fedjax_dp.data import Split, load_federated
from fedjax_dp.engine import Experiment, RunOptions, RunResult, noise_multiplier
from fedjax_dp.errors import NoiseWarning, SizeWarning, check
from fedjax_dp.models import Model
from fedjax_dp.observers import Callback, Observer
from fedjax_dp.outputs import claimed
from fedjax_dp.privacy.accounting import LedgerAccounting
from fedjax_dp.privacy.mechanisms import user_level_mechanism
from fedjax_dp.round import check_devices
from fedjax_dp.sampling import make_sampler

# The RunOptions fields that are a configuration's settings too (RunConfig fields): a run built
# from a configuration takes them from it (options_for).
FROM_CONFIG = ("eval_every", "placement", "client_chunk", "devices", "accounting_workers")
# simulate's keywords that are run options (RunOptions fields), not settings of the configuration.
RUN_KEYWORDS = tuple(f.name for f in dataclasses.fields(RunOptions) if f.name not in FROM_CONFIG)


def load_data(config: RunConfig):
  """The data a configuration names, split into its clients.

  Args:
    config: a :class:`RunConfig`; its ``dataset``, ``data_dir`` (None: ``$FEDJAX_DP_DATA``),
      ``download``, ``max_train``/``max_test``, its partition settings (``num_clients``,
      ``partition``, ``dirichlet_alpha``, ``shards_per_client``, ``min_labels_per_client``)
      and the split's seed (``data_seed``, else ``seed``) are read. Local files come first;
      tensorflow-datasets is asked only with ``download``. The same settings give the same
      clients.

  Returns:
    The :class:`fedjax_dp.data.FederatedData`, ready for :func:`simulate` (load it once and
    pass it to every run of the same data).

  Raises:
    ConfigError: the data set's files are missing from the data folder (without
      ``download``), a bad subset size, or a partition the data set cannot have or cannot
      split as asked (:func:`fedjax_dp.data.loaders.load_federated`).
  """
  split = Split(config.num_clients, config.partition, alpha=config.dirichlet_alpha,
                shards_per_client=config.shards_per_client,
                min_labels=config.min_labels_per_client)
  return load_federated(config.dataset, split, seed=config.split_seed, data_dir=config.data_dir,
                        max_train=config.max_train, max_test=config.max_test,
                        download=config.download)


# A batch this many times the largest client's data set is warned of (SizeWarning).
SIZE_WARNING_FACTOR = 10


def simulate(config: Optional[RunConfig] = None, data=None, *,
             run_options: Optional[RunOptions] = None, model=None, round=None,
             hparams: Optional[dict] = None, on_round=None,
             observers: Sequence[Observer] = (), **settings) -> RunResult:
  """Runs a simulation and returns its :class:`fedjax_dp.engine.RunResult`.

  Args:
    config: a :class:`RunConfig` (default: the quickstart).
    data: a :class:`fedjax_dp.data.FederatedData` (default: loaded from the
      configuration).
    run_options: how the run runs and what it writes (:class:`fedjax_dp.engine.RunOptions`): its
      ``output_dir`` (a folder holding an earlier run's files is refused unless ``overwrite``
      or ``resume``, as by ``fedjax-dp run``: :func:`fedjax_dp.outputs.check_output_dir`),
      ``progress``, ``release``, ``tensorboard``, ``checkpoint_every``, ``resume``. Its
      fields that are settings of the configuration too (:data:`FROM_CONFIG`) come from the
      configuration: give those as settings.
    model: a model name of ``fedjax_dp.components.names("model")`` (as ``config.model``), a flax
      ``nn.Module`` (mapping a batch ``[B, *example_shape]`` to ``[B, num_classes]``
      logits) or a :class:`fedjax_dp.models.Model`, used instead of ``config.model`` by the
      configured algorithm.
    round: a hand-built :class:`fedjax_dp.round.Round` (your own algorithm),
      run with ``hparams``; its privacy is derived from what its pieces
      declare (:func:`fedjax_dp.privacy.mechanisms.user_level_mechanism`), for
      the configured sampling, delta and accountant.
    hparams: the hand-built round's hyper-parameters (name -> number).
    on_round: called with each round's record (:class:`fedjax_dp.observers.Callback`).
    observers: more :class:`fedjax_dp.observers.Observer` s of the run's records.
    **settings: field overrides of ``config`` (``simulate(rounds=20, target_epsilon=4.0)``; a
      setting the algorithm does not read, ``clip`` for ``rsa``, is refused, as on the command
      line) and run options by name (:data:`RUN_KEYWORDS`: ``output_dir=DIR``,
      ``release="private"``, ...), which replace ``run_options``' (``options``: ``--set``).

  Returns:
    The run's :class:`fedjax_dp.engine.RunResult`.

  Raises:
    ConfigError: on a bad setting or option, before anything compiles.
  """
  given = {k: settings.pop(k) for k in RUN_KEYWORDS if k in settings}
  options = dataclasses.replace(run_options or RunOptions(), **given)
  check_from_config(options)
  config, model = _configured(config, model, settings)
  if options.output_dir is None:
    return _simulate(config, data, options, model, round, hparams, on_round, observers)
  with claimed(options.output_dir, overwrite=options.overwrite, resume=options.resume) as out:
    options = dataclasses.replace(options, output_dir=str(out))  # resolved where it has ..
    return _simulate(config, data, options, model, round, hparams, on_round, observers)


def _simulate(config: RunConfig, data, options: RunOptions, model, round, hparams, on_round,
              observers) -> RunResult:
  """:func:`simulate` once its settings and output folder are checked."""
  if data is None:
    data = load_data(config)
  if model is not None:
    config = config.replace(model=as_model(model, data))
  setup = (custom_setup(round, hparams, config, data) if round is not None
           else algorithms.build(config, data))
  how = ("as given" if config.target_epsilon is None else
         f"calibrated for target_epsilon={config.target_epsilon:g}")
  warning = noise_warning(noise_multiplier(setup.accounting), how)
  if warning is not None:  # before the first round: the run goes on
    warnings.warn(warning, NoiseWarning, stacklevel=2)
  largest = int(np.max(data.counts))
  if config.batch_size > SIZE_WARNING_FACTOR * largest:
    warnings.warn(f"batch_size={config.batch_size} is above the largest client's {largest} "
                  "examples: each local step computes the gradients of that many examples drawn "
                  f"with replacement, {config.batch_size / largest:.0f} times those of "
                  f"--batch-size {largest}", SizeWarning, stacklevel=2)
  own = ([] if on_round is None else [Callback(on_round)]) + list(observers)
  experiment = Experiment(setup.hparams, data, setup.sampler, config.seed, setup.accounting,
                          options.output_dir, recorded_config(config), config.to_dict(), own)
  return engine.run(setup.program, experiment, config.rounds,
                    options_for(config, setup.program, options))


def _configured(config: Optional[RunConfig], model, settings: dict) -> tuple:
  """``(config, model)``: ``config`` (default: the quickstart) with ``settings``, checked (a
  setting the algorithm does not read is refused), and a model name moved into it."""
  if isinstance(model, str):  # a name is a setting like any other (validated by RunConfig)
    settings, model = {**settings, "model": model}, None
  config = make_config(**settings) if config is None else (config.replace(**settings) if settings
                                                           else config)
  algorithms.refuse_unused(config, settings)
  check_devices(config.devices)
  return config, model


def check_from_config(options: RunOptions) -> None:
  """Refuses run options that set what a configuration sets (:data:`FROM_CONFIG`): a run built
  from a configuration takes those from it (:func:`options_for`)."""
  default = RunOptions()
  for name in FROM_CONFIG:
    check(getattr(options, name) == getattr(default, name), f"run_options.{name}",
          getattr(options, name), f"is a setting of the configuration: give {name}=... as a "
          "setting (or a field of the RunConfig) instead")


def options_for(config: RunConfig, program, options: Optional[RunOptions] = None) -> RunOptions:
  """``options`` (default: ``RunOptions()``) with the fields that are the configuration's
  settings (:data:`FROM_CONFIG`) taken from ``config``: its evaluation period, placement,
  devices, accounting workers, and the client blocks :func:`client_blocks` chooses for
  ``program`` (a :class:`fedjax_dp.round.Round`).

  Args:
    config: the run's configuration.
    program: the round that runs (its ``model`` and ``model_batch`` are read).
    options: the run options to complete; None: ``RunOptions()``.

  Returns:
    A new :class:`RunOptions` (``options`` is not changed).
  """
  return dataclasses.replace(
      options or RunOptions(), eval_every=config.eval_every, placement=config.placement,
      client_chunk=client_blocks(config, program.model, program.model_batch),
      devices=config.devices, accounting_workers=config.accounting_workers)


# Clients per block that the automatic choice aims at on one CPU device; over several CPU devices
# (fedjax-dp run --cpu-devices N), each device's share of it.
CPU_BLOCK = 4


def client_blocks(config: RunConfig, model: Model, model_batch: Optional[int] = None
                  ) -> Optional[int]:
  """Clients per vmapped block of the configuration's rounds (None: the whole cohort at once).

  ``client_chunk`` k >= 1 is k clients on each device, 0 the whole cohort. Unset (automatic):
  on accelerators, the whole cohort (what fills them); on one CPU device, blocks of about
  :data:`CPU_BLOCK` clients, which keep small models' weights and gradients in cache and skip
  the padded slots of a Poisson cohort (their capacity is set for a 1e-9 tail). A fixed-size
  cohort gets the block size in 2-6 that wastes the fewest padded slots (10 clients: 2 blocks
  of 5), a cohort of at most 4 clients one block. Over ``D`` CPU devices (each running on its
  own cores), blocks of ``CPU_BLOCK // D`` clients (at least 1) on each device, whose share of
  the cohort is ``M / D``. When one of ``model``'s layers runs by Winograd
  (:meth:`fedjax_dp.models.Model.conv_impls` at the configuration's batch size), blocks of one
  client: its tile transforms' intermediates slow every client down when several share a
  block. The choice depends on the configuration, its model and the platform only, so a
  sweep's experiment and its single run agree.

  Args:
    config: the run's configuration (``client_chunk``, ``devices``, ``sampling``,
      ``cohort_size`` and ``batch_size`` are read).
    model: the run's model.
    model_batch: the examples the clients apply the model to at once where fewer than the
      batch size (:attr:`fedjax_dp.round.Round.model_batch`; DP-SGD: one); None: the batch size.

  Returns:
    Clients per block on each device (``>= 1``), or None for the whole cohort in one vmap.

  Raises:
    ConfigError: ``config.devices`` is outside ``[1, the devices JAX sees]``.
  """
  if config.client_chunk is not None:
    return config.client_chunk or None
  if jax.default_backend() != "cpu":
    return None
  if "winograd" in model.conv_impls(model_batch or config.batch_size):
    return 1
  devices = check_devices(config.devices)
  target = max(1, CPU_BLOCK // devices)
  if config.sampling != "fixed":
    return target
  size = -(-config.cohort_size // devices)  # each device's share of the cohort
  if size <= target:
    return None
  if devices > 1:
    return target
  prefer = (CPU_BLOCK, 5, 3, 6, 2)
  return min(prefer, key=lambda k: (-(-size // k) * k, prefer.index(k)))


def recorded_config(config: RunConfig) -> dict:
  """The configuration as the summary records it, nested as the settings follow the algorithm
  (:func:`fedjax_dp.config.nest`): the settings the algorithm or the run's other settings leave
  unread (``cohort_size`` under Poisson sampling, ...) are left out (listed under ``not_used``)
  rather than recorded as if they applied, so the rest is a valid ``--config`` file; ``model``
  is the model's name (the data set's default when the configuration names none)."""
  d = dict(config.to_dict(), model=config.model_name)
  unused = algorithms.unused_fields(config) + sorted(algorithms.unread_by_settings(config))
  return dict(nest({k: v for k, v in d.items() if k not in unused}), not_used=unused)


def as_model(model, data):
  """A :class:`fedjax_dp.models.Model` from a flax module (shapes from ``data``, and whether it
  is multi-label: a module's logits are trained as the data's labels are) or a Model (a model's
  name goes in the configuration, :func:`simulate`)."""
  if isinstance(model, Model):
    return model
  check(isinstance(model, nn.Module), "model", type(model).__name__,
        "must be a model name, a flax.linen.Module or a fedjax_dp.models.Model")
  return Model(type(model).__name__, model, tuple(data.example_shape), int(data.num_classes),
               multi_label=bool(getattr(data, "multi_label", False)))


def custom_setup(rnd, hparams: Optional[dict], config: RunConfig, data):
  """The :class:`fedjax_dp.algorithms.Setup` of a hand-built round: sampler and accounting from
  the configuration, privacy from the round's pieces; with Byzantine clients (``hparams``'
  ``byzantine``) an attack that reads the regular rows reads their unreleased updates, which
  voids the guarantee (``attacker_knowledge: "omniscient"``), as in DP-FedAvg.

  Args:
    rnd: the hand-built :class:`fedjax_dp.round.Round`.
    hparams: the round's hyperparameters by name; ``server_lr`` (default 1), ``byzantine``
      (default 0) and ``expected_size`` (default the sampler's) are added where missing.
    config: the run's configuration (sampling, seed, delta and accountant are read).
    data: the federated data (its ``num_clients`` is read).

  Returns:
    The :class:`fedjax_dp.algorithms.Setup`: round, sampler, accounting and hyperparameters.

  Raises:
    ConfigError: ``hparams`` is None, or a bad sampling description.
  """
  check(hparams is not None, "hparams", hparams, "must be given with a hand-built round")
  sampler = make_sampler(config.sampling, data.num_clients, config.seed, config.sampling_prob,
                         config.cohort_size, config.capacity)
  hp = {"server_lr": 1.0, "byzantine": 0, "expected_size": sampler.expected_size, **hparams}
  hp = algorithms.as_hparams(hp)
  mechanism = user_level_mechanism(rnd, hp, config.sampling, config.sampling_prob,
                                   data.num_clients, config.cohort_size)
  knowledge = knowledge_of_unreleased(rnd.attack, int(hp["byzantine"]))
  return algorithms.Setup(rnd, sampler, LedgerAccounting(mechanism, config.delta, config.accountant,
                                                         attacker_knowledge=knowledge), hp)
