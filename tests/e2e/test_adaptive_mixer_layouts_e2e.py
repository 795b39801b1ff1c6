"""The adaptive mixer's exact resume beyond one process (issue 46 item 3; one process:
tests/e2e/test_adaptive_mixer_e2e.py). Seven 2-rank launches of a tiny GPT (2 layers, so PP 2
splits it) whose blend file has a sampling mixer (loss_softmax, interval 2: updates at iterations
2, 4 and 6), 8 iterations, two loader workers per rank, through the real ``deepspeed`` launcher:

1. the reference on DP 2, saving at iteration 3 (inside the update interval [2, 4]) and 6;
2. its iteration-3 checkpoint resumed on DP 2, saving at 5, SIGKILLed (every rank, loader worker
   and the launcher) once iteration 6 is logged: inside the interval [6, 8];
3. that run resumed on DP 2 from its iteration-5 checkpoint (inside [4, 6]) to the end: every
   iteration 4..8 of 2 and 3 is bitwise the reference's (losses, gradient norms, per-dataset
   losses, samples drawn, mixer weights), so are the final ``data_mix.json`` and every global
   sample's dataset, sample and documents (tools/data_provenance.py);
4. / 6. the reference's iteration-3 checkpoint resumed on TP 2 / PP 2 (resharded from DP 2), saving
   at 5: the same samples as the reference at every iteration (samples drawn, every global
   sample's provenance, the ledger), the same updates at the same iterations with the same
   inputs drawn, and losses, gradient norms and weights within rounding (:data:`LOSS_REL`,
   :data:`WEIGHT_REL`);
5. / 7. each resumed on its own layout from its iteration-5 checkpoint: bitwise that layout's run.
"""
import json
import shutil
from typing import Dict

import pytest

from helpers.launch import own_shm_buffers, read_jsonl, run_and_sigkill, run_deepspeed
from helpers.resume import make_pretrain_data, pretrain_flags

ITERS = 8
TEMPERATURE = 0.05
MIXED = """\
train:
  blend:
    - {{path: {web}, split: "0:0.95", weight: 1}}
    - {{path: {code}, split: "0:0.95", weight: 1}}
    - {{path: {math}, split: "0:0.95", weight: 2}}
  mixer: {{policy: loss_softmax, interval: 2, floor: 0.05, temperature: {temperature}}}
"""
COMPARED = ("consumed_samples", "consumed_tokens", "lr", "lm_loss", "grad_norm", "per_dataset_loss",
            "loss_token_share", "samples_drawn", "mixer_weights")
LAYOUTS = {"tp2": ["--tensor-model-parallel-size", "2"],
           "pp2": ["--pipeline-model-parallel-size", "2"]}
# Across layouts the model's sums run in another order (TP 2: split matmuls; PP 2 and TP 2: four
# micro batches accumulated on one replica, not two on each of two), so its float32 values differ
# in the last bits, which a few steps carry forward. Measured here (iterations 4-8 of TP 2 and PP 2
# against DP 2): at most 6.1e-8 relative on a per-dataset loss, 2.4e-8 on the loss, 6.1e-8 on a
# gradient norm. LOSS_REL is 16x that; a lost interval in progress or optimizer state moves them by
# 1e-3 and more. loss_softmax's weights are softmax(rho / temperature), rho a dataset's loss over
# its first: a relative error e of the losses moves them by about e / temperature relative
# (measured: at most 3.2e-7), hence WEIGHT_REL.
LOSS_REL = 1e-6
WEIGHT_REL = LOSS_REL / TEMPERATURE


@pytest.fixture(scope="module")
def mixer_data(tmp_path_factory) -> Dict[str, str]:
    """The demo datasets and the mixer's blend file (``mixed``)."""
    directory = tmp_path_factory.mktemp("mixer_layouts_data")
    data = make_pretrain_data(directory)
    data["mixed"] = str(directory / "mixed.yaml")
    with open(data["mixed"], "w") as f:
        f.write(MIXED.format(temperature=TEMPERATURE, **data))
    return data


def _flags(data, run_dir, *extra):
    return pretrain_flags(data, run_dir, [
        "--train-iters", str(ITERS), "--eval-iters", "0", "--num-layers", "2",
        "--num-workers", "2", "--data-blend-config", data["mixed"], *extra])


def _checkpoint_at(ckpt, iteration: int, load_dir):
    """A new --load directory holding ``ckpt``'s checkpoint of ``iteration`` alone (its tracker
    file names it)."""
    load_dir.mkdir(parents=True)
    tag = f"iter_{iteration:07d}"
    shutil.copytree(ckpt / tag, load_dir / tag)
    (load_dir / "latest_checkpointed_iteration.txt").write_text(f"{iteration}\n")
    return load_dir


def _records(path):
    return [r for r in read_jsonl(path) if "split" not in r]


def _final_record(run_dir) -> dict:
    """The ``data_mix.json`` of ``run_dir``'s checkpoint at the end of the run."""
    with open(run_dir / "ckpt" / f"iter_{ITERS:07d}" / "data_mix.json") as f:
        return json.load(f)


