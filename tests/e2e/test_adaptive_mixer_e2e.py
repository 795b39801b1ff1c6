"""The adaptive mixer end to end in one process (issue 46): a tiny pretraining run whose blend file
has a mixer (interval 2), exported by tools/export_mixture.py as a blend file from which a static
run (no mixer) trains the same losses on the same samples, which tools/data_provenance.py shows
sample for sample, and whose learned weights tools/preview_schedule.py --load prints. The same
with ``target: loss_weight`` (issue 46 item 2): the data drawn is the static blend's at every
iteration, the loss weights move from the first update on, and the resumed run is bitwise the
uninterrupted one, loss weights included. A sampling mixer's exact resume (inside an interval,
after SIGKILL, on DP 2, TP 2 and PP 2 and across them): tests/e2e/test_adaptive_mixer_layouts_e2e.py.
The in-process twins: tests/unit/test_adaptive_mixer.py, tests/unit/test_mixture_export.py,
tests/unit/test_objective_mixer.py."""
import glob
import json
import os
import sys

import pytest

from helpers.launch import read_jsonl, run_single_process
from helpers.paths import ROOT
from helpers.resume import make_pretrain_data, pretrain_flags

ITERS = 8
COMPARED = ("consumed_samples", "lr", "lm_loss", "grad_norm", "per_dataset_loss", "samples_drawn",
            "mixer_weights")


STATIC = """\
train:
  blend:
    - {{path: {web}, split: "0:0.95", weight: 1}}
    - {{path: {code}, split: "0:0.95", weight: 1}}
    - {{path: {math}, split: "0:0.95", weight: 2}}
"""
MIXED = STATIC + "  mixer: {{policy: loss_softmax, interval: 2, floor: 0.05, temperature: 0.05}}\n"
OBJECTIVE = STATIC + "  mixer: {{policy: loss_softmax, interval: 2, floor: 0.05, temperature: 0.05, " \
                     "target: loss_weight}}\n"


def _run(data, run_dir, *extra):
    # two loader workers: they prefetch, so a batch of the old weights would be drawn if the
    # loop did not start a fresh loader at an update (the resumed run would then differ)
    flags = pretrain_flags(data, run_dir, ["--train-iters", str(ITERS), "--eval-iters", "0",
                                           "--num-workers", "2",
                                           "--data-blend-config", data["mixed"], *extra])
    proc = run_single_process("pretrain_gpt.py", flags, timeout=240, check=True)
    return proc.stdout + proc.stderr


def _last_record(run_dir):
    path = sorted(glob.glob(os.path.join(str(run_dir), "ckpt", "*", "data_mix.json")))[-1]
    with open(path) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def adaptive_run(tmp_path_factory):
    """(data, the uninterrupted adaptive run's directory): 8 iterations, a checkpoint at the end."""
    tmp_path = tmp_path_factory.mktemp("mixer")
    data = make_pretrain_data(tmp_path / "data")
    data["mixed"] = str(tmp_path / "data" / "mixed.yaml")
    with open(data["mixed"], "w") as f:
        f.write(MIXED.format(**data))
    whole_dir = tmp_path / "whole"
    log = _run(data, whole_dir, "--save-interval", "100")
    assert "mixer loss_softmax at iteration 2: the weights from global sample 16 are" in log
    return data, whole_dir


def _tool(name):
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    return __import__(name)


