"""Seconds per round of the vmapped engine against two baselines, measured in one run.

* engine: one jitted round (vmap over clients, lax.scan over local steps).
* loop: a Python loop over the cohort calling the same jitted client update,
  then the same aggregation and server step (jitted).
* centralized: the same number of examples and steps as one model on one batch
  of ``clients * batch`` examples per step (the hardware-limit proxy).

Inputs are random arrays of the model's input shape (speed does not depend on
pixel values); each client holds ``--examples`` examples.

Example:
  python benchmarks/round_speed.py --model cnn2 --clients 10 --local-steps 30 --json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import resource
import statistics
import subprocess
import sys
import time
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_dp.algorithms.dp_fedavg import build_dp_fedavg
from fedjax_dp.round import (CohortBatch, client_keys, compiled_step, mask_rows, server_update,
                             use_cpu_devices)
from fedjax_dp.config import make_config
from fedjax_dp.data import FederatedData
from fedjax_dp.experiment import client_blocks
from fedjax_dp.models import COMPUTE_DTYPES, CONV_IMPLS
from fedjax_dp.objectives import supervised

SHAPES = {"cnn2": ((28, 28, 1), 62), "mlp": ((28, 28, 1), 10), "digits_cnn": ((8, 8, 1), 10),
          "rsa_mlp": ((28, 28, 1), 10), "spfl_cnn": ((28, 28, 1), 10), "rsa_cifar_cnn": ((32, 32, 3), 10),
          "resnet18_gn": ((32, 32, 3), 10)}


def shape_of(model) -> tuple:
  """``(input_shape, num_classes)`` of a model name of :data:`SHAPES` or a built Model."""
  return SHAPES[model] if isinstance(model, str) else (model.input_shape, model.num_classes)


def median_seconds(fn, repeats):
  """The median wall time of ``repeats`` calls of ``fn()`` (which must block until its work is
  done), after one call that compiles and warms up."""
  fn()  # compile and warm up
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


# benchmarks/peers/setup.sh builds it; torch_round.py there runs the loop baseline in PyTorch.
PEERS = pathlib.Path(__file__).resolve().parent / "peers"


def torch_round(model: str, clients: int, local_steps: int, batch: int, examples: int,
                repeats: int) -> dict:
  """``torch_round.py``'s record (``torch_s_per_round``, its version and threads), run with the
  peers' Python; empty when that environment is absent or the model is not one it has."""
  python = PEERS / ".venv" / "bin" / "python"
  if not python.exists() or model not in ("cnn2", "mlp"):
    return {}
  out = subprocess.run([str(python), str(PEERS / "torch_round.py"), "--model", model,
                        "--clients", str(clients), "--local-steps", str(local_steps),
                        "--batch", str(batch), "--examples", str(examples),
                        "--repeats", str(repeats)], check=True, capture_output=True, text=True)
  return json.loads(out.stdout.splitlines()[-1])


def synthetic_data(model, clients: int, examples: int, seed: int = 0,
                   tests: Optional[int] = None) -> FederatedData:
  """Random examples of ``model``'s shape; ``tests``: a test set of that many examples of its
  own (default: the first client's first 8)."""
  shape, classes = shape_of(model)
  rng = np.random.default_rng(seed)
  x = rng.random((clients, examples) + shape, dtype=np.float32)
  y = rng.integers(0, classes, (clients, examples)).astype(np.int32)
  test_x, test_y = x[0, :8], y[0, :8]
  if tests is not None:
    test_x = rng.random((tests,) + shape, dtype=np.float32)
    test_y = rng.integers(0, classes, tests).astype(np.int32)
  return FederatedData("synthetic", x, y, np.full(clients, examples, np.int32), test_x, test_y,
                       classes)