def _assert_bitwise(got, want):
    assert [r["iteration"] for r in got] == [r["iteration"] for r in want]
    for g, w in zip(got, want, strict=True):
        assert {k: g[k] for k in COMPARED} == {k: w[k] for k in COMPARED}, g["iteration"]


def _traced(data, run_dir):
    """Every global sample of the run in ``run_dir`` (its final checkpoint's ledger):
    tools/data_provenance.py's records (iteration, global sample, dataset, sample, epoch, tokens,
    documents)."""
    from tools import data_provenance  # lazy: the tool's imports, only for the tests that trace

    out = run_dir / "provenance.jsonl"
    data_provenance.main(pretrain_flags(data, run_dir, [
        "--train-iters", str(ITERS), "--data-blend-config", data["mixed"],
        "--load", str(run_dir / "ckpt"), "--iterations", f"1:{ITERS}", "--output", str(out)]))
    return read_jsonl(out)


def _float_gaps(got, want, where="") -> Dict[str, float]:
    """Walk two JSON values: every leaf but a float (keys, lengths, ints, strings) equal; returns
    ``{where: relative difference}`` of each float leaf."""
    if isinstance(want, (dict, list)):
        assert type(got) is type(want) and (sorted(got) == sorted(want) if isinstance(want, dict)
                                             else len(got) == len(want)), (where, got, want)
        pairs = ([(f"{where}.{k}", got[k], v) for k, v in want.items()] if isinstance(want, dict)
                 else [(f"{where}[{i}]", g, w) for i, (g, w) in enumerate(zip(got, want, strict=True))])
        gaps = {}
        for name, g, w in pairs:
            gaps.update(_float_gaps(g, w, name))
        return gaps
    if isinstance(want, float):
        assert isinstance(got, float), (where, got, want)
        return {where: abs(got - want) / abs(want) if want else abs(got)}
    assert got == want, (where, got, want)
    return {}


def _in_nats(record: dict) -> dict:
    """A ``data_mix.json`` with its interval in progress' loss sums (int multiples of
    2**-scale_bits, megatron/train/mixer_sums.py) as floats, compared within rounding as the
    losses are; their weights (the samples' counts) stay exact."""
    record = json.loads(json.dumps(record))
    progress = record["mixer"]
    progress["sums"] = [s / 2 ** progress["scale_bits"] for s in progress["sums"]]
    return record


def _assert_within_rounding(gaps: Dict[str, float]) -> None:
    """Weights (a key naming them) within WEIGHT_REL, every other float within LOSS_REL."""
    too_far = {k: v for k, v in gaps.items() if v > (WEIGHT_REL if "weight" in k else LOSS_REL)}
    assert not too_far, too_far


@pytest.fixture(scope="module")
def dp2_run(mixer_data, tmp_path_factory):
    """Launch 1, the reference: DP 2, checkpoints at iterations 3, 6 and the end."""
    run_dir = tmp_path_factory.mktemp("dp2")
    proc = run_deepspeed("pretrain_gpt.py", _flags(mixer_data, run_dir, "--save-interval", "3"))
    assert ("tensor-parallel 1, pipeline-parallel 1, data-parallel 2, ZeRO stage 1, "
            "micro-batches per iteration 2") in proc.stdout
    records = _records(run_dir / "metrics.jsonl")
    assert [r["iteration"] for r in records] == list(range(1, ITERS + 1))
    assert records[0]["mixer_weights"] == {"web": 0.25, "code": 0.25, "math": 0.5}  # the file's
    segments = [p["mixer"] for p in _final_record(run_dir)["phases"] if "mixer" in p]
    assert [s["iteration"] for s in segments] == [2, 4, 6]
    assert len({tuple(s["weights"]) for s in segments}) == 3  # the mix moved at every update
    assert len({tuple(r["samples_drawn"].values()) for r in records}) == ITERS
    return run_dir, records


