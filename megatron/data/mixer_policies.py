"""The adaptive mixer's policies (issue 46; ``train: {blend: [...], mixer: {policy, interval,
floor, ...}}``, megatron/data/blend_config.py ``MixerConfig``): each a pure function

    policy(config, state, MixerInputs) -> (weights, new state)

of its recorded state (plain JSON: lists and numbers, so a checkpoint records it exactly) and the
inputs of one update interval: the global per-dataset training losses of the interval (NaN for a
dataset that drew nothing in it), the samples each dataset drew in it and the samples each has
left in its epoch (the ledger's). No randomness, no clock: the same inputs give the same weights
bit for bit. Every policy's distribution ``p`` gets the floor as ``w = F + (1 - K F) p`` (``K``
datasets, ``K F <= 1``), so each dataset keeps at least ``F``.

* ``odm`` -- Albalak et al. 2023, "Efficient Online Data Mixing For Language Model Pre-Training"
  (EXP3 on the training loss; reference code github.com/alon-albalak/online-data-mixing,
  ``megatron/data/data_sampling_utils.py`` ``Exp3WeightUpdater``): update ``t`` (1, 2, ...)
  turns each drawn dataset's loss into a reward ``r_i = L_i / reward_scale`` (the reference
  divides by 10), importance-weighted by the probability it was drawn with and smoothed
  (the paper's ``R_i <- a R_i + (1 - a) r_i / pi_i``, ``a`` = ``smoothing``); then
  ``eps_t = min(1/K, sqrt(ln K / (K t)))`` and
  ``pi_i = (1 - K eps_t) exp(eps_{t-1} R_i) / sum_j exp(eps_{t-1} R_j) + eps_t``
  (``eps_0 = 1/K``).
* ``ado`` -- Jiang et al. 2024, "Adaptive Data Optimization: Dynamic Sample Selection with
  Scaling Laws" (reference code github.com/yidingjiang/ado, ``src/data_selectors/ado.py``
  ``AdoSelector.curr_dist``): per dataset a power law ``L_k(n) = E_k + B_k n^-alpha_k`` of its
  loss over its samples drawn is fitted to the interval losses recorded so far (here: least
  squares in ``L`` over a fixed grid of exponents 0.05..0.80, ``E``, ``B`` >= 0 in closed form;
  the reference fits ``log L`` by L-BFGS on a Huber loss from a grid of starts). Its learning
  speed ``s_k = alpha_k (L_k(n_k) - E_k) / n_k`` is weighted by the prior ``mu_k`` (the starting
  mix) and ``sqrt(h_k (1 - h_k))``, ``h`` the drawn shares' moving average (``h <- g h + (1 - g)
  c``, ``g`` = ``history``); normalised to ``q``, the policy keeps ``p = a pbar + (1 - a) q``
  (``a`` = ``average``) and the running mean ``pbar <- (1 - 1/(u+1)) pbar + q/(u+1)``, ``u`` the
  iteration. Until every dataset has losses of ``warmup`` intervals (at least 3) it keeps the
  starting mix.
* ``loss_softmax`` -- this project's: each dataset's loss relative to its first recorded loss,
  ``rho_i = L_i / L_i(0)``, and ``p_i = w0_i exp((rho_i - 1) / T) / sum_j w0_j exp((rho_j - 1) /
  T)`` (``T`` = ``temperature``; ``w0`` the starting mix): at the start (every ``rho`` 1) the
  starting mix, and a dataset whose loss falls more slowly than the others' gains weight.

A dataset with no loss in an interval keeps its last one (ODM: no reward; ADO: no new point).
With ``max_epochs`` the weights are then capped by what each dataset may still draw
(:func:`apply_cap`), the capped datasets recorded with their reason.
"""
import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from megatron.data.blend_config import MixerConfig

__all__ = ["MixerInputs", "POLICIES", "initial_state", "apply_floor", "apply_cap", "update_weights",
           "odm_update", "ado_update", "loss_softmax_update", "fit_power_law"]

State = Dict[str, Any]


@dataclass(frozen=True)
class MixerInputs:
    """One interval's inputs: ``losses[i]`` dataset ``i``'s mean training loss over the interval
    (global: summed over the replicas; NaN when it drew nothing), ``drawn[i]`` its samples drawn
    in the interval, ``remaining[i]`` its samples left in its epoch (the ledger's), ``iteration``
    the iteration the update is made at."""

    losses: Tuple[float, ...]
    drawn: Tuple[int, ...]
    remaining: Tuple[int, ...]
    iteration: int
    # for the cap (``max_epochs``): each dataset's samples drawn so far and per epoch (None: its
    # epochs differ in length), and the global samples of the next interval
    total: Tuple[int, ...] = ()
    per_epoch: Tuple[Optional[int], ...] = ()
    next_samples: int = 0


