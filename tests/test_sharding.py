"""Clients split over devices: 4 forced host devices give the one-device result."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import json
    import jax
    import numpy as np
    from fedjax_dp.config import make_config
    from fedjax_dp.experiment import load_data, simulate
    from fedjax_dp.sweep import sweep

    assert len(jax.devices()) == 4, jax.devices()
    out = {}
    common = dict(num_clients=60, sampling_prob=0.2, rounds=2, local_steps=2, batch_size=4,
                  model="mlp", eval_every=1, max_test=200, target_epsilon=None)
    base = dict(common, clip=0.5, noise_multiplier=1.0)
    cases = {"dp_fedavg": base,
             # each device's clients in blocks of 2 (with padding: 36 slots, 9 a device)
             "dp_fedavg_blocks": dict(base, client_chunk=2),
             # per-client state (RSA's workers) gathered and scattered by blocks over devices
             "rsa_blocks": dict({k: v for k, v in common.items() if k != "sampling_prob"},
                                algorithm="rsa", sampling="fixed", cohort_size=10, client_chunk=2),
             "gm_attacked_host": dict(common, algorithm="gm", attack="gaussian", byzantine=6,
                                      placement="host")}
    for name, settings in cases.items():
        cfg = make_config(**settings)
        data = load_data(cfg)
        runs = [simulate(cfg.replace(devices=d), data) for d in (1, 4)]
        leaves = [jax.tree_util.tree_leaves(r.state.params) for r in runs]
        out[name] = {
            "param_diff": max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                              for a, b in zip(*leaves)),
            "accuracy": [r.metrics["test_accuracy"].tolist() for r in runs],
            "epsilon": [r.summary.get("epsilon") for r in runs],
            "devices": [len(leaves[i][0].sharding.device_set) for i in (0, 1)]}
    # Winograd's custom VJP (its tiles and transforms) on clients split over the devices as the
    # round splits them, against the same clients on one device: the gradients of 4 clients'
    # kernels and inputs through a 16-channel layer.
    import jax.numpy as jnp
    from fedjax_dp.models.conv import conv2d
    from fedjax_dp.round import client_mesh, shard_clients

    def grads(k, x, mesh):
        if mesh is not None:
            k, x = shard_clients((k, x), mesh, 0)
        loss = lambda k, x: jnp.sum(jnp.square(conv2d(x, k, impl="winograd")))
        return jax.vmap(jax.grad(loss, argnums=(0, 1)))(k, x)

    keys = jax.random.split(jax.random.key(0))
    k = jax.random.normal(keys[0], (4, 3, 3, 16, 16)) / 12
    x = jax.random.normal(keys[1], (4, 2, 8, 8, 16))
    runs = [jax.jit(grads, static_argnums=2)(k, x, m) for m in (None, client_mesh(4))]
    out["winograd_grads"] = {
        "relative_diff": max(float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(a)))
                             for a, b in zip(*runs)),
        "devices": [len(r[0].sharding.device_set) for r in runs]}
    # A sweep's experiments split their clients the same way, here in blocks of 6 clients.
    res = [sweep(make_config(**base, devices=d, client_chunk=6), {"clip": [0.2, 1.0]}, seeds=1)
           for d in (1, 4)]
    out["sweep_accuracy"] = [[e["result"].summary["final_accuracy"] for e in r.experiments]
                             for r in res]
    # Blocks are each device's: 8 slots (2 a device) in blocks of 1 run as 2 blocks, in blocks
    # of 2 as one (the summary records the whole cohort at once).
    fixed = dict({k: v for k, v in base.items() if k != "sampling_prob"}, sampling="fixed",
                 cohort_size=8, rounds=1, devices=4)
    out["client_block"] = [simulate(make_config(**fixed, client_chunk=k), data).summary[
        "provenance"]["client_block"] for k in (1, 2)]
    # Each device runs its own clients block after block: the blocked round gathers across the
    # devices what the whole cohort's gathers (the clients' metrics), not the clients' data.
    from fedjax_dp.algorithms import build
    from fedjax_dp.round import compiled_step
    setup = build(make_config(**dict(fixed, cohort_size=16)), data)
    hp = {k: jnp.asarray(v) for k, v in setup.hparams.items()}
    args = (setup.program.init(jax.random.PRNGKey(0), hp), hp,
            tuple(jnp.asarray(a) for a in (data.x, data.y, data.counts)),
            jnp.arange(16, dtype=jnp.int32), jnp.ones(16), jax.random.PRNGKey(0))
    out["all_gathers"] = [compiled_step(setup.program, "device", None, chunk, 4).lower(
        *args).compile().as_text().count(" all-gather(") for chunk in (None, 1)]
    # Automatic blocks over D CPU devices: CPU_BLOCK // D (at least 1) clients on each device,
    # none when a device's share of a fixed cohort fits in one.
    from fedjax_dp.experiment import client_blocks
    from fedjax_dp.models import get_model
    mlp = get_model("mlp", (8, 8, 1), 10)
    auto = make_config(num_clients=60, rounds=1)
    out["auto_blocks"] = [client_blocks(c, mlp) for c in (
        auto, auto.replace(devices=2), auto.replace(sampling="fixed", cohort_size=40),
        auto.replace(sampling="fixed", cohort_size=4, devices=2))]
    print("RESULT " + json.dumps(out))
""")


