#!/usr/bin/python3
"""Cart-pole trained with DQN the ditask way, over the rlbus topic bus.

One learner, one evaluator and N collectors run as separate processes started by DI-engine's
``Parallel.runner(..., mq_type="rlbus")``; they talk only through DI-engine's own middleware:

- collectors step their cart-poles with the latest model and send their transitions
  (``ContextExchanger``: ``trajectories``, ``env_step``, ``env_episode``);
- the learner stores what arrives in a replay buffer, trains, and sends its weights after
  every step (``ModelExchanger``: the ``state_dict``, ~140 KB) and its ``train_iter``;
- the evaluator plays greedy episodes with the latest weights and sets ``task.finish`` once
  their mean return reaches the stop value (195 of 200, cart-pole's "solved"), which ends
  every node.

``patch_dingengine()`` registers ``mq_type="rlbus"``; with no ``--endpoint`` and no
``$RLBUS_ENDPOINT`` the runner starts a broker of its own for the run. Needs DI-engine's
``ding.framework`` (or a stand-in with the same interface on ``PYTHONPATH``), PyTorch and numpy
(Debian: ``python3-torch``)::

    python3 ditask_cartpole.py                      # 2 collectors, embedded broker
    python3 ditask_cartpole.py --collectors 1 --out result.json
    RLBUS_ENDPOINT=tcp://broker:7235 python3 ditask_cartpole.py

The run prints the evaluator's progress; ``--out`` writes its result as JSON. Exit status 0
when solved, 1 when ``--max-env-steps`` ran out first.

The hyper-parameters are those DI-engine publishes for its cart-pole DQN (dueling 128-128-64
network, discount 0.97, Adam at 1e-3, batches of 64, 5 updates per 8 collected steps, target
net every 100 updates, epsilon decaying exponentially from 0.95 to 0.1 over 10 000 steps).
"""

import argparse
import json
import logging
import math
import os
import random
import shutil
import sys
import tempfile
import time

import numpy as np
import torch
from torch import nn

from ding.framework import OnlineRLContext, Parallel, task
from ding.framework.middleware import ContextExchanger, ModelExchanger
from ding.framework.task import Role

from rlbus.compat import patch_dingengine

log = logging.getLogger("ditask_cartpole")

STOP_VALUE = 195.0
N_SAMPLE = 8  # transitions a collector sends per step
UPDATES_PER_STEP = 5
BATCH = 64
DISCOUNT = 0.97
TARGET_EVERY = 100
BUFFER = 20_000


class CartPole:
    """The classic cart-pole (Barto, Sutton and Anderson, 1983), as gym's CartPole-v0: a reward
    of 1 per step, the episode ends when the pole leans past 12 degrees, the cart leaves
    +-2.4, or after 200 steps."""

    GRAVITY, CART_MASS, POLE_MASS, HALF_LENGTH, FORCE, TAU = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    MAX_ANGLE, MAX_X, MAX_STEPS = 12 * 2 * math.pi / 360, 2.4, 200

    def __init__(self, seed):
        self._rng = np.random.default_rng(seed)
        self._state = None
        self._t = 0

    def reset(self):
        self._state = self._rng.uniform(-0.05, 0.05, 4)
        self._t = 0
        return self._state.astype(np.float32)

    def step(self, action):
        """Returns (obs, reward, terminal, done): ``terminal`` when the pole fell (no future
        value), ``done`` when the episode is over either way."""
        x, x_dot, theta, theta_dot = self._state
        force = self.FORCE if action == 1 else -self.FORCE
        cos, sin = math.cos(theta), math.sin(theta)
        total = self.CART_MASS + self.POLE_MASS
        pole_ml = self.POLE_MASS * self.HALF_LENGTH
        temp = (force + pole_ml * theta_dot * theta_dot * sin) / total
        theta_acc = (self.GRAVITY * sin - cos * temp) / (
            self.HALF_LENGTH * (4.0 / 3.0 - self.POLE_MASS * cos * cos / total))
        x_acc = temp - pole_ml * theta_acc * cos / total
        x, x_dot = x + self.TAU * x_dot, x_dot + self.TAU * x_acc
        theta, theta_dot = theta + self.TAU * theta_dot, theta_dot + self.TAU * theta_acc
        self._state = np.array([x, x_dot, theta, theta_dot])
        self._t += 1
        fell = abs(x) > self.MAX_X or abs(theta) > self.MAX_ANGLE
        return self._state.astype(np.float32), 1.0, fell, fell or self._t >= self.MAX_STEPS


