"""Command line: ``fedjax-dp run | sweep | privacy | reproduce | algorithms | audit | plot``.

Exit status: 0 done; 2 invalid input (one line naming the field, the value and
what is allowed, before anything is compiled or written), or a stdout that takes no
output (closed, a full disk: one line); 3 ``run`` finished
but diverged (a non-finite test loss); 4 out of memory (one line saying what to
lower); 130 interrupted (Ctrl-C), with one line saying what was kept; 141 the reader of
stdout went away (``| head``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import pathlib
import sys
import threading
import time
import types
import warnings
from typing import Optional, Sequence

from fedjax_dp import audit, components, interrupts, plots
from fedjax_dp.algorithms import choosing_knowledge, option_table, options, refuse_unused
from fedjax_dp.algorithms.options import describe
from fedjax_dp.checkpoint import check_extension, latest_round, read_meta
from fedjax_dp.config import (AGGREGATOR, ALGORITHM, ATTACK, RUN, block, check_finite,
                              check_noise_multiplier, field_help, field_types, load_config_file,
                              make_config, noise_warning, parse_option, parse_value)
from fedjax_dp.engine import RunOptions, check_checkpoint_release
from fedjax_dp.errors import (ConfigError, NoiseWarning, RunWarning, check, check_choice,
                              check_open_unit, closest)
from fedjax_dp.experiment import simulate
from fedjax_dp.jsonio import dumps
from fedjax_dp.models import METRIC_LABELS
from fedjax_dp.outputs import (METRICS, METRICS_CSV, RUN_FILES, SUMMARY, check_output_dir,
                               check_writable, claimed, replacing)
from fedjax_dp.paths import absolute
from fedjax_dp.privacy import (ACCOUNTANTS, CohortSampling, GaussianSumMechanism,
                               calibrate_noise_multiplier, epsilon_for)
from fedjax_dp.privacy.ledger import check_supported
from fedjax_dp.privacy.sign import SignFlipMechanism, _check_rdp, composed_epsilon
from fedjax_dp.reproduce import (REPRODUCTIONS, SAVED_CLAIMS, compare_reproductions,
                                 finished_a_run, own_files, render_reproduction, run_reproduction,
                                 scales)
from fedjax_dp.reproduce.runner import RESULT_FILES
from fedjax_dp.round import check_backend, use_cpu_devices
from fedjax_dp.sampling import SAMPLINGS
from fedjax_dp.sweep import Programs, check_axes, parse_grid, plan, sweep

EXIT_INVALID, EXIT_DIVERGED, EXIT_INTERRUPTED, EXIT_MEMORY = 2, 3, 130, 4
EXIT_BROKEN_PIPE = 141  # as a process killed by SIGPIPE: its reader went away
DEFAULT_RUN_DIR = "runs/quickstart"
# The commands that compute with JAX: they start its backend first (check_backend).
JAX_COMMANDS = ("run", "sweep", "reproduce", "audit")
PROGRESS_EVERY = 60.0  # seconds between the progress lines of --no-progress


class _Parser(argparse.ArgumentParser):
  """argparse that reports usage errors as ConfigError (one line, exit 2), suggesting for a
  misspelt flag the closest flag of the subcommand given."""

  def error(self, message):
    raise ConfigError("arguments", self.prog, message)

  def parse_args(self, args=None, namespace=None):
    parsed, unknown = self.parse_known_args(args, namespace)
    if unknown:
      chosen = self
      for action in self._actions:
        if isinstance(action, argparse._SubParsersAction):
          chosen = action.choices.get(getattr(parsed, action.dest, None), self)
      self.error(f"unrecognized arguments: {' '.join(unknown)}" + chosen.suggestions(unknown))
    return parsed

  def suggestions(self, words) -> str:
    """`` (--algoritm: did you mean --algorithm?)`` for each of ``words`` that is a flag close
    to one of this parser's; empty if none is."""
    hints = []
    for word in words:
      flag = word.split("=", 1)[0]
      close = closest(flag, sorted(self._option_string_actions)) if flag.startswith("--") else None
      hints += [] if close is None else [f"{flag}: did you mean {close}?"]
    return f" ({'; '.join(hints)})" if hints else ""


def _add_run(sub):
  p = sub.add_parser("run", help="run one simulation (no arguments: the offline quickstart)")
  p.add_argument("--output-dir", help="where metrics.jsonl, metrics.csv and summary.json go "
                 f"(default {DEFAULT_RUN_DIR}; with --resume, that folder)")
  p.add_argument("--overwrite", action="store_true", help="replace an earlier run's files in --output-dir")
  p.add_argument("--no-progress", action="store_true", help="no progress bar: a line on stderr "
                 f"every {PROGRESS_EVERY:g} s")
  _add_compilation_cache_flag(p)
  p.add_argument("--checkpoint-every", type=int, metavar="K",
                 help="save the whole run every K rounds and after the last into "
                 "OUTPUT_DIR/checkpoints/ (the last two kept), so that --resume can continue it "
                 "(default: none, no checkpoints)")
  p.add_argument("--resume", metavar="DIR",
                 help="continue the run in DIR from its latest checkpoint, with the configuration "
                 "stored there (a setting given that differs from it is refused); rounds written after "
                 "the checkpoint are recomputed; a larger --rounds extends a run whose "
                 "--noise-multiplier was given (one calibrated for --target-epsilon over its rounds "
                 "cannot be) (default: none, a new run)")
  p.add_argument("--release", choices=("all", "private"),
                 help="all (the default): also write raw diagnostics (realized cohort sizes, client losses, "
                 "pre-clip norms, timings) under 'diagnostics', with the mechanism's draws fixed by "
                 "--seed (recorded: secret, it reproduces the noise); private: write only what the "
                 "privacy guarantee covers and what is public by design, the mechanism's draws from "
                 "the operating system's entropy (not reproducible; no checkpoints)")
  _add_cpu_devices(p)
  p.add_argument("--tensorboard", action="store_true", default=None,
                 help="also write TensorBoard event files to OUTPUT_DIR/tensorboard/ (needs "
                 "tensorboardX: pip install 'fedjax_dp[tensorboard]'); with --release private only "
                 "the released values, no diagnostics; --resume continues as the run began")
  _add_wandb(p)
  _add_config_flags(p)


