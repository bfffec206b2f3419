"""Writes notebooks/blur_lus.ipynb without outputs: ``python notebooks/make_blur_lus.py``; then
``python notebooks/execute.py notebooks/blur_lus.ipynb`` runs it and keeps its outputs."""

import pathlib

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

cells = [
    new_markdown_cell(
        "# BLUR and LUS for user-level DP-FedAvg (Cheng et al., CVPR 2022)\n\n"
        "BLUR adds `(lambda/2) max(0, ||w - w_t||^2 - S^2)` to each client's loss (Eq. 5); LUS zeroes, "
        "per layer, the fraction `c` of update elements with the smallest `|g * Delta|` (Eq. 9-12) "
        "before the clip. Both leave DP-FedAvg's privacy accounting unchanged.\n\n"
        "With `FEDJAX_DP_TINY=1` this runs on scikit-learn's digits in seconds; otherwise on MNIST "
        "from the folder `DATA_DIR` names (default `$FEDJAX_DP_DATA`), and on the digits at the tiny "
        "size where that folder holds no `mnist/`. The outputs shown were computed at the tiny "
        "size: the MNIST size takes more than 5 minutes on 2 shared CPU cores, so its numbers are not "
        "the point here (at 4 rounds the accuracies are near chance); the mechanics are."),
    new_code_cell(
        "import json, os, pathlib\n"
        "import numpy as np\n"
        "import matplotlib.pyplot as plt\n"
        "from fedjax_dp import load_data, make_config, simulate\n"
        "DATA_DIR = os.environ.get('FEDJAX_DP_DATA')  # or the path of a folder holding mnist/\n"
        "# Without MNIST's files (a fresh clone has none), the tiny size on the bundled digits.\n"
        "TINY = (os.environ.get('FEDJAX_DP_TINY') == '1' or DATA_DIR is None\n"
        "        or not pathlib.Path(DATA_DIR, 'mnist').is_dir())\n"
        "if TINY:\n"
        "    base = dict(dataset='digits', num_clients=60, model='rsa_mlp', rounds=4, sampling_prob=0.2,\n"
        "                local_steps=5, batch_size=8, eval_every=1)\n"
        "else:\n"
        "    base = dict(dataset='mnist', data_dir=DATA_DIR, num_clients=600, model='rsa_mlp', rounds=30,\n"
        "                sampling_prob=0.04, local_steps=15, batch_size=10, eval_every=3)\n"
        "base.update(partition='shards', shards_per_client=2, client_lr=0.05, clip=0.3,\n"
        "            target_epsilon=None, noise_multiplier=1.0)\n"
        "data = load_data(make_config(base))\n"
        "print(data.num_clients, 'clients,', data.x.shape)"),
    new_markdown_cell("## DP-FedAvg vs BLUR+LUS (same noise multiplier, so the same epsilon)"),
    new_code_cell(
        "runs = {}\n"
        "for alg in ('dp_fedavg', 'blur+lus'):\n"
        "    runs[alg] = simulate(make_config(base, algorithm=alg), data)\n"
        "    s = runs[alg].summary\n"
        "    print(f\"{alg:10s} acc={s['final_accuracy']:.4f} epsilon={s['epsilon']:.3f} at delta={s['delta']:g}\")\n"
        "assert runs['dp_fedavg'].summary['epsilon'] == runs['blur+lus'].summary['epsilon']"),
    new_code_cell(
        "fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))\n"
        "for alg, r in runs.items():\n"
        "    h = [x for x in r.history if 'test_accuracy' in x]\n"
        "    axes[0].plot([x['round'] for x in h], [x['test_accuracy'] for x in h], label=alg)\n"
        "    rounds = [x['round'] for x in r.history]\n"
        "    q = {k: np.array([x['diagnostics']['update_norm'][k] for x in r.history]) for k in ('q10', 'q50', 'q90')}\n"
        "    axes[1].fill_between(rounds, q['q10'], q['q90'], alpha=0.3)\n"
        "    axes[1].plot(rounds, q['q50'], label=f'{alg} (median, 10-90%)')\n"
        "axes[1].axhline(base['clip'], color='k', ls='--', label='clip S')\n"
        "axes[0].set_xlabel('round'); axes[0].set_ylabel('test accuracy'); axes[0].legend()\n"
        "axes[1].set_xlabel('round'); axes[1].set_ylabel('pre-clip ||Delta|| (before LUS)'); axes[1].legend()\n"
        "plt.tight_layout(); plt.show()"),
    new_markdown_cell("## How lambda moves the update norms, and how c moves the norm entering the clip"),
    new_code_cell(
        "lams = (0.0, 0.4, 1.6) if TINY else (0.0, 0.1, 0.4, 0.8)\n"
        "median_norm = {}\n"
        "for lam in lams:\n"
        "    alg = 'dp_fedavg' if lam == 0 else 'dp_fedavg+blur'\n"
        "    opts = {} if lam == 0 else {'lambda': lam}\n"
        "    r = simulate(make_config(base, algorithm=alg, options=opts), data)\n"
        "    med = median_norm[lam] = float(np.mean([x['diagnostics']['update_norm']['q50'] for x in r.history]))\n"
        "    print(f'lambda={lam:<4} median pre-clip norm={med:.3f}  acc={r.summary[\"final_accuracy\"]:.4f}')"),
    new_code_cell(
        "import jax, jax.numpy as jnp\n"
        "from fedjax_dp import (get_model, global_norm, local_sgd, make_optimizer, objectives,\n"
        "                       sparsify_by_utility, tree_sub)\n"
        "cfg = make_config(base, algorithm='blur+lus')\n"
        "model = get_model(cfg.model_name, data.example_shape, data.num_classes)\n"
        "loss = objectives.supervised(model)  # f_i, without BLUR's term\n"
        "train = local_sgd(objectives.blur(loss, 0.4, cfg.clip), make_optimizer('sgd', cfg.client_lr),\n"
        "                  cfg.local_steps, cfg.batch_size)\n"
        "params = runs['blur+lus'].state.params\n"
        "x, y, n = jnp.asarray(data.x[0]), jnp.asarray(data.y[0]), jnp.asarray(data.counts[0])\n"
        "params_q, _ = train(params, x, y, n, jax.random.PRNGKey(0))\n"
        "delta = tree_sub(params_q, params)\n"
        "# LUS's utility gradient g (Eq. 10): f_i's gradient at w_{t,Q}, here over all the client's\n"
        "# examples (the option lus_batches=0; the default, 1, averages one minibatch's).\n"
        "real = (jnp.arange(y.shape[0]) < n).astype(jnp.float32)\n"
        "grad = jax.grad(loss)(params_q, (x, y, real), params)\n"
        "lus_norm = {}\n"
        "for c in (0.0, 0.1, 0.3, 0.5, 0.7, 0.9):\n"
        "    tx = sparsify_by_utility(c)\n"
        "    sparse, _ = tx.update(delta, tx.init(delta), params_q, grad=grad)\n"
        "    lus_norm[c] = float(global_norm(sparse))\n"
        "    print(f'c={c}: ||Delta||={float(global_norm(delta)):.3f} -> after LUS {lus_norm[c]:.3f}')"),
    new_markdown_cell("## Key numbers\n\nOne JSON line, which `tests/test_notebooks.py` reads from this cell's output."),
    new_code_cell(
        "print(json.dumps({'final_accuracy': {a: r.summary['final_accuracy'] for a, r in runs.items()},\n"
        "                  'epsilon': {a: r.summary['epsilon'] for a, r in runs.items()},\n"
        "                  'median_norm_by_lambda': median_norm, 'norm_after_lus_by_c': lus_norm}))"),
]
nb = new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                        "language": "python"}})
path = pathlib.Path(__file__).with_name("blur_lus.ipynb")
nbformat.write(nb, path)
print("wrote", path)