class DuelingQ(nn.Module):
    """Q(s, a) = V(s) + A(s, a) - mean_a A(s, a) over a 128-128-64 body."""

    def __init__(self, obs=4, actions=2):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(obs, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                                  nn.Linear(128, 64), nn.ReLU())
        self.advantage = nn.Linear(64, actions)
        self.value = nn.Linear(64, 1)

    def forward(self, obs):
        h = self.body(obs)
        a = self.advantage(h)
        return self.value(h) + a - a.mean(-1, keepdim=True)

    def act(self, obs):
        with torch.no_grad():
            return int(self(torch.as_tensor(obs)).argmax())


def epsilon(env_step):
    return 0.1 + (0.95 - 0.1) * math.exp(-env_step / 10_000)


# -- the three roles' middleware --------------------------------------------------------------

def collector(model, seed):
    env = CartPole(seed)
    rng = random.Random(seed)
    state = {"obs": env.reset(), "env_step": 0, "env_episode": 0}

    def _collect(ctx):
        transitions = []
        for _ in range(N_SAMPLE):
            obs = state["obs"]
            if rng.random() < epsilon(state["env_step"]):
                action = rng.randrange(2)
            else:
                action = model.act(obs)
            next_obs, reward, terminal, done = env.step(action)
            transitions.append({"obs": obs, "action": action, "reward": reward,
                                "next_obs": next_obs, "done": terminal})
            state["env_step"] += 1
            if done:
                state["env_episode"] += 1
                next_obs = env.reset()
            state["obs"] = next_obs
        ctx.trajectories = transitions
        ctx.env_step = state["env_step"]
        ctx.env_episode = state["env_episode"]

    return _collect


