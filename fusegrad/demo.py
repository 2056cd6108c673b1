"""The main job: train a small convolutional network on scikit-learn's 8x8 handwritten digits, then report.

The 1,797 images ship with scikit-learn (the 'demo' extra), so nothing is downloaded. The run is deterministic for a
given --seed: the split, the initial weights and the batch order all come from it. At the end it prints the test
accuracy, how many kernels were compiled and run, and the time spent compiling versus running them.
"""
from __future__ import annotations
import time
import numpy as np
from sklearn.datasets import load_digits
from tqdm import tqdm
from fusegrad import Tensor, GlobalCounters, Context
from fusegrad.device import Device
from fusegrad import nn
from fusegrad.nn.state import get_parameters


class DigitNet:
  """conv(1->8) relu, conv(8->16) relu, max-pool 2, linear(256->64) relu, linear(64->10)."""

  def __init__(self):
    self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
    self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
    self.fc1 = nn.Linear(16 * 4 * 4, 64)
    self.fc2 = nn.Linear(64, 10)

  def __call__(self, x: Tensor) -> Tensor:
    x = self.conv2(self.conv1(x).relu()).relu().max_pool2d(2)
    return self.fc2(self.fc1(x.flatten(1)).relu())


def load_split(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  digits = load_digits()
  x = (digits.images.astype(np.float32) / 16.0)[:, None, :, :]
  y = digits.target.astype(np.int32)
  order = np.random.default_rng(seed).permutation(len(x))
  n_test = len(x) // 5
  test, train = order[:n_test], order[n_test:]
  return x[train], y[train], x[test], y[test]


def accuracy(model: DigitNet, x: np.ndarray, y: np.ndarray, device: str, batch: int = 512) -> float:
  correct = 0
  with Tensor.no_grad():
    for i in range(0, len(x), batch):
      pred = model(Tensor(x[i:i + batch], device=device)).argmax(axis=1).numpy()
      correct += int((pred == y[i:i + batch]).sum())
  return correct / len(x)


def train(device: str, epochs: int, seed: int, batch: int = 64) -> dict:
  Tensor.manual_seed(seed)
  x_train, y_train, x_test, y_test = load_split(seed)
  model = DigitNet()
  opt = nn.optim.Adam(get_parameters(model), lr=1e-2)
  rng = np.random.default_rng(seed + 1)
  GlobalCounters.reset()
  start = time.perf_counter()
  steps = epochs * (len(x_train) // batch)
  with Tensor.train(), tqdm(total=steps, unit="step", desc="training") as bar:
    for epoch in range(epochs):
      opt.lr = 1e-2 * 0.5 ** (3 * epoch // epochs)   # halve the step size twice over the run
      order = rng.permutation(len(x_train))
      for i in range(0, len(order) - batch + 1, batch):
        idx = order[i:i + batch]
        xb, yb = Tensor(x_train[idx], device=device), Tensor(y_train[idx], device=device)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        bar.update(1)
        if bar.n % 10 == 0 or bar.n == steps:
          elapsed = time.perf_counter() - start
          bar.set_postfix(epoch=epoch + 1, loss=f"{loss.item():.3f}", img_per_s=f"{bar.n * batch / elapsed:.0f}")
  train_s = time.perf_counter() - start
  return {"accuracy": accuracy(model, x_test, y_test, device), "train_s": train_s, "n_test": len(x_test),
          "kernels_compiled": GlobalCounters.compile_count, "kernels_run": GlobalCounters.kernel_count,
          "compile_s": GlobalCounters.compile_time_s, "run_s": GlobalCounters.time_sum_s}


def main(args) -> int:
  device = Device.canonicalize(args.device) if args.device else Device.DEFAULT
  epochs = args.epochs if args.epochs is not None else 12
  with Context(DEV=device):
    r = train(device, epochs, args.seed)
  print(f"test accuracy: {r['accuracy'] * 100:.2f}% on {r['n_test']} held-out digits ({device}, {epochs} epochs, "
        f"seed {args.seed})")
  print(f"kernels: {r['kernels_compiled']} compiled, {r['kernels_run']} run")
  print(f"time: {r['train_s']:.1f} s training = {r['compile_s']:.1f} s compiling + {r['run_s']:.1f} s in kernels + "
        f"{max(r['train_s'] - r['compile_s'] - r['run_s'], 0):.1f} s in Python (graph, scheduling, launches)")
  return 0