def _add_wandb(p):
  p.add_argument("--wandb", metavar="PROJECT",
                 help="also log the configuration and each round's values to a Weights & Biases "
                 "run in PROJECT, one per experiment (needs wandb: pip install "
                 "'fedjax_dp[wandb]'; wandb login, or WANDB_MODE=offline to write only local "
                 "files); with --release private only the released values, logged when the run "
                 "has finished, with no system metrics (default: none, no W&B)")


def _add_cpu_devices(p):
  p.add_argument("--cpu-devices", type=int, metavar="N",
                 help="split the CPU into N JAX devices (JAX's jax_num_cpu_devices, set before JAX "
                 "starts), over which the rounds split their clients as over N accelerators "
                 "(--devices): each core runs its own clients, which on a CPU is faster than one "
                 "device's matmuls shared by the cores; results equal the "
                 "one-device run's up to floating-point reassociation, not bit for bit; sweeps of "
                 "small models run faster on one device, in threads (default: 1, JAX's; an "
                 "integer >= 1; no effect where JAX runs on an accelerator)")


def _run_options(args) -> dict:
  """The run options of ``--no-progress`` (a bar, or without one a line every
  :data:`PROGRESS_EVERY` seconds) and ``--no-compilation-cache``."""
  return {"progress": not args.no_progress,
          "progress_every": PROGRESS_EVERY if args.no_progress else None,
          "compilation_cache": not args.no_compilation_cache}


def _add_compilation_cache_flag(p):
  p.add_argument("--no-compilation-cache", action="store_true", help="compile every program "
                 "anew, without JAX's persistent compilation cache (default: programs are kept in "
                 "$FEDJAX_DP_JAX_CACHE, else $XDG_CACHE_HOME/fedjax_dp/jax, and read back when "
                 "any later run compiles the same one; FEDJAX_DP_JAX_CACHE=off turns the cache "
                 "off for every command)")


def _add_config_flags(p):
  """``--config``, ``--set`` and one flag per :class:`RunConfig` field (run and sweep)."""
  p.add_argument("--config", metavar="FILE.json", help="JSON object of settings, nested as a "
                 "run's summary records them ({\"run\": {...}, \"algorithm\": {\"name\": ..., "
                 "its settings and options, \"aggregator\": {...}, \"attack\": {...}}}) or flat "
                 "(RunConfig fields, options under 'options'); the flags below override it "
                 "(default: none, the quickstart)")
  p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                 help="an option of the algorithm (repeatable), e.g. --set lambda=0.4; fedjax-dp "
                 "algorithms lists each algorithm's (default: none, the option's own default)")
  p.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                 help="a Python module (dotted name, importable from the current folder or "
                 "PYTHONPATH) to import first, whose components (attacks, aggregators, "
                 "algorithms declared with fedjax_dp.components.declare) the run may then name; "
                 "repeatable, recorded in the run's configuration as plugins; installed packages "
                 "declare theirs under the entry-point group fedjax_dp.plugins instead (default: "
                 "none)")
  groups = {RUN: p.add_argument_group("run settings (--config's run block)"),
            ALGORITHM: p.add_argument_group("algorithm settings (read by some algorithms)"),
            ATTACK: p.add_argument_group("Byzantine clients (the attack and aggregator blocks)")}
  groups[AGGREGATOR] = groups[ATTACK]
  for name, typ in field_types().items():
    if name not in ("options", "plugins"):
      groups[block(name)].add_argument("--" + name.replace("_", "-"), dest=name, default=None,
                                       metavar=typ.__name__.upper(), help=field_help(name))


def _add_sweep(sub):
  p = sub.add_parser("sweep", help="run a grid of settings x seeds, each group of experiments that "
                     "share one compiled round as one vmapped program; the base configuration comes "
                     "from the same flags as run (none: the quickstart)")
  p.add_argument("--grid", required=True, action="append", metavar="'NAME=V1,V2 ...'",
                 help="the grid: axes separated by spaces, values by commas; a name is a run flag "
                 "(clip, target_epsilon, noise_multiplier, local_steps, ...) or a --set option "
                 "(lambda, sparsity, ...), e.g. 'clip=0.1,0.3 lambda=0.1,0.4' (required; "
                 "repeatable: the axes of every --grid together, e.g. --grid clip=0.1,0.3 --grid "
                 "lambda=0.1,0.4)")
  p.add_argument("--seeds", type=int, default=1, help="seeds per grid point (default 1): the "
                 "configuration's seed, seed + 1, ...; they share one split of the data into "
                 "clients (--data-seed's, else --seed's), so that a row's epsilon over its seeds "
                 "is for the runs' own unit, unless --vary-split")
  p.add_argument("--vary-split", action="store_true", help="each seed splits the data into "
                 "clients by its own seed (refused beside --data-seed); a row's privacy over its "
                 "seeds is then for one example (see results.json's seeds_privacy_unit)")
  p.add_argument("--output-dir", required=True, help="where results.json, results.csv and each "
                 "experiment's "
                 "experiments/NNN/{metrics.jsonl,metrics.csv,summary.json} go (required)")
  p.add_argument("--overwrite", action="store_true", help="replace an earlier sweep's files")
  p.add_argument("--group-size", type=int, default=None, help="at most this many experiments "
                 "per compiled program (default: no limit; a smaller group needs less memory)")
  p.add_argument("--threads", type=int, default=None, help="compiled programs run at once, each "
                 "in its own thread; with fewer groups, each group runs in that many parts "
                 "(default: one per core, at most 8, on one CPU device; one elsewhere; an "
                 "integer >= 1)")
  p.add_argument("--no-progress", action="store_true", help="no progress bar (one for the whole "
                 f"sweep): a line on stderr every {PROGRESS_EVERY:g} s")
  _add_compilation_cache_flag(p)
  p.add_argument("--release", default="all", choices=("all", "private"),
                 help="as for run: private writes only what the guarantee covers and draws the "
                 "mechanism's randomness from the operating system's entropy (default: all)")
  _add_cpu_devices(p)
  _add_wandb(p)
  p.add_argument("--checkpoint-every", type=int, metavar="K",
                 help="refused: a sweep is not checkpointed (fedjax-dp run --checkpoint-every K "
                 "is) (default: none)")
  _add_config_flags(p)