def learner(model, seed):
    target = DuelingQ()
    target.load_state_dict(model.state_dict())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    buffer = []
    rng = random.Random(seed)
    state = {"train_iter": 0}

    def _train(ctx):
        buffer.extend(ctx.trajectories or [])
        del buffer[:-BUFFER]
        if len(buffer) >= BATCH:
            for _ in range(UPDATES_PER_STEP):
                batch = rng.sample(buffer, BATCH)
                obs = torch.as_tensor(np.stack([t["obs"] for t in batch]))
                action = torch.as_tensor([t["action"] for t in batch])
                reward = torch.as_tensor([t["reward"] for t in batch], dtype=torch.float32)
                next_obs = torch.as_tensor(np.stack([t["next_obs"] for t in batch]))
                done = torch.as_tensor([t["done"] for t in batch], dtype=torch.float32)
                with torch.no_grad():  # double DQN: the online net picks, the target values
                    best = model(next_obs).argmax(1, keepdim=True)
                    y = reward + DISCOUNT * (1 - done) * target(next_obs).gather(1, best).squeeze(1)
                q = model(obs).gather(1, action[:, None]).squeeze(1)
                loss = nn.functional.smooth_l1_loss(q, y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                state["train_iter"] += 1
                if state["train_iter"] % TARGET_EVERY == 0:
                    target.load_state_dict(model.state_dict())
        ctx.train_iter = state["train_iter"]

    return _train


def evaluator(model, seed, args, started):
    env = CartPole(seed)
    state = {"last_iter": -1, "best": 0.0}

    def _finish(result):
        result["seconds"] = round(time.monotonic() - started, 2)
        log.info("%s: %s", "solved" if result["solved"] else "not solved", result)
        with open(args.out + ".tmp", "w") as f:
            json.dump(result, f)
        os.replace(args.out + ".tmp", args.out)
        task.finish = True

    def _evaluate(ctx):
        env_step = ctx.env_step  # the collectors' increments, summed over the run
        train_iter = ctx.train_iter  # the learner's, as last received
        if train_iter == state["last_iter"]:
            return  # no new model since the last evaluation
        state["last_iter"] = train_iter
        total = 0.0
        for _ in range(args.eval_episodes):
            obs, done = env.reset(), False
            while not done:
                obs, reward, _, done = env.step(model.act(obs))
                total += reward
        mean = total / args.eval_episodes
        state["best"] = max(state["best"], mean)
        log.info("train_iter %d env_step %d eval return %.1f (best %.1f)", train_iter,
                 env_step, mean, state["best"])
        result = {"train_iter": train_iter, "env_step": env_step, "eval_return": mean,
                  "best_return": state["best"], "stop_value": args.stop_value}
        if mean >= args.stop_value:
            _finish(dict(result, solved=True))
        elif env_step >= args.max_env_steps:
            _finish(dict(result, solved=False))

    return _evaluate


def main(args):
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    started = time.monotonic()
    node = task.router.node_id
    seed = args.seed + 1000 * node
    torch.manual_seed(seed)
    torch.set_num_threads(1)  # several nodes share the machine's cores
    model = DuelingQ()
    with task.start(ctx=OnlineRLContext()):
        if node == 0:
            task.add_role(Role.LEARNER)
        elif node == 1:
            task.add_role(Role.EVALUATOR)
        else:
            task.add_role(Role.COLLECTOR)
        task.use(ContextExchanger(skip_n_iter=1))
        task.use(ModelExchanger(model))
        if task.has_role(Role.LEARNER):
            task.use(learner(model, seed))
        elif task.has_role(Role.EVALUATOR):
            task.use(evaluator(model, seed, args, started))
        else:
            task.use(collector(model, seed))
        task.run()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--collectors", type=int, default=2, help="collector processes")
    p.add_argument("--stop-value", type=float, default=STOP_VALUE,
                   help="mean greedy return that counts as solved")
    p.add_argument("--eval-episodes", type=int, default=8, help="episodes per evaluation")
    p.add_argument("--max-env-steps", type=int, default=50_000,
                   help="give up (exit 1) once the collectors made this many steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mq-type", default="rlbus",
                   help="DI-engine's mq_type; rlbus unless comparing with its own queues")
    p.add_argument("--endpoint", help="a running broker (default: $RLBUS_ENDPOINT, else one "
                   "started for the run)")
    p.add_argument("--out", help="write the evaluator's result here as JSON")
    args = p.parse_args(argv)
    if args.collectors < 1:
        p.error("--collectors must be at least 1")
    if args.eval_episodes < 1:
        p.error("--eval-episodes must be at least 1")
    return args


if __name__ == "__main__":
    args = parse_args()
    if args.endpoint:
        os.environ["RLBUS_ENDPOINT"] = args.endpoint
    keep = bool(args.out)
    args.out = os.path.abspath(args.out) if keep else os.path.join(
        tempfile.mkdtemp(prefix="ditask-cartpole-"), "result.json")
    if os.path.exists(args.out):
        os.unlink(args.out)
    patch_dingengine()
    Parallel.runner(n_parallel_workers=2 + args.collectors, mq_type=args.mq_type)(main, args)
    try:
        with open(args.out) as f:
            solved = json.load(f)["solved"]
    except (OSError, ValueError, KeyError):
        sys.exit("ditask_cartpole: the evaluator ended without a result")
    finally:
        if not keep:
            shutil.rmtree(os.path.dirname(args.out), ignore_errors=True)
    sys.exit(0 if solved else 1)
