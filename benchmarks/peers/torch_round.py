"""round_speed.py's loop baseline in plain PyTorch (CPU): seconds per DP-FedAvg round.

The same workload: every client holds ``--examples`` random examples of the
model's input shape, starts from the global model and takes Q SGD steps
(learning rate 0.01) on batches drawn with replacement from its examples; its
update (local minus global) is clipped to L2 norm 1 over all parameters; the
server adds N(0, (z C)^2) noise (z = 1, C = 1) to the sum, divides by the
cohort size and adds the mean to the global model (server learning rate 1).
Clients run one after another in a Python loop. Median of ``--repeats``
rounds after a warm-up round. Needs the environment ``setup.sh`` builds.

  benchmarks/peers/.venv/bin/python benchmarks/peers/torch_round.py --model cnn2 --clients 10
"""

import argparse
import json
import statistics
import time

import torch
from torch import nn


def make_model(name: str) -> nn.Module:
  if name == "cnn2":  # CNN-2-layers: 28x28x1 -> 62 classes, 1,206,590 parameters
    return nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(12 * 12 * 64, 128), nn.ReLU(),
                         nn.Linear(128, 62))
  return nn.Sequential(nn.Flatten(), nn.Linear(784, 200), nn.ReLU(), nn.Linear(200, 200),
                       nn.ReLU(), nn.Linear(200, 10))  # mlp: 784-200-200-10


def run_round(global_model, local, x, y, local_steps, batch, clip, noise, gen):
  params = [p.detach() for p in global_model.parameters()]
  total = [torch.zeros_like(p) for p in params]
  loss_fn = nn.CrossEntropyLoss()
  for i in range(x.shape[0]):
    with torch.no_grad():
      for q, p in zip(local.parameters(), params):
        q.copy_(p)
    opt = torch.optim.SGD(local.parameters(), lr=0.01)
    for _ in range(local_steps):
      idx = torch.randint(0, x.shape[1], (batch,), generator=gen)
      opt.zero_grad()
      loss_fn(local(x[i, idx]), y[i, idx]).backward()
      opt.step()
    with torch.no_grad():
      delta = [q - p for q, p in zip(local.parameters(), params)]
      norm = torch.sqrt(sum(torch.sum(d * d) for d in delta))
      scale = torch.clamp(clip / torch.clamp(norm, min=1e-30), max=1.0)
      for t, d in zip(total, delta):
        t.add_(d * scale)
  with torch.no_grad():
    for p, t in zip(global_model.parameters(), total):
      p.add_((t + noise * clip * torch.randn(t.shape, generator=gen)) / x.shape[0])


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--model", default="cnn2", choices=["cnn2", "mlp"])
  p.add_argument("--clients", type=int, default=10)
  p.add_argument("--local-steps", type=int, default=30)
  p.add_argument("--batch", type=int, default=64)
  p.add_argument("--examples", type=int, default=128)
  p.add_argument("--repeats", type=int, default=3)
  args = p.parse_args()
  gen = torch.Generator().manual_seed(0)
  classes = 62 if args.model == "cnn2" else 10
  x = torch.rand((args.clients, args.examples, 1, 28, 28), generator=gen)
  y = torch.randint(0, classes, (args.clients, args.examples), generator=gen)
  global_model, local = make_model(args.model), make_model(args.model)
  times = []
  for r in range(args.repeats + 1):  # the first round warms up
    t0 = time.perf_counter()
    run_round(global_model, local, x, y, args.local_steps, args.batch, 1.0, 1.0, gen)
    if r:
      times.append(time.perf_counter() - t0)
  print(json.dumps({"torch_s_per_round": statistics.median(times), "torch": torch.__version__,
                    "torch_threads": torch.get_num_threads()}))


if __name__ == "__main__":
  main()