def _add_privacy(sub):
  p = sub.add_parser("privacy", help="epsilon of a sampled Gaussian mechanism, or the noise for a target epsilon "
                     "(one JSON object; an infinite epsilon is written as null with epsilon_nonfinite)")
  p.add_argument("--mechanism", default="gaussian", help="gaussian: the sampled Gaussian sum; "
                 "sign-flip: DP-RSA's randomized signs (default: gaussian; one of: gaussian, "
                 "sign-flip)")
  p.add_argument("--keep-prob", type=float, help="sign-flip: keep probability gamma in (0.5, 1) "
                 "(default: none; needed with sign-flip)")
  p.add_argument("--dimension", type=int, help="sign-flip: coordinates released per round, the "
                 "model size d (default: none; needed with sign-flip)")
  p.add_argument("--sampling", help="gaussian: how each round's clients are drawn "
                 f"(default: none, i.e. poisson; one of: {', '.join(SAMPLINGS)})")
  p.add_argument("--sampling-prob", type=float, help="poisson: each client's probability per "
                 "round, in (0, 1] (default: none; needed with poisson)")
  p.add_argument("--num-clients", type=int, help="fixed: the population size N (default: none; "
                 "needed with fixed)")
  p.add_argument("--cohort-size", type=int, help="fixed: clients per round (default: none; "
                 "needed with fixed)")
  p.add_argument("--byzantine", type=int, help="fixed: Byzantine clients among the N, who know "
                 "when they are sampled, so a cohort's regular clients are accounted as M - K "
                 "of the N - byzantine, mixed over the K Byzantine clients sampled, as a run "
                 "with --byzantine is (default: none, i.e. 0; an integer in [0, N))")
  p.add_argument("--noise-multiplier", type=float, help="noise std / clip: report its epsilon "
                 "(default: none; give exactly one of this and --target-epsilon)")
  p.add_argument("--target-epsilon", type=float, help="report the noise multiplier that reaches "
                 "this epsilon (default: none; give exactly one of this and --noise-multiplier)")
  p.add_argument("--rounds", type=int, required=True, help="number of rounds (required)")
  p.add_argument("--delta", type=float, required=True, help="delta, in (0, 1) (required)")
  p.add_argument("--accountant", default="rdp",
                 help="dp_accounting's accountant; sign-flip is accounted with rdp only "
                 f"(default: rdp; one of: {', '.join(ACCOUNTANTS)})")


def _add_algorithms(sub):
  p = sub.add_parser("algorithms", help="list every algorithm with its paper, privacy unit and "
                     "--set options (name, default, allowed values, meaning)")
  p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
  p.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                 help="also list the components this Python module declares (repeatable; as "
                 "for run) (default: none)")


def _cmd_algorithms(args) -> int:
  components.load_plugins(args.plugin)
  declared = components.declared("algorithm")
  out = {a.name: {"paper": a.reference, "about": a.about, "privacy_unit": a["privacy_unit"],
                  "defaults": dict(a["defaults"]), "options": describe(option_table(a.name))}
         for a in declared}
  if args.json:
    print(dumps(out))
    return 0
  common = {o.name for o in options.byzantine()}

  def show(opts, indent="  "):
    for o in opts:
      print(f"{indent}--set {o['name']}=VALUE  (default {o['default']}; {o['allowed']}): "
            f"{o['help']}")

  for name, info in out.items():
    print(f"{name}: {info['paper']}\n  {info['about']}\n  privacy unit: {info['privacy_unit']}")
    if info["defaults"]:
      print("  its defaults: " + " ".join(f"--{k.replace('_', '-')} {v}"
                                          for k, v in info["defaults"].items()))
    show([o for o in info["options"] if o["name"] not in common])
  alone = sorted(a.name for a in declared if not a["byzantine"])
  print(f"every algorithm but {', '.join(alone)} also takes --byzantine K "
        f"--attack NAME --aggregator NAME ({', '.join(choosing_knowledge())} also "
        "--attacker-knowledge released|omniscient), each with its own --set options:")
  for kind in options.BYZANTINE_KINDS:
    for c in components.declared(kind):
      reference = f" ({c.reference})" if c.reference else ""
      print(f"  --{kind} {c.name}: {c.about}{reference}")
      show(describe(c.options), indent="    ")
  return 0