def apply_floor(p: Sequence[float], floor: float) -> List[float]:
    """``w_i = F + (1 - K F) p_i`` with ``p`` normalised: every weight at least ``F``, summing
    to 1."""
    p = np.asarray(p, dtype=np.float64)
    p = p / p.sum()
    return [float(x) for x in floor + (1.0 - len(p) * floor) * p]


def initial_state(config: MixerConfig, weights: Sequence[float]) -> State:
    """The state before the first update: the starting mix ``weights`` (normalised) and each
    policy's own, all plain JSON."""
    w = np.asarray(weights, dtype=np.float64)
    w = [float(x) for x in w / w.sum()]
    k = len(w)
    state: State = {"policy": config.policy, "updates": 0, "start": w, "weights": w}
    if config.policy == "odm":
        state.update(reward=[0.0] * k, eps=1.0 / k)
    elif config.policy == "ado":
        state.update(points=[[] for _ in range(k)], seen=[0] * k, share=list(w), mean=list(w))
    elif config.policy == "loss_softmax":
        state.update(first=[None] * k, last=[None] * k)
    return state


def odm_update(config: MixerConfig, state: State, inputs: MixerInputs) -> Tuple[List[float], State]:
    """ODM's EXP3 step (module docstring)."""
    k = len(state["weights"])
    t = state["updates"] + 1
    a, scale = config.param("smoothing"), config.param("reward_scale")
    reward = list(state["reward"])
    for i, loss in enumerate(inputs.losses):
        if math.isfinite(loss) and state["weights"][i] > 0:  # weight 0 (capped): no estimate
            reward[i] = a * reward[i] + (1.0 - a) * (loss / scale) / state["weights"][i]
    prev_eps = state["eps"]
    eps = min(1.0 / k, math.sqrt(math.log(k) / (k * t))) if k > 1 else 1.0
    r = np.asarray(reward, dtype=np.float64) * prev_eps
    e = np.exp(r - r.max())  # the same ratios as exp(eps R), without overflow
    pi = (1.0 - k * eps) * e / e.sum() + eps
    weights = apply_floor(pi, config.floor)
    return weights, dict(state, updates=t, weights=weights, reward=reward, eps=eps)


ALPHA_GRID = tuple(round(0.05 + 0.01 * j, 2) for j in range(76))  # 0.05 .. 0.80


def fit_power_law(n: Sequence[float], loss: Sequence[float]) -> Tuple[float, float, float]:
    """``(E, B, alpha)`` of ``L(n) = E + B n^-alpha`` with ``E, B >= 0`` fitted to the points
    ``(n, loss)`` by least squares in ``L``: for each ``alpha`` of :data:`ALPHA_GRID` the best
    ``E, B`` in closed form, the ``alpha`` of the smallest error (the first on a tie)."""
    n = np.asarray(n, dtype=np.float64)
    y = np.asarray(loss, dtype=np.float64)
    best = None
    for alpha in ALPHA_GRID:
        x = n ** -alpha
        candidates = []
        xc, yc = x - x.mean(), y - y.mean()
        sxx = float(xc @ xc)
        if sxx > 0:
            b = float(xc @ yc) / sxx
            e = float(y.mean() - b * x.mean())
            if b >= 0 and e >= 0:
                candidates.append((e, b))
        candidates.append((float(y.mean()), 0.0))  # B = 0
        xx = float(x @ x)
        candidates.append((0.0, max(float(x @ y) / xx, 0.0) if xx > 0 else 0.0))  # E = 0
        for e, b in candidates:
            err = float(((e + b * x - y) ** 2).sum())
            if best is None or err < best[0]:
                best = (err, e, b, alpha)
    return best[1], best[2], best[3]


def ado_update(config: MixerConfig, state: State, inputs: MixerInputs) -> Tuple[List[float], State]:
    """ADO's step (module docstring)."""
    k = len(state["weights"])
    g, a = config.param("history"), config.param("average")
    seen = [int(s) + int(d) for s, d in zip(state["seen"], inputs.drawn, strict=True)]
    points = [list(p) for p in state["points"]]
    for i, loss in enumerate(inputs.losses):
        if math.isfinite(loss) and inputs.drawn[i] > 0:
            points[i].append([seen[i], float(loss)])
    total = sum(inputs.drawn)
    share = list(state["share"])
    if total > 0:
        share = [g * h + (1.0 - g) * d / total for h, d in zip(share, inputs.drawn, strict=True)]
    new = dict(state, updates=state["updates"] + 1, seen=seen, points=points, share=share)
    if min(len(p) for p in points) < max(int(config.param("warmup")), 3):
        return list(state["weights"]), new
    speed = np.zeros(k)
    for i, p in enumerate(points):
        n_i, l_i = zip(*p, strict=True)
        e, b, alpha = fit_power_law(n_i, l_i)
        speed[i] = alpha * b * seen[i] ** -alpha / seen[i]  # alpha (L(n) - E) / n
    h = np.asarray(share)
    q = speed * np.asarray(state["start"]) * np.sqrt(h * (1.0 - h))
    if not q.sum() > 0:
        return list(state["weights"]), new
    q = q / q.sum()
    u = int(inputs.iteration)
    pbar = np.asarray(state["mean"])
    p = a * pbar + (1.0 - a) * q
    pbar = (1.0 - 1.0 / (u + 1)) * pbar + q / (u + 1)
    weights = apply_floor(p, config.floor)
    return weights, dict(new, weights=weights, mean=[float(x) for x in pbar])