@pytest.mark.launch
def test_the_exported_mixture_trains_the_same_samples_as_a_static_run(adaptive_run, tmp_path, capfd):
    data, whole_dir = adaptive_run
    exported = tmp_path / "exported.yaml"
    assert _tool("export_mixture").main(["--load", str(whole_dir / "ckpt"), "--output", str(exported),
                                         "--data-blend-config", data["mixed"]]) == 0
    out = capfd.readouterr().out
    assert "stage 1: from iteration 2 (global sample 16), mixer loss_softmax update: " in out
    static_dir = tmp_path / "static"
    _run(dict(data, mixed=str(exported)), static_dir, "--save-interval", "100")

    adaptive = [r for r in read_jsonl(whole_dir / "metrics.jsonl") if "split" not in r]
    static = [r for r in read_jsonl(static_dir / "metrics.jsonl") if "split" not in r]
    same = [k for k in COMPARED if k != "mixer_weights"]
    for a, b in zip(adaptive, static, strict=True):  # the same samples: the same losses, bitwise
        assert {k: a[k] for k in same} == {k: b[k] for k in same}, a["iteration"]
    assert "mixer_weights" not in static[0]

    flags = lambda run_dir, blend: pretrain_flags(  # noqa: E731
        data, run_dir, ["--train-iters", str(ITERS), "--data-blend-config", blend,
                        "--load", str(run_dir / "ckpt")])
    provenance = _tool("data_provenance")
    traced = {}
    for name, run_dir, blend in (("adaptive", whole_dir, data["mixed"]),
                                 ("static", static_dir, str(exported))):
        path = tmp_path / f"{name}.jsonl"
        provenance.main(flags(run_dir, blend) + ["--iterations", f"1:{ITERS}", "--output", str(path)])
        traced[name] = read_jsonl(path)
    assert len(traced["adaptive"]) == ITERS * 8  # every global sample of the run
    assert traced["static"] == traced["adaptive"]  # dataset, sample, epoch, tokens, documents

    preview = _tool("preview_schedule").main(flags(whole_dir, data["mixed"]))
    record = _last_record(whole_dir)
    segments = [p["mixer"] for p in record["phases"] if "mixer" in p]
    assert [list(u["weights"].values()) for u in preview["mixer_updates"]] == [
        s["weights"] for s in segments]
    err = capfd.readouterr().err
    assert f"mixer loss_softmax at iteration 2: web {segments[0]['weights'][0]:.4f}, " in err


@pytest.mark.launch
def test_a_loss_weight_mixer_keeps_the_static_data_order_and_resumes_bitwise(adaptive_run, tmp_path):
    data, _ = adaptive_run
    files = {}
    for name, text in (("static", STATIC), ("objective", OBJECTIVE)):
        files[name] = str(tmp_path / f"{name}.yaml")
        with open(files[name], "w") as f:
            f.write(text.format(**data))
    per_token = ("--calculate-per-token-loss", "--save-interval", "100")
    _run(dict(data, mixed=files["static"]), tmp_path / "static", *per_token)
    objective = dict(data, mixed=files["objective"])
    log = _run(objective, tmp_path / "whole", *per_token)
    assert "mixer loss_softmax at iteration 2: the loss weights from iteration 3 are" in log
    assert "exiting at iteration 3" in _run(objective, tmp_path / "split", "--exit-interval", "3",
                                            *per_token)
    _run(objective, tmp_path / "split", *per_token, "--load", str(tmp_path / "split" / "ckpt"))

    static, whole, split = ([r for r in read_jsonl(tmp_path / d / "metrics.jsonl") if "split" not in r]
                            for d in ("static", "whole", "split"))
    assert [r["iteration"] for r in split] == list(range(1, ITERS + 1))
    # the data order is the static run's; until the first update so is everything else
    assert [r["samples_drawn"] for r in whole] == [r["samples_drawn"] for r in static]
    assert [(r["lm_loss"], r["grad_norm"]) for r in whole[:2]] == [
        (r["lm_loss"], r["grad_norm"]) for r in static[:2]]
    assert "mixer_loss_weights" not in whole[0]
    weights = [r["mixer_loss_weights"] for r in whole[1:]]
    assert all(w != {"web": 1.0, "code": 1.0, "math": 1.0} for w in weights)
    # trained with them from iteration 3: its gradient, and the model after it, differ
    assert whole[2]["grad_norm"] != static[2]["grad_norm"]
    assert whole[3]["lm_loss"] != static[3]["lm_loss"]
    for a, b in zip(whole, split, strict=True):
        keys = COMPARED + ("mixer_loss_weights",)
        assert {k: a.get(k) for k in keys} == {k: b.get(k) for k in keys}, a["iteration"]
    record, resumed = _last_record(tmp_path / "whole"), _last_record(tmp_path / "split")
    assert len(record["phases"]) == 1  # no phase appended: the sampling stays the blend's
    assert [u["iteration"] for u in record["mixer"]["updates"]] == [2, 4, 6]
    assert resumed["mixer"] == record["mixer"] and resumed["ledger"] == record["ledger"]