def _add_reproduce(sub):
  listing = "\n".join(f"  {paper} --scale {name}: {about}" for paper in sorted(REPRODUCTIONS)
                       for name, about in scales(paper).items())
  p = sub.add_parser("reproduce", help="reproduce a paper's experiments at a given scale",
                     description="Reproduce a paper's experiments at a given scale.",
                     epilog="papers and their scales:\n" + listing,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("paper", help=f"the paper (one of: {', '.join(sorted(REPRODUCTIONS))})")
  p.add_argument("--scale", help="how large a run (default: none, i.e. small, or with --resume "
                 "the resumed reproduction's; each paper's scales are listed below)")
  p.add_argument("--output-dir", help="where results.json, results.md and runs.jsonl go "
                 "(required, default: none; with --resume, leave it out: DIR is the folder)")
  p.add_argument("--overwrite", action="store_true",
                 help="replace an earlier reproduction's results in --output-dir")
  p.add_argument("--resume", metavar="DIR",
                 help="continue the interrupted reproduction in DIR (Ctrl-C, SIGTERM, a killed "
                 "process) with the scale, seeds and data folder it began with, recorded in "
                 "DIR/reproduction.json (one given that differs is refused; --threads may "
                 "differ): the runs whose records DIR/runs.jsonl holds are not run again, the "
                 "others run, and the results are written from every record as the "
                 "reproduction uninterrupted would have written them; a finished one is left "
                 "as it was (default: none, a new reproduction)")
  p.add_argument("--data-dir", help="folder holding the data files (default: none, the "
                 "FEDJAX_DP_DATA environment variable, or with --resume the resumed "
                 "reproduction's)")
  p.add_argument("--seeds", type=int, help="seeds per setting (default: none, the scale's own, or "
                 "with --resume the resumed reproduction's)")
  p.add_argument("--threads", type=int, default=None, help="compiled programs run at once, as "
                 "for sweep (default: one per core, at most 8, on one CPU device; one elsewhere; "
                 "an integer >= 1; each thread's program holds its own working memory)")
  p.add_argument("--render", action="store_true",
                 help="run nothing: rewrite results.md and the figures in --output-dir from "
                 "its results.json and runs.jsonl (an earlier reproduction of the same paper)")
  p.add_argument("--compare", nargs="+", metavar="DIR",
                 help="run nothing: print a Markdown table of the paper's claims at the scales of "
                 "the finished reproductions in two or more folders (the smallest first), each "
                 "folder's value and verdict as its results.md shows them, and whether the "
                 "verdict changed from the first folder to the last, then each setting's "
                 "accuracy at every scale (default: none; papers: "
                 f"{', '.join(sorted(SAVED_CLAIMS))})")


def _parse_options(items) -> dict:
  out = {}
  for item in items:
    check("=" in item, "--set", item, "must look like NAME=VALUE")
    k, v = item.split("=", 1)
    check(k not in out, "--set", item, f"sets {k} a second time (first {k}={out.get(k)!r}): "
          "give each option once")
    out[k] = parse_option(v, k)
  return out


def _settings(args) -> tuple:
  """What ``--config``, the field flags and ``--set`` give: ``(base, overrides, options)``."""
  base = load_config_file(args.config) if args.config else {}
  types = field_types()
  overrides = {}
  for name, typ in types.items():
    text = getattr(args, name, None)
    if name not in ("options", "plugins") and text is not None:
      overrides[name] = parse_value(name, text, typ)
  if args.plugin:  # added to a --config file's
    overrides["plugins"] = tuple(dict.fromkeys([*base.get("plugins", ()), *args.plugin]))
  options = dict(base.pop("options", {}) or {})
  options.update(_parse_options(args.set))
  return base, overrides, options


def _config_from_args(args, grid: Optional[dict] = None, seeds: int = 1,
                      vary_split: bool = False):
  """The :class:`RunConfig` of ``--config``, the field flags and ``--set``; a setting given that
  the algorithm does not read is refused. ``grid`` (a sweep's): a flag or ``--set`` option that
  is also an axis is refused (a ``--config`` file's value is the base the axis varies), a field
  that only its axis gives takes the axis's first value (each experiment sets its own), and a
  setting given is refused only when no grid point reads it; the plan of ``grid`` x ``seeds``
  (``vary_split``: each seed on its own split) refuses bad axes, values and seeds, and an axis
  that a point does not read
  (:func:`fedjax_dp.sweep.plan`), before any folder is touched."""
  base, overrides, options = _settings(args)
  # A flag or --set beside an axis of the same name would be replaced in every experiment.
  flags = {**overrides, **options}
  twice = sorted(set(grid or {}) & set(flags))
  check(not twice, twice[0] if twice else "grid", flags.get(twice[0]) if twice else None,
        "is also a grid axis, whose values replace it in every experiment: give it in the grid "
        "only")
  types = field_types()
  for name, values in (grid or {}).items():
    if name in types and name not in base and name not in overrides:
      overrides[name] = parse_value(name, values[0], types[name])
  # Setting one of noise_multiplier / target_epsilon unsets the other's default.
  for given, other in (("target_epsilon", "noise_multiplier"), ("noise_multiplier", "target_epsilon")):
    if (given in overrides or given in base) and other not in overrides and other not in base:
      overrides[other] = None
  given = set(base) | {k for k, v in overrides.items() if v is not None}
  config = make_config(base, options=options, **overrides)
  if grid:  # a setting given beside the grid is refused only where no grid point reads it
    refuse_unused(config, given - set(grid), [p.config for p in plan(config, grid, seeds,
                                                                           vary_split)])
  else:
    refuse_unused(config, given)
  return config


def _show_warning(python_show, message, category, *args, **kwargs):
  """Warnings the library gives the user (:class:`fedjax_dp.errors.RunWarning`) as one line on
  stderr; others as Python shows them (``python_show``)."""
  if issubclass(category, RunWarning):
    print(f"fedjax-dp: warning: {message}", file=sys.stderr)
  else:
    python_show(message, category, *args, **kwargs)


def _check_resume_folder(args, what: str) -> None:
  """``--resume DIR`` continues the ``what`` (run, reproduction) in DIR: ``--overwrite`` and an
  ``--output-dir`` other than DIR are refused."""
  check(not args.overwrite, "overwrite", True, "cannot be combined with --resume, which continues "
        f"the {what} in its folder")
  check(args.output_dir is None or absolute(args.output_dir).resolve()
        == absolute(args.resume, "resume").resolve(), "output_dir", args.output_dir,
        f"must be left out with --resume (the {what}'s folder is {args.resume})")


def _resumed(args) -> tuple:
  """``(config, release, tensorboard, rounds done)`` of the run ``--resume`` names, from its
  latest checkpoint; a setting given (flag, ``--config``, ``--set``) that differs from the stored
  one is refused, but for more ``rounds`` where the run can be extended
  (:func:`fedjax_dp.checkpoint.check_extension`)."""
  _check_resume_folder(args, "run")
  meta = read_meta(args.resume)
  normal = lambda x: json.loads(json.dumps(x))
  stored, where = meta["config"], f"stored in {pathlib.Path(args.resume) / 'checkpoints'}"
  config = make_config(stored)

  def effective(c):  # a run without a model ran its data set's (summary.json's config.model)
    return normal(dict(c.to_dict(), model=c.model_name))
  base, overrides, options = _settings(args)
  given = {**base, **overrides}
  if "rounds" in given:  # more rounds extend the run where no round it released changes
    config = config.replace(rounds=given.pop("rounds"))
    check_extension(stored, config.rounds, where)
  # Compared with the stored configuration as it loads (a field added since it was written takes
  # its default), so that repeating a stored setting is never a conflict.
  loaded = effective(config)
  for name, value in given.items():
    try:
      same = effective(config.replace(**{name: value})) == loaded
    except ConfigError:
      same = False
    check(same, name, value, f"conflicts with the resumed run's {name}={loaded.get(name)!r} "
          f"({where}): leave it out to continue that run")
  # An option the run left unset ran with its default: repeating that default is no conflict.
  defaults = {o.name: o.default for o in option_table(config.algorithm)}
  known = sorted(defaults)
  for name, value in options.items():
    check(name in known, name, value, f"is not an option of the resumed run's algorithm "
          f"{config.algorithm!r} (its options: {', '.join(known)})")
    used = normal(stored.get("options", {}).get(name, defaults[name]))
    check(normal(value) == used, name, value, "conflicts with the resumed run's option "
          f"{name}={used!r} ({where}): leave it out")
  check(args.release in (None, meta["release"]), "release", args.release,
        f"conflicts with the resumed run's release={meta['release']!r}: leave it out")
  tensorboard = meta.get("tensorboard", bool(args.tensorboard))  # older checkpoints: as given
  check(args.tensorboard in (None, tensorboard), "tensorboard", args.tensorboard,
        "conflicts with the resumed run, which wrote no TensorBoard events (a resume writes "
        "those of every round or of none): leave it out")
  return config, meta["release"], tensorboard, meta["round"]


def _finished_summary(path: pathlib.Path) -> dict:
  """The summary of a finished run that ``--resume`` names, checked to hold what :func:`_report`
  prints; :class:`ConfigError` naming the file when it is not JSON or lacks it (damaged)."""
  number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
  try:
    s, why = json.loads(path.read_bytes()), None
  except (OSError, ValueError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
    s, why = None, f"{type(e).__name__}: {str(e)[:120]}"
  if why is None:
    if not isinstance(s, dict):
      why = f"a JSON {type(s).__name__}, not an object"
    else:
      bad = [k for k, ok in (("final_accuracy", number(s.get("final_accuracy"))),
                             ("rounds", number(s.get("rounds"))),
                             ("diverged", isinstance(s.get("diverged"), bool)),
                             ("epsilon", s.get("epsilon") is None or number(s.get("epsilon"))),
                             ("delta", s.get("epsilon") is None or number(s.get("delta"))),
                             ("noise_multiplier", s.get("noise_multiplier") is None
                              or number(s.get("noise_multiplier"))),
                             ("diagnostics", isinstance(s.get("diagnostics") or {}, dict)),
                             ("release", isinstance(s.get("release") or {}, dict))) if not ok]
      why = f"lacks a valid {', '.join(bad)}" if bad else None
  check(why is None, "resume", str(path), f"is not a finished run's summary ({why}): it was "
        "changed or damaged; remove it and run --resume again to write it from the run's last "
        "checkpoint")
  return s


def _cmd_run(args) -> int:
  check(args.checkpoint_every is None or args.checkpoint_every >= 1, "checkpoint_every",
        args.checkpoint_every, "must be an integer >= 1")
  check_checkpoint_release(args.release or "all", args.checkpoint_every)
  if args.resume is not None:
    config, release, tensorboard, done = _resumed(args)
    out = check_writable(args.resume)
    if done >= config.rounds and (out / SUMMARY).is_file():  # finished: nothing to redo or rewrite
      s = _finished_summary(out / SUMMARY)
      print(f"{out} holds a finished run: nothing to resume, its files are as they were")
      return _report(s, config, (s.get("diagnostics") or {}).get("seconds_total"), out,
                     wrote=False)
  else:
    config, release, done = _config_from_args(args), args.release or "all", 0
    tensorboard = bool(args.tensorboard)
    out = check_output_dir(DEFAULT_RUN_DIR if args.output_dir is None else args.output_dir,
                           overwrite=args.overwrite)
  rounds = []
  before = _run_files(out) if args.resume is None else None
  t0 = time.perf_counter()
  try:  # simulate checks the device count, then loads the data set
    result = simulate(config, output_dir=str(out), **_run_options(args),
                      release=release,
                      on_round=lambda record: (rounds.append(record), _stop_if_signalled()),
                      tensorboard=tensorboard, wandb=args.wandb,
                      checkpoint_every=args.checkpoint_every,
                      resume=args.resume is not None, overwrite=args.overwrite)
  except KeyboardInterrupt:
    kept = done + len(rounds)
    changed = bool(kept) or _run_files(out) != before
    if changed and not kept and (out / METRICS).is_file():
      # Interrupted after the first round's row was written, before the run was told of it.
      kept = (out / METRICS).read_bytes().count(b"\n")
    saved = latest_round(out) if kept else None
    if saved is not None:
      what = (f"{kept} rounds kept in {out / METRICS}, no {SUMMARY}; continue from the checkpoint "
              f"of round {saved} with: fedjax-dp run --resume {out}")
    elif kept:
      what = (f"{kept} rounds kept in {out / METRICS}, no {SUMMARY}; rerun with --overwrite to "
              "start again")
    elif changed:
      began = (f"removing the earlier run's files from {out}" if before
               else f"beginning to write {out}")
      what = (f"in the first round, after {began}: no round kept, no {SUMMARY}; rerun with "
              "--overwrite to start again")
    else:
      what = f"before the first round: {out} is as it was"
    print(f"fedjax-dp: interrupted: {what}", file=sys.stderr)
    return EXIT_INTERRUPTED
  return _report(result.summary, config, time.perf_counter() - t0, out)


def _run_files(folder: pathlib.Path) -> Optional[dict]:
  """What a run may change in ``folder``: each of its files and folders
  (:data:`fedjax_dp.outputs.RUN_FILES`) there, with its kind, size, modification time and
  inode; None when ``folder`` does not exist. Taken before a run and after it is interrupted:
  whether it changed the folder (an ``--overwrite`` removes the earlier run's files, folders
  whole, when it writes its first row, and only then writes into them)."""
  if not folder.is_dir():
    return None
  found = {}
  for name in RUN_FILES:
    try:
      st = (folder / name).lstat()
    except OSError:
      continue
    found[name] = (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino)
  return found


def _report(s: dict, config, seconds: Optional[float], out: pathlib.Path,
            wrote: bool = True) -> int:
  """Prints a run's final line from its summary ``s`` (and, if ``wrote``, the files written);
  the exit status."""
  eps = s.get("epsilon")
  eps_text = (f"epsilon={eps:.3f} at delta={s['delta']:g}" if eps is not None
              else f"no formal DP guarantee ({s.get('guarantee_note')})")
  acc = s["final_accuracy"]
  # A multi-label model's headline is its recall at 5 (the summary's accuracy_metric).
  metric = METRIC_LABELS.get(s.get("accuracy_metric"), "accuracy")
  diverged = "diverged (non-finite test loss)  " if s["diverged"] else ""
  # The wall time follows the realized cohorts (blocks of absent clients are skipped): a raw
  # diagnostic, which a private run keeps out of what it prints, as out of what it writes.
  private = (s.get("release") or {}).get("mode") == "private"
  took = "" if seconds is None or private else f"  seconds={seconds:.1f}"
  print(f"final test {metric}={acc:.4f}  {diverged}{eps_text}  rounds={s['rounds']}{took}")
  if wrote:
    print(f"wrote {out / METRICS}, {out / METRICS_CSV} and {out / SUMMARY}")
  return EXIT_DIVERGED if s["diverged"] else 0


def _cmd_privacy(args) -> int:
  """Prints one strict-JSON object: the epsilon of a mechanism, or the noise for a target epsilon."""
  print(dumps(_privacy_report(args)))
  return 0


def _privacy_report(args) -> dict:
  import math
  for name in ("keep_prob", "sampling_prob", "noise_multiplier", "target_epsilon", "delta"):
    # argparse's float() accepts "inf" and "nan": refused before any computation.
    check_finite(name, getattr(args, name))
  check_noise_multiplier(args.noise_multiplier)
  check_choice("mechanism", args.mechanism, ("gaussian", "sign-flip"))
  check_choice("accountant", args.accountant, ACCOUNTANTS)
  if args.mechanism == "gaussian":  # before the flags it decides are checked against it
    args.sampling = args.sampling or "poisson"
    check_choice("sampling", args.sampling, SAMPLINGS)
  # A flag the chosen mechanism and sampling do not read is refused, not ignored.
  reads = ({"keep_prob", "dimension"} if args.mechanism == "sign-flip" else
           {"noise_multiplier", "target_epsilon", "sampling"}
           | ({"sampling_prob"} if args.sampling == "poisson"
              else {"num_clients", "cohort_size", "byzantine"}))
  for name in ("keep_prob", "dimension", "sampling", "sampling_prob", "num_clients",
               "cohort_size", "byzantine", "noise_multiplier", "target_epsilon"):
    check(name in reads or getattr(args, name) is None, name, getattr(args, name),
          f"is not used with --mechanism {args.mechanism}"
          + ("" if args.mechanism == "sign-flip" else f" --sampling {args.sampling}")
          + ": leave it out")
  if args.mechanism == "sign-flip":
    _check_rdp(args.accountant)
    check(args.keep_prob is not None and 0.5 < args.keep_prob < 1, "keep_prob", args.keep_prob, "must be in (0.5, 1)")
    check(args.dimension is not None and args.dimension >= 1, "dimension", args.dimension, "must be >= 1")
    return {"mechanism": "sign-flip", "keep_prob": args.keep_prob, **composed_epsilon(
        SignFlipMechanism(args.keep_prob, args.dimension), args.rounds, args.delta)}
  check(args.rounds >= 1, "rounds", args.rounds, "must be >= 1")
  check_open_unit("delta", args.delta)
  check((args.noise_multiplier is None) != (args.target_epsilon is None), "noise_multiplier/target_epsilon",
        (args.noise_multiplier, args.target_epsilon), "give exactly one of --noise-multiplier and --target-epsilon")
  cohorts = CohortSampling(args.sampling, args.sampling_prob, args.num_clients, args.cohort_size,
                           args.byzantine or 0)
  out = {"sampling": args.sampling, "rounds": args.rounds, "delta": args.delta, "accountant": args.accountant}
  if args.target_epsilon is not None:
    z = calibrate_noise_multiplier(args.target_epsilon, args.delta, args.rounds, cohorts,
                                   args.accountant)
    out.update(target_epsilon=args.target_epsilon, noise_multiplier=z)
    warning = noise_warning(z, f"calibrated for target_epsilon={args.target_epsilon:g}")
    if warning is not None:  # one line on stderr, as a run's (_show_warning)
      warnings.warn(warning, NoiseWarning, stacklevel=2)
  else:
    z = args.noise_multiplier
    out["noise_multiplier"] = z
  mech = GaussianSumMechanism(1.0, z, **dataclasses.asdict(cohorts))
  event = mech.round_event()
  check_supported(event, args.accountant, mech.relation)
  eps = epsilon_for(event, args.rounds, args.delta, args.accountant, mech.relation)
  out["epsilon"] = eps  # written as null with "epsilon_nonfinite" beside it when infinite
  out["formal_guarantee"] = math.isfinite(eps)
  if math.isfinite(eps) or z == 0:
    out["guarantee_note"] = mech.guarantee_note
  else:
    out["guarantee_note"] = (f"epsilon is infinite at delta={args.delta:g}: no formal differential privacy "
                             "guarantee")
  out["neighbouring_relation"] = mech.relation
  out["dp_event"] = repr(event)
  return out


def _cmd_sweep(args) -> int:
  check(args.checkpoint_every is None, "checkpoint_every", args.checkpoint_every,
        "a sweep is not checkpointed (its experiments run as one vmapped program): run an "
        "experiment alone with fedjax-dp run --checkpoint-every K")
  grid = parse_grid(*args.grid)
  check_axes(grid)
  # Planned: bad axes refused before the folder.
  config = _config_from_args(args, grid, args.seeds, args.vary_split)
  out = pathlib.Path(args.output_dir)
  try:
    options = RunOptions(output_dir=str(out), overwrite=args.overwrite, release=args.release,
                         wandb=args.wandb, **_run_options(args))
    result = sweep(config, grid, args.seeds, run_options=options,
                   programs=Programs(args.group_size, args.threads),
                   log=lambda line: print(line, file=sys.stderr),
                   vary_split=args.vary_split)
  except KeyboardInterrupt:  # sweep() removed its partial files and put earlier ones back
    print(f"fedjax-dp: interrupted: {out} is as it was (a sweep is written whole or not at "
          "all; run it again)", file=sys.stderr)
    return EXIT_INTERRUPTED
  for row in result.rows:
    values = " ".join(f"{k}={row['grid'][k]}" for k in grid)
    eps = row["epsilon"]
    std = row["accuracy_std"]
    spread = "" if std is None else f" ± {std:.4f}"
    both = row["epsilon_seeds_composed"]
    seeds = ("" if eps is None or row["seeds"] == 1 else
             " (all seeds: no bound, see seeds_composition)" if both is None else
             f" (all seeds: {both:.3f} at delta {row['delta_seeds_composed']:.3g}, "
             f"{row['seeds_composition']}"
             + ("" if row["seeds_privacy_unit"] == "the runs' own" else ", per example") + ")")
    metric = METRIC_LABELS.get(row.get("accuracy_metric"), "accuracy")
    print(f"{values}: {metric}={row['accuracy_mean']:.4f}{spread} "
          f"({row['seeds']} seed{'' if row['seeds'] == 1 else 's'})  "
          f"epsilon={'none' if eps is None else format(eps, '.3f')}"
          f"{seeds}")
  threads = "1 thread" if result.threads == 1 else f"{result.threads} threads"
  took = "" if args.release == "private" else f", {result.seconds:.1f}s"  # raw, as in _report
  print(f"{len(result.experiments)} experiments in {len(result.groups)} compiled programs "
        f"({threads}){took}; wrote {out / 'results.json'} and {out / 'results.csv'}")
  return 0


def _cmd_reproduce(args) -> int:
  check_choice("paper", args.paper, sorted(REPRODUCTIONS))
  if args.compare is not None:  # it runs nothing and writes nothing: a run's setting is ignored
    for flag in ("scale", "seeds", "threads", "data_dir", "overwrite", "resume", "render",
                 "output_dir"):
      check(getattr(args, flag) in (None, False), flag, getattr(args, flag),
            "is not read by --compare, which runs and writes nothing (it prints the verdicts of "
            "the finished reproductions in its folders): leave it out")
    print(compare_reproductions(args.paper, args.compare), end="")
    return 0
  if args.render:  # it runs nothing: a setting of a run would be ignored
    for flag in ("scale", "seeds", "threads", "data_dir", "overwrite", "resume"):
      check(getattr(args, flag) in (None, False), flag, getattr(args, flag),
            "is not read by --render, which runs nothing (it rewrites results.md and the "
            "figures from the saved results): leave it out")
  if args.resume is not None:
    _check_resume_folder(args, "reproduction")
    with claimed(args.resume, overwrite=False, resume=True) as out:
      return _reproduce_into(args, check_writable(out, "resume"), resume=True)
  check(args.output_dir is not None, "output_dir", None, "is required: the folder the "
        "reproduction writes (or --resume DIR, to continue the one in DIR)")
  if args.render:
    return render_reproduction(args.paper, args.output_dir)
  with claimed(args.output_dir, overwrite=args.overwrite, results=RESULT_FILES) as out:
    return _reproduce_into(args, out, resume=False)


def _reproduce_into(args, out: pathlib.Path, resume: bool) -> int:
  """``fedjax-dp reproduce`` into its checked folder ``out``, this process's: the earlier
  reproduction's files replaced by the new one's, or (``resume``) the reproduction there
  continued."""
  # Earlier results come back if the run fails before writing any (a bad scale or seeds, which
  # the reproduction checks first, or missing data); its figures and runs go with them.
  outcome = None
  try:
    # The earlier reproduction is replaced once the new one has finished a run (its runs/
    # folder and runs.jsonl exist from the start); a resumed one is continued where it is.
    with (contextlib.nullcontext(types.SimpleNamespace(restored=False)) if resume else
          replacing(out, own_files(args.paper, out), started=finished_a_run)) as outcome:
      return run_reproduction(args.paper, scale=args.scale,
                              output_dir=args.resume if resume else args.output_dir,
                              data_dir=args.data_dir, seeds=args.seeds, threads=args.threads,
                              resume=resume)
  except KeyboardInterrupt:
    if outcome is None or outcome.restored:
      what = f"no run finished: {out} is as it was"
    else:  # it began: runs.jsonl holds its finished runs
      runs = out / "runs.jsonl"
      kept = runs.read_bytes().count(b"\n") if runs.is_file() else 0
      what = (f"{kept} finished run{'' if kept == 1 else 's'} kept in {runs}; continue the "
              f"reproduction with: fedjax-dp reproduce {args.paper} --resume {out}")
    print(f"fedjax-dp: interrupted: {what}", file=sys.stderr)
    return EXIT_INTERRUPTED


def build_parser() -> argparse.ArgumentParser:
  """The ``fedjax-dp`` parser: each subcommand's flags, each with its meaning and default."""
  parser = _Parser(prog="fedjax-dp", formatter_class=argparse.RawDescriptionHelpFormatter,
                   description="Simulate federated learning with differential privacy and "
                   "Byzantine clients in JAX.",
                   epilog="fedjax-dp SUBCOMMAND --help: that subcommand's flags; no arguments: "
                   "the offline quickstart\n(DP-FedAvg on digits). Examples:\n"
                   "  fedjax-dp run --rounds 20 --target-epsilon 4 --output-dir runs/x\n"
                   "  fedjax-dp sweep --grid 'clip=0.1,0.3' --seeds 2 --output-dir runs/s\n"
                   "  fedjax-dp privacy --sampling-prob 0.01 --noise-multiplier 1.1 --rounds 100 "
                   "--delta 1e-5\n"
                   "  fedjax-dp reproduce cheng2022 --scale tiny --output-dir runs/r\n"
                   "exit status: 0 done; 2 invalid input (one line naming the field) or a stdout "
                   "that takes no output; 3 run "
                   "diverged; 4 out of memory; 130 interrupted; 141 stdout's reader went away")
  sub = parser.add_subparsers(dest="command", parser_class=_Parser, title="subcommands",
                              metavar="SUBCOMMAND")
  _add_run(sub)
  _add_sweep(sub)
  _add_privacy(sub)
  _add_reproduce(sub)
  _add_algorithms(sub)
  audit.add_parser(sub)
  plots.add_parser(sub)
  return parser


# Set by Ctrl-C or SIGTERM: a KeyboardInterrupt raised where Python swallows it (a finalizer, a
# garbage-collection callback: "Exception ignored in ...") still stops a run at its next round.
_SIGNALLED = threading.Event()


def _interrupt(signum, frame):
  """Ctrl-C and SIGTERM (a scheduler's stop) end a command alike: one line saying what was
  kept."""
  del signum, frame
  _SIGNALLED.set()
  raise KeyboardInterrupt


def _stop_if_signalled() -> None:
  """After each round's record: an interrupt that was swallowed stops the run here."""
  if _SIGNALLED.is_set():
    raise KeyboardInterrupt


class _OutputLost(Exception):
  """stdout took no more of the command's output: ``error`` is the OSError that its write or
  flush raised."""

  def __init__(self, error: OSError):
    super().__init__(error)
    self.error = error


class _Stdout:
  """``sys.stdout`` while :func:`main` runs a command: writes and flushes go to ``stream``, and
  an OSError there (a reader that went away, a full disk) becomes :class:`_OutputLost`, so that
  :func:`_main` reports that stdout failed, and an OSError of any other file is never taken for
  it. Everything else is ``stream``'s."""

  def __init__(self, stream):
    self._stream = stream

  def write(self, text: str) -> int:
    try:
      return self._stream.write(text)
    except OSError as e:
      raise _OutputLost(e) from e

  def flush(self) -> None:
    try:
      self._stream.flush()
    except OSError as e:
      raise _OutputLost(e) from e

  def __getattr__(self, name):
    return getattr(self._stream, name)


def main(argv: Optional[Sequence[str]] = None) -> int:
  """Runs ``fedjax-dp`` with ``argv`` (default: the process's arguments); the exit status (the
  module docstring's). Every outcome but a bug ends in a status and at most one line on stderr:
  output that stdout does not take (closed, a full disk) included."""
  argv = list(sys.argv[1:] if argv is None else argv)
  _SIGNALLED.clear()
  stdout = sys.stdout  # None where the process started with stdout closed (>&-)
  sys.stdout = None if stdout is None else _Stdout(stdout)
  try:
    with interrupts.handling(_interrupt), warnings.catch_warnings():
      warnings.showwarning = functools.partial(_show_warning, warnings.showwarning)
      return _main(argv)
  finally:
    sys.stdout = stdout


def _main(argv: list) -> int:
  try:
    check(sys.stdout is not None, "stdout", "closed", "takes no output (the command started "
          "with it closed, >&-): what the command prints would be lost; point it at a file, or "
          "at /dev/null to discard it")
    parser = build_parser()
    if not argv:
      argv = ["run"]
    args = parser.parse_args(argv)
    use_cpu_devices(getattr(args, "cpu_devices", None))
    if args.command in JAX_COMMANDS and not getattr(args, "compare", None):
      check_backend()  # --compare computes nothing: the accelerator is left to the runs
    cmd = {"run": _cmd_run, "sweep": _cmd_sweep, "privacy": _cmd_privacy, "reproduce": _cmd_reproduce,
           "algorithms": _cmd_algorithms, "audit": audit.command, "plot": plots.command}[args.command]
    status = cmd(args)
    sys.stdout.flush()  # what is still buffered is the command's output too
    return status
  except ConfigError as e:
    print("\\n".join(f"fedjax-dp: error: {e}".splitlines()), file=sys.stderr)  # one line, always
    return EXIT_INVALID
  except KeyboardInterrupt:
    print("fedjax-dp: interrupted", file=sys.stderr)
    return EXIT_INTERRUPTED
  except _OutputLost as e:
    # Python flushes stdout at exit: pointed at /dev/null, that flush cannot fail again.
    with contextlib.suppress(AttributeError, OSError, ValueError):
      os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if isinstance(e.error, BrokenPipeError):  # the reader (`| head`) went away: nothing to say
      # The command stopped where it could no longer write, so its status is a broken pipe's
      # (128 + SIGPIPE), not success: a run or reproduction may have stopped half way.
      return EXIT_BROKEN_PIPE
    print(f"fedjax-dp: error: stdout takes no more output ({e.error.strerror or e.error}): the "
          "command's output is lost, all or part of it; point stdout at a file that can be "
          "written, or at /dev/null to discard it", file=sys.stderr)
    return EXIT_INVALID
  except Exception as e:  # pylint: disable=broad-except
    if "RESOURCE_EXHAUSTED" not in str(e):
      raise
    detail = next((l.strip() for l in str(e).splitlines() if "RESOURCE_EXHAUSTED" in l), "")
    print(f"fedjax-dp: error: out of memory ({detail[:160]}): the round needs more than the "
          "device holds; lower batch_size, local_steps or the cohort (sampling_prob, cohort_size), "
          "or run it in blocks of clients (--client-chunk K)", file=sys.stderr)
    return EXIT_MEMORY


if __name__ == "__main__":
  sys.exit(main())