def loss_softmax_update(config: MixerConfig, state: State,
                        inputs: MixerInputs) -> Tuple[List[float], State]:
    """The softmax of each dataset's loss relative to its start (module docstring)."""
    first, last = list(state["first"]), list(state["last"])
    for i, loss in enumerate(inputs.losses):
        if math.isfinite(loss):
            last[i] = float(loss)
            if first[i] is None:
                first[i] = float(loss)
    rho = np.asarray([1.0 if f is None or not f > 0 else lv / f
                      for f, lv in zip(first, last, strict=True)])
    z = (rho - 1.0) / config.param("temperature")
    p = np.asarray(state["start"]) * np.exp(z - z.max())
    weights = apply_floor(p, config.floor)
    return weights, dict(state, updates=state["updates"] + 1, weights=weights, first=first,
                         last=last)


POLICIES: Dict[str, Callable[[MixerConfig, State, MixerInputs], Tuple[List[float], State]]] = {
    "odm": odm_update, "ado": ado_update, "loss_softmax": loss_softmax_update}


def apply_cap(weights: Sequence[float], max_epochs: float, inputs: MixerInputs
              ) -> Tuple[List[float], List[Dict[str, Any]]]:
    """The cap on repetitions: dataset ``i`` may draw ``max_epochs x per_epoch[i] - total[i]``
    more samples, so over the next interval's ``next_samples`` its weight is at most that
    divided by ``next_samples``; a weight above its cap is lowered to it and the excess shared
    by the others in proportion to their weights, until none is above its cap (water filling).
    Returns the weights and one fallback record per lowered dataset (its index, the weight the
    policy gave, the weight drawn, the reason). When every dataset is at its cap the capped
    weights are renormalised (they then draw past the cap), which its record says."""
    w = [float(x) for x in weights]
    if not inputs.next_samples or not inputs.per_epoch:
        return w, []
    cap = [math.inf if not spe else max(max_epochs * spe - n, 0.0) / inputs.next_samples
           for spe, n in zip(inputs.per_epoch, inputs.total, strict=True)]
    capped = [False] * len(w)
    while True:
        over = [i for i, x in enumerate(w) if not capped[i] and x > cap[i]]
        if not over:
            break
        for i in over:
            capped[i] = True
        excess = 1.0 - sum(cap[i] if capped[i] else 0.0 for i in range(len(w)))
        free = sum(weights[i] for i in range(len(w)) if not capped[i])
        w = [cap[i] if capped[i] else (weights[i] * excess / free if free > 0 else 0.0)
             for i in range(len(w))]
    fallback = [{"dataset": i, "weight": float(weights[i]), "capped": w[i],
                 "reason": f"max_epochs {max_epochs:g}: {int(inputs.total[i])} of "
                           f"{max_epochs * inputs.per_epoch[i]:g} samples drawn, "
                           f"{inputs.next_samples} in the next interval"}
                for i in range(len(w)) if capped[i]]
    total = sum(w)
    if total < 1.0 - 1e-12:  # every dataset at its cap: draw past it, as little as may be
        for f in fallback:
            f["reason"] += "; every dataset is at its cap: renormalised, drawn past it"
        w = [x / total for x in w] if total > 0 else [float(x) for x in weights]
    return w, fallback


def update_weights(config: MixerConfig, state: State,
                   inputs: MixerInputs) -> Tuple[List[float], State]:
    """The next weights and state of ``config.policy`` after one interval ``inputs``, under
    ``config.max_epochs`` when set (:func:`apply_cap`: the state's ``weights`` are then the
    capped ones, the weights drawn, and its ``fallback`` says which and why)."""
    weights, new = POLICIES[config.policy](config, state, inputs)
    if config.max_epochs is None:
        return weights, new
    weights, fallback = apply_cap(weights, config.max_epochs, inputs)
    return weights, dict(new, weights=weights, fallback=fallback)