def _host_devices(n: int) -> dict:
  """The environment of a subprocess on ``n`` CPU devices, with the session's other XLA flags."""
  flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={n}"
  return dict(os.environ, XLA_FLAGS=flags.strip(), JAX_PLATFORMS="cpu")


@pytest.mark.heavy
def test_four_devices_give_the_one_device_result():
  env = _host_devices(4)
  proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))
  out = json.loads(line[len("RESULT "):])
  for name in ("dp_fedavg", "dp_fedavg_blocks", "rsa_blocks", "gm_attacked_host"):
    case = out[name]
    assert case["devices"] == [1, 4], (name, case)
    assert case["param_diff"] < 1e-5, (name, case)
    one, four = case["accuracy"]
    assert max(abs(a - b) for a, b in zip(one, four)) <= 0.01, (name, case)
    assert case["epsilon"][0] == case["epsilon"][1]
  assert out["winograd_grads"]["devices"] == [1, 4], out["winograd_grads"]
  assert out["winograd_grads"]["relative_diff"] < 1e-5, out["winograd_grads"]
  one, four = out["sweep_accuracy"]
  assert max(abs(a - b) for a, b in zip(one, four)) <= 0.01
  assert out["client_block"] == [1, None]
  whole, blocks = out["all_gathers"]
  assert blocks == whole, out["all_gathers"]
  assert out["auto_blocks"] == [1, 2, 1, None]


PROCESS = textwrap.dedent("""
    import json, sys, tempfile
    import jax
    if len(sys.argv) > 2:  # one of several processes: JAX's multi-process runtime on localhost
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address="localhost:" + sys.argv[2],
                                   num_processes=2, process_id=int(sys.argv[1]))
    from fedjax_dp.errors import ConfigError
    from fedjax_dp.experiment import simulate
    r = simulate(num_clients=60, rounds=2, max_test=100, local_steps=2, eval_every=1)
    out = {"devices": len(jax.devices()), "processes": jax.process_count(),
           "accuracy": r.metrics["test_accuracy"].tolist(), "loss": r.metrics["test_loss"].tolist(),
           "epsilon": r.summary["epsilon"]}
    if len(sys.argv) > 2:
        # a private release's secret entropy is drawn once and shared: the processes agree
        out["private_sha256"] = simulate(num_clients=60, rounds=1, max_test=100, local_steps=2,
                                         release="private").summary["params_sha256"]
        try:  # checkpoints are single-process: refused in every process, before anything runs
            simulate(num_clients=60, rounds=1, output_dir=tempfile.mkdtemp(), checkpoint_every=1)
        except ConfigError as e:
            out["checkpoint_refused"] = str(e)
    print("RESULT " + json.dumps(out))
""")


def _result(stdout: str) -> dict:
  return json.loads(next(l for l in stdout.splitlines() if l.startswith("RESULT "))[len("RESULT "):])


@pytest.mark.heavy
def test_two_processes_agree_with_one():
  import socket
  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = str(s.getsockname()[1])
  env = _host_devices(2)
  procs = [subprocess.Popen([sys.executable, "-c", PROCESS, str(i), port], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in (0, 1)]
  outs = [p.communicate(timeout=600) for p in procs]
  for p, (_, err) in zip(procs, outs):
    assert p.returncode == 0, err[-3000:]
  alone = subprocess.run([sys.executable, "-c", PROCESS], capture_output=True, text=True,
                         timeout=600, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert alone.returncode == 0, alone.stderr[-3000:]
  one = _result(alone.stdout)
  assert _result(outs[0][0])["private_sha256"] == _result(outs[1][0])["private_sha256"]
  for out, _ in outs:
    got = _result(out)
    assert "checkpoint_every=1: is single-process, and this run has 2 processes" in \
        got["checkpoint_refused"]
    assert got["devices"] == 4 and got["processes"] == 2
    assert got["epsilon"] == one["epsilon"]
    assert max(abs(a - b) for a, b in zip(got["accuracy"], one["accuracy"])) <= 0.01
    assert max(abs(a - b) for a, b in zip(got["loss"], one["loss"])) <= 1e-4