@pytest.mark.launch
def test_a_dp2_mixer_run_sigkilled_inside_an_interval_resumes_bitwise(dp2_run, mixer_data, tmp_path):
    """Launches 2 and 3: the reference's iteration-3 checkpoint resumed, the run SIGKILLed inside
    the interval [6, 8] and resumed again from iteration 5: iterations 4..8 are the reference's,
    bit for bit, and so are the final data record and every sample drawn."""
    ref_dir, reference = dp2_run
    run_dir = tmp_path / "killed"
    load = _checkpoint_at(ref_dir / "ckpt", 3, tmp_path / "load")
    port = run_and_sigkill("pretrain_gpt.py",
                           _flags(mixer_data, run_dir, "--save-interval", "5", "--load", str(load)),
                           run_dir / "metrics.jsonl", 6, tmp_path / "killed.log")
    assert own_shm_buffers(port) == []
    log = (tmp_path / "killed.log").read_text()
    assert f"resumed from --load {load} at iteration 3, consumed samples 24" in log
    before = _records(run_dir / "metrics.jsonl")
    assert 6 <= before[-1]["iteration"] < ITERS  # killed after the update at 6, before the end
    _assert_bitwise(before, reference[3:before[-1]["iteration"]])
    assert (run_dir / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip() == "5"

    flags = _flags(mixer_data, run_dir, "--save-interval", "5", "--load", str(run_dir / "ckpt"))
    flags[flags.index("--metrics-jsonl") + 1] = str(tmp_path / "resumed.jsonl")
    proc = run_deepspeed("pretrain_gpt.py", flags)
    assert f"resumed from --load {run_dir / 'ckpt'} at iteration 5, consumed samples 40" in proc.stdout
    _assert_bitwise(_records(tmp_path / "resumed.jsonl"), reference[5:])
    assert _final_record(run_dir) == _final_record(ref_dir)  # phases, ledger, interval in progress
    assert _traced(mixer_data, run_dir) == _traced(mixer_data, ref_dir)


@pytest.fixture(scope="module", params=list(LAYOUTS))
def layout_run(request, dp2_run, mixer_data, tmp_path_factory):
    """Launches 4 and 6: the reference's iteration-3 checkpoint resumed on TP 2 or PP 2 (its
    parameters and optimizer state resharded), checkpoints at 5 and the end: (layout, its run
    directory, its records)."""
    name = request.param
    ref_dir, _ = dp2_run
    run_dir = tmp_path_factory.mktemp(name)
    load = _checkpoint_at(ref_dir / "ckpt", 3, run_dir / "load")
    proc = run_deepspeed("pretrain_gpt.py", _flags(mixer_data, run_dir, *LAYOUTS[name],
                                                   "--save-interval", "5", "--load", str(load)))
    layout = {"tp2": "tensor-parallel 2, pipeline-parallel 1",
              "pp2": "tensor-parallel 1, pipeline-parallel 2"}[name]
    assert (f"resharded {load / 'iter_0000003'} (tensor-parallel 1, pipeline-parallel 1, "
            f"data-parallel 2, ZeRO stage 1) to {layout}, data-parallel 1") in proc.stdout
    assert f"resumed from --load {load} at iteration 3, consumed samples 24" in proc.stdout
    return name, run_dir, _records(run_dir / "metrics.jsonl")


@pytest.mark.launch
def test_a_resume_on_another_layout_draws_the_same_samples_within_rounding(layout_run, dp2_run,
                                                                          mixer_data):
    """TP 2 / PP 2 from the DP 2 checkpoint of iteration 3: every iteration 4..8 draws the
    reference's samples; the updates at 4 and 6 are made from the same drawn counts into the
    same phases (ledger positions), their losses and weights, the run's losses and gradient
    norms within rounding (:data:`LOSS_REL`, :data:`WEIGHT_REL`)."""
    _, run_dir, records = layout_run
    ref_dir, reference = dp2_run
    assert [r["iteration"] for r in records] == list(range(4, ITERS + 1))
    assert [r["samples_drawn"] for r in records] == [r["samples_drawn"] for r in reference[3:]]
    gaps = {}
    for g, w in zip(records, reference[3:], strict=True):
        gaps.update(_float_gaps({k: g[k] for k in COMPARED}, {k: w[k] for k in COMPARED},
                                f"iteration {w['iteration']}"))
    _assert_within_rounding(gaps)
    got, want = _final_record(run_dir), _final_record(ref_dir)
    assert got["ledger"] == want["ledger"] and got["mixer"]["drawn"] == want["mixer"]["drawn"]
    segments = [(p["begin"], p["base"], p["mixer"]["iteration"], p["mixer"]["drawn"], p["mixer"]["remaining"])
                for p in got["phases"] if "mixer" in p]
    assert segments == [(p["begin"], p["base"], p["mixer"]["iteration"], p["mixer"]["drawn"],
                         p["mixer"]["remaining"]) for p in want["phases"] if "mixer" in p]
    assert [s[2] for s in segments] == [2, 4, 6]
    _assert_within_rounding(_float_gaps(_in_nats(got), _in_nats(want), "data_mix.json"))
    assert _traced(mixer_data, run_dir) == _traced(mixer_data, ref_dir)  # sample for sample


@pytest.mark.launch
def test_a_resume_on_that_layout_is_bitwise(layout_run, mixer_data, tmp_path):
    """Launches 5 and 7: the TP 2 / PP 2 run resumed on its own layout from its checkpoint of
    iteration 5 (inside the interval [4, 6]): iterations 6..8 and the final data record are that
    run's, bit for bit."""
    name, run_dir, records = layout_run
    load = _checkpoint_at(run_dir / "ckpt", 5, tmp_path / "load")
    proc = run_deepspeed("pretrain_gpt.py", _flags(mixer_data, tmp_path, *LAYOUTS[name],
                                                   "--save-interval", "5", "--load", str(load)))
    assert f"resumed from --load {load} at iteration 5, consumed samples 40" in proc.stdout
    assert "resharded" not in proc.stdout
    _assert_bitwise(_records(tmp_path / "metrics.jsonl"), records[2:])
    assert _final_record(tmp_path) == _final_record(run_dir)