def measure(model, clients: int, local_steps: int, batch: int, examples: int, repeats: int,
            conv_impl: str, skip_loop: bool = False, compute_dtype: str = "float32",
            chunk=None, skip_centralized: bool = False, live: Optional[int] = None) -> dict:
  """One JSON-able record; ``model`` is a name of :data:`SHAPES` or a built Model, ``chunk``
  the engine's clients per block (default: the whole cohort at once; ``"auto"``: the engine's
  automatic choice, :func:`fedjax_dp.experiment.client_blocks`). ``live``: only the first
  ``live`` of the ``clients`` slots are real clients, the rest padded (mask 0), as a Poisson
  cohort is padded to its capacity (the engine only; ``client_steps_per_s`` counts the live
  clients' steps)."""
  data = synthetic_data(model, clients, examples)
  config = make_config(model=model, num_clients=clients, sampling="fixed", cohort_size=clients,
                       local_steps=local_steps, batch_size=batch, clip=1.0, noise_multiplier=1.0,
                       target_epsilon=None, conv_impl=conv_impl, client_lr=0.01,
                       compute_dtype=compute_dtype)
  setup = build_dp_fedavg(config, data)
  program = setup.program
  if chunk == "auto":
    chunk = client_blocks(config, program.model, program.model_batch)
  hp = {k: jnp.asarray(v) for k, v in setup.hparams.items()}
  state = program.init(jax.random.PRNGKey(0), hp)
  ids = jnp.arange(clients, dtype=jnp.int32)
  live = clients if live is None else live
  mask = (jnp.arange(clients) < live).astype(jnp.float32)
  x, y, c = jnp.asarray(data.x), jnp.asarray(data.y), jnp.asarray(data.counts)
  key = jax.random.PRNGKey(1)
  batch_arrays = CohortBatch(x, y, c, ids, mask)

  step = compiled_step(program, "host", chunk=chunk)
  engine_s = median_seconds(
      lambda: jax.block_until_ready(step(state, hp, batch_arrays, key)), repeats)

  result = {"model": program.model.name, "clients": clients, "local_steps": local_steps,
            "live_clients": live, "batch": batch, "conv_impl": conv_impl,
            "compute_dtype": compute_dtype, "chunk": chunk,
            "backend": jax.default_backend(), "device": str(jax.devices()[0]),
            "devices": jax.device_count(),
            "engine_s_per_round": engine_s}

  result["client_steps_per_s"] = live * local_steps / engine_s
  if live < clients:  # the baselines have no padding to compare with
    return result
  if not skip_loop:
    client_update = jax.jit(program.client(hp))

    @jax.jit
    def server(state, deltas, k):
      deltas = mask_rows(deltas, mask)
      agg, _ = program.aggregator(hp).aggregate(deltas, mask, mask, state.agg_state, k)
      return server_update(program, state, agg, hp)[0]

    def loop_round():
      k_clients, k_agg = jax.random.split(key)
      keys = client_keys(k_clients, ids)
      outs = [client_update(state.params, x[i], y[i], c[i], (), (), keys[i]).upload
              for i in range(clients)]
      deltas = jax.tree_util.tree_map(lambda *d: jnp.stack(d), *outs)
      return jax.block_until_ready(server(state, deltas, k_agg))

    result["loop_s_per_round"] = median_seconds(loop_round, repeats)

  if skip_centralized:
    return result
  objective = supervised(program.model)
  opt = optax.sgd(0.01)
  xc = jnp.asarray(data.x.reshape((-1,) + data.x.shape[2:]))
  yc = jnp.asarray(data.y.reshape(-1))

  @jax.jit
  def centralized(params, k):
    def one(carry, kk):
      p, s = carry
      idx = jax.random.randint(kk, (clients * batch,), 0, xc.shape[0])
      g = jax.grad(objective)(p, (xc[idx], yc[idx], jnp.ones(clients * batch)), p)
      u, s = opt.update(g, s, p)
      return (optax.apply_updates(p, u), s), None
    (p, _), _ = jax.lax.scan(one, (params, opt.init(params)), jax.random.split(k, local_steps))
    return p

  result["centralized_s_per_round"] = median_seconds(
      lambda: jax.block_until_ready(centralized(state.params, key)), repeats)
  result["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
  if "loop_s_per_round" in result:
    result["loop_over_engine"] = result["loop_s_per_round"] / engine_s
  result["engine_over_centralized"] = engine_s / result["centralized_s_per_round"]
  return result


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--model", default="cnn2", choices=sorted(SHAPES))
  p.add_argument("--clients", type=int, default=10)
  p.add_argument("--local-steps", type=int, default=30)
  p.add_argument("--batch", type=int, default=64)
  p.add_argument("--examples", type=int, default=128, help="examples per client")
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--conv-impl", default="auto", choices=CONV_IMPLS,
                 help="how convolutions are computed (default: auto, as fedjax-dp run)")
  p.add_argument("--skip-loop", action="store_true", help="skip the Python-loop baseline (large cohorts)")
  p.add_argument("--compute-dtype", default="float32", choices=COMPUTE_DTYPES)
  p.add_argument("--skip-centralized", action="store_true",
                 help="skip the centralized-batch column (large cnn2 cohorts on a CPU)")
  p.add_argument("--client-chunk", type=int, default=None,
                 help="the engine's clients per block on each device (0: the whole cohort in "
                      "one vmap; "
                      "default: the engine's automatic choice, as fedjax-dp run)")
  p.add_argument("--cpu-devices", type=int, default=None, metavar="N",
                 help="split the CPU into N JAX devices (as fedjax-dp run --cpu-devices N): the "
                      "engine splits the clients over them; the baselines run on the first, its "
                      "matmuls on every core (default: JAX's, 1)")
  p.add_argument("--json", action="store_true",
                 help="print one JSON object; with benchmarks/peers/.venv present it also runs "
                      "the loop baseline in PyTorch right after (torch_s_per_round)")
  args = p.parse_args(argv)
  use_cpu_devices(args.cpu_devices)
  r = measure(args.model, args.clients, args.local_steps, args.batch, args.examples, args.repeats,
              args.conv_impl, args.skip_loop, args.compute_dtype,
              chunk="auto" if args.client_chunk is None else args.client_chunk or None,
              skip_centralized=args.skip_centralized)
  if args.json:
    r.update(torch_round(args.model, args.clients, args.local_steps, args.batch, args.examples,
                         args.repeats))
    if "torch_s_per_round" in r:
      r["torch_over_engine"] = r["torch_s_per_round"] / r["engine_s_per_round"]
    print(json.dumps(r))
  else:
    for k, v in r.items():
      print(f"{k:>26}: {v}")


if __name__ == "__main__":
  sys.exit(main())
