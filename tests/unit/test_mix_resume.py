"""The data ledger and resumes under an edited mix (megatron/data/mix_ledger.py, mix_resume.py,
curriculum/index.py continuations), on fake datasets: a continuation equals a pure reference that
continues every dataset at its ledger position (time-varying weights, datasets added and removed,
a stage appended; static blends against megatron-core's blending rule), epochized stages finish
their repetitions across a resume, and the resume's decisions (same mix, longer run, edit with and
without --override-data-mix) with their messages."""
import json
import os

import numpy as np
import pytest

from helpers.curriculum import fake_constituents as _fake_constituents
from helpers.curriculum import megatron_blend_indices
from helpers.paths import ROOT
from megatron.data.blend_config import parse_blend_config
from megatron.data.curriculum.index import CurriculumIndex
from megatron.data.mix_ledger import EvalGroupCounter, LedgerEntry, MixPhase, MixRecord, blend_from_json, blend_to_json
from megatron.data.mix_resume import DataResume, MixSources, continue_training_mix, eval_group_counters
from megatron.errors import ConfigError
from megatron.schedules.units import BatchSchedule

SEQ, GBS = 16, 4
BS = BatchSchedule(GBS, None, SEQ)


def blend(obj):
    return parse_blend_config({"train": obj}, "t.yaml", check_files=False).train


def fake_constituents(split_blend, spe=10 ** 6):
    return _fake_constituents(split_blend, spe, SEQ)


def index(split_blend, N, begin=0, base=None, spe=10 ** 6, drawn_before=None):
    cons = fake_constituents(split_blend, spe)
    keyed = None if base is None else [base.get(c.path, 0) for c in cons]
    history = None
    if drawn_before is not None:
        history = lambda s: np.asarray([drawn_before(s).get(c.path, 0) for c in cons])  # noqa: E731
    return CurriculumIndex(split_blend, cons, N, BS, begin=begin, base=keyed, drawn_before=history)


def draws(idx):
    """[(dataset path, its sample number)] of the index's global samples, in order."""
    paths = [c.path for c in idx.constituents]
    return [(paths[d], int(k)) for d, k in zip(idx.dataset_index, idx.dataset_sample_index, strict=True)]


def ledger(pairs):
    out = {}
    for path, _ in pairs:
        out[path] = out.get(path, 0) + 1
    return out


def reference_draws(weights_at, stage_of, order, begin, end, base, static=lambda i: False):
    """The largest-deficit rule, restarted at ``begin`` and at every stage start, each dataset
    numbered from its ledger position ``base``: a plain loop, independent of the index's
    segments and kernel. The deficit is ``T(i + 1) - c(i)`` (the target integral with the current
    sample's weight) in a stage whose weights change, megatron-core's ``w * max(i, 1) - c(i)``
    (``i`` counted from the stage start) in a stage of static weights; ties go to the dataset
    listed first, and a dataset is drawn only with a positive weight or deficit."""
    out, counts = [], dict(base)
    target = drawn = None
    for i in range(begin, end):
        if i == begin or stage_of(i) != stage_of(i - 1):
            target, drawn, start = {}, {}, i
        raw = weights_at(i)
        total = sum(raw.values())
        best, best_err = None, 0.0
        for path in order(i):
            w = raw[path] / total
            target[path] = target.get(path, 0.0) + w
            if static(i):
                target[path] = w * max(i - start, 1)
            err = target[path] - drawn.get(path, 0)
            if (best is None or err > best_err) and (w > 0 or err > 0):
                best, best_err = path, err
        drawn[best] = drawn.get(best, 0) + 1
        out.append((best, counts.get(best, 0)))
        counts[best] = counts.get(best, 0) + 1
    return out


# ------------------------------------------------------------------ the continuation itself
X = {"sequential": [
    {"blend": [{"path": "web", "weight": 1}, {"path": "code", "weight": 1},
               {"path": "math", "weight": {"type": "step", "points": {0: 2, 3: 6}}}],
     "until": {"iterations": 8}},
    {"blend": [{"path": "web", "weight": 1}, {"path": "code", "weight": 1}]}]}
# math removed, code's weight changed (a schedule now), "extra" added, a stage appended
Y = {"sequential": [
    {"blend": [{"path": "web", "weight": 1},
               {"path": "code", "weight": {"type": "step", "points": {0: 1, 6: 3}}}],
     "until": {"iterations": 8}},
    {"blend": [{"path": "web", "weight": 1}, {"path": "code", "weight": 1},
               {"path": "extra", "weight": 2}], "until": {"iterations": 12}},
    {"blend": [{"path": "extra", "weight": 1}, {"path": "code", "weight": 1}]}]}


def _y_weights(i):
    it = i // GBS
    if it < 8:
        return {"web": 1, "code": 1 if it < 6 else 3}
    if it < 12:
        return {"web": 1, "code": 1, "extra": 2}
    return {"extra": 1, "code": 1}


def _y_stage(i):
    it = i // GBS
    return 0 if it < 8 else 1 if it < 12 else 2


def test_edited_mix_continues_every_dataset_at_its_ledger_position():
    N, R = 16 * GBS, 5 * GBS  # 16 iterations; the edit takes effect after iteration 5
    first = draws(index(blend(X), N))[:R]
    base = ledger(first)
    cont = index(blend(Y), N, begin=R, base=base)
    assert cont.length == N - R and len(cont.dataset_index) == N - R
    got = draws(cont)
    want = reference_draws(_y_weights, _y_stage, lambda i: list(_y_weights(i)), R, N, base,
                           static=lambda i: _y_stage(i) > 0)
    assert got == want
    # every dataset's samples over both parts: each number once, none skipped
    whole = first + got
    for path in ("web", "code", "math", "extra"):
        numbers = [k for p, k in whole if p == path]
        assert numbers == list(range(len(numbers))), path
    assert {p for p, _ in got} == {"web", "code", "extra"}  # math is no longer drawn
    assert cont.totals.tolist() == [ledger(whole).get(c.path, 0) for c in cont.constituents]
    # the ledger at any point of the continuation
    assert dict(zip([c.path for c in cont.constituents], cont.drawn_before(R + 10), strict=True)) == \
        {p: ledger(whole[:R + 10]).get(p, 0) for p in ("web", "code", "extra")}


def test_a_static_continuation_is_megatron_cores_blend_from_the_resume_point():
    """--data-path weights edited at a resume: megatron-core's blending rule over the rest of
    the run, every dataset numbered on from its ledger position."""
    N, R = 400, 120
    old = {"blend": [{"path": "a", "weight": 0.3}, {"path": "b", "weight": 0.5},
                     {"path": "c", "weight": 0.2}]}
    first = draws(index(blend(old), N))[:R]
    ids, samples = megatron_blend_indices([0.3, 0.5, 0.2], R)
    assert first == [("abc"[d], int(k)) for d, k in zip(ids, samples, strict=True)]
    base = ledger(first)
    new = {"blend": [{"path": "c", "weight": 1}, {"path": "a", "weight": 3}]}
    got = draws(index(blend(new), N, begin=R, base=base))
    ids, samples = megatron_blend_indices([1, 3], N - R)
    assert got == [("ca"[d], base["ca"[d]] + int(k)) for d, k in zip(ids, samples, strict=True)]


def test_an_epochized_stage_running_at_the_resume_finishes_its_repetitions():
    """Stage 0 is epochized; the mix is edited in its middle (stage 1's weights): stage 0 still
    gives each dataset exactly its repetitions (what the run drew before the resume counts),
    then stage 1 follows the new weights."""
    spe = {"a": 30, "b": 50}
    old = {"sequential": [{"epochized_blend": [{"path": "a", "repetitions": 1},
                                               {"path": "b", "repetitions": 2}]},
                          {"blend": [{"path": "a", "weight": 1}, {"path": "b", "weight": 1}]}]}
    new = {"sequential": [old["sequential"][0],
                          {"blend": [{"path": "a", "weight": 3}, {"path": "b", "weight": 1}]}]}
    N, R = 260, 70
    before = draws(index(blend(old), N, spe=spe))
    history = lambda s: ledger(before[:s])  # noqa: E731
    cont = index(blend(new), N, begin=R, base=ledger(before[:R]), spe=spe, drawn_before=history)
    whole = before[:R] + draws(cont)
    stage0 = whole[:130]  # 30 + 2 x 50 samples
    assert ledger(stage0) == {"a": 30, "b": 100}
    ids, samples = megatron_blend_indices([3, 1], N - 130)
    assert whole[130:] == [("ab"[d], {"a": 30, "b": 100}["ab"[d]] + int(k))
                           for d, k in zip(ids, samples, strict=True)]


def test_history_is_required_for_an_epochized_stage_at_the_resume():
    old = {"epochized_blend": [{"path": "a", "repetitions": 1}, {"path": "b", "repetitions": 1}]}
    with pytest.raises(ConfigError, match="runs at the resume point .* needs the run's history"):
        index(blend(old), 60, begin=10, base={"a": 5, "b": 5}, spe={"a": 30, "b": 30})


# ------------------------------------------------------------------ resume decisions
class FakeSource(list):
    def epoch_and_position(self, k):
        return divmod(k, 10 ** 6)


def fake_sources(spe=10 ** 6):
    return MixSources("blend_config", lambda b: fake_constituents(b, spe),
                      lambda c, n, seed: FakeSource(range(n)))


def _record_after(mix, iteration):
    consumed = BS.samples_at_iteration(iteration)
    return MixRecord.from_json(json.loads(json.dumps(mix.record(iteration, consumed).to_json())))


def test_resume_decisions_and_messages():
    sources = fake_sources()
    N = 16 * GBS
    mix = continue_training_mix(sources, blend(X), N, BS, 7, None)
    assert len(mix.phases) == 1 and mix.dataset.begin == 0
    record = _record_after(mix, 5)
    assert {e.name: e.drawn for e in record.ledger} == ledger(draws(mix.dataset.index)[:20])

    # the same mix: the recorded phase, bitwise the same index
    same = continue_training_mix(sources, blend(X), N, BS, 7, DataResume("ckpt", 5, record))
    assert same.phases == record.phases
    assert np.array_equal(same.dataset.dataset_index, mix.dataset.dataset_index)

    # a longer run with weights in absolute progress: the same phase, planned for the new length
    longer = continue_training_mix(sources, blend(X), 2 * N, BS, 7, DataResume("ckpt", 5, record))
    assert len(longer.phases) == 1 and longer.phases[0].num_samples == 2 * N
    assert np.array_equal(longer.dataset.dataset_index[:N], mix.dataset.dataset_index)

    # an edit without --override-data-mix: one error naming every change
    with pytest.raises(ConfigError) as error:
        continue_training_mix(sources, blend(Y), N, BS, 8, DataResume("ckpt", 5, record))
    message = str(error.value)
    for phrase in ("--load ckpt: the training data mix differs", "iteration 5, global sample 20",
                   "--seed 7 -> 8", "stage 0: math removed", "stage 0: code weight 1 -> step {0: 1, 6: 3} (iterations)",
                   "stage 1: until the end of the run -> iterations 12", "stage 1: extra added",
                   "stage 2: added (blend of extra, code, until the end of the run)",
                   "--override-data-mix"):
        assert phrase in message, (phrase, message)

    # an eval-only run draws nothing from the training mix: a note, not an error
    evaluating = continue_training_mix(sources, blend(Y), N, BS, 7,
                                       DataResume("ckpt", 5, record, evaluate_only=True))
    assert "this run only evaluates" in evaluating.notes[0] and "math removed" in evaluating.notes[0]

    # with it: a new phase at the resume point, the table, the ledger carried on
    edited = continue_training_mix(sources, blend(Y), N, BS, 7,
                                   DataResume("ckpt", 5, record, override=True))
    assert [p.begin for p in edited.phases] == [0, 20]
    assert edited.phases[1].begin_iteration == 5
    table = "\n".join(edited.notes)
    assert "math[" not in table and "dataset" in table and "weight old" in table
    rows = {line.split()[0]: line.split()[1:] for line in edited.notes[2:]}
    assert rows["math"][:3] == ["0.7500", "0.0000", str(_key(record, "math"))]  # 6 / (1 + 1 + 6)
    assert rows["extra"][:3] == ["n/a", "0.0000", "0"]
    at_end = {e.name: e.drawn for e in edited.ledger(N)}
    assert at_end["math"] == _key(record, "math")  # removed: its entry stays in the ledger
    assert sum(at_end.values()) == N

    # math comes back at iteration 10: it continues where it stopped
    later = _record_after(edited, 10)
    assert _key(later, "math") == _key(record, "math")
    z = {"blend": [{"path": "web", "weight": 1}, {"path": "math", "weight": 1}]}
    back = continue_training_mix(sources, blend(z), N, BS, 7,
                                 DataResume("ckpt", 10, later, override=True))
    assert [p.begin for p in back.phases] == [0, 20, 40]
    math = [k for p, k in draws(back.dataset.index) if p.endswith("math")]
    assert math[:3] == [_key(record, "math") + i for i in range(3)]


def _key(record, name):
    return next(e.drawn for e in record.ledger if e.name == name)


def test_record_round_trip_and_blend_json():
    split_blend = blend(Y)
    as_json = json.loads(json.dumps(blend_to_json(split_blend)))
    assert json.loads(json.dumps(blend_to_json(blend_from_json(as_json)))) == as_json
    entry = LedgerEntry("web", "/d/web", (0.0, 0.9), "fp", 100, 250, 2, 50)
    phase = MixPhase(40, as_json, 400, {"global_batch_size": 4, "rampup": None,
                                                          "seq_length": 16, "steps": None},
                     3, [entry], 10)
    record = MixRecord("data_path", 20, 80, [phase], [entry])
    back = MixRecord.from_json(json.loads(json.dumps(record.to_json())))
    assert back.to_json() == record.to_json() and back.phases[0].base_counts() == {entry.key: 250}
    with pytest.raises(ConfigError, match="data ledger version 9 is not supported"):
        MixRecord.from_json(dict(record.to_json(), version=9))


def test_eval_groups_added_at_a_resume_start_at_their_first_window():
    mix_record = MixRecord("blend_config", 30, 120, [], [], [EvalGroupCounter("valid", "web", 0)])
    counters, notes = eval_group_counters(mix_record, [("valid", "web"), ("valid", "code")], 30, 10)
    assert [(c.name, c.first_evaluation) for c in counters] == [("web", 0), ("code", 3)]
    assert any("'code' is new" in n for n in notes)
    counters, notes = eval_group_counters(mix_record, [("valid", "code")], 30, 10)
    assert any("'web' of the checkpoint is not evaluated any more" in n for n in notes)


def test_a_ledger_that_disagrees_with_the_index_is_refused(tmp_path):
    """The same mix whose rebuilt index draws otherwise than the checkpoint's ledger says; a
    data_mix.json that is not JSON; an earlier phase whose datasets cannot be read again."""
    from megatron.checkpoint.format import read_data_mix
    from megatron.data.mix_resume import MixHistory

    sources = fake_sources()
    mix = continue_training_mix(sources, blend(X), 64, BS, 7, None)
    record = _record_after(mix, 5)
    web = next(e for e in record.ledger if e.name == "web")
    web.drawn += 1
    with pytest.raises(ConfigError, match=f"data ledger says web gave {web.drawn} samples by "
                                          "global sample 20, but the index rebuilt from the same "
                                          f"mix gives {web.drawn - 1}"):
        continue_training_mix(sources, blend(X), 64, BS, 7, DataResume("ckpt", 5, record))
    taken = continue_training_mix(sources, blend(X), 64, BS, 7,
                                  DataResume("ckpt", 5, record, override=True))
    assert [p.begin for p in taken.phases] == [0, 20] and "continuing from the ledger" in taken.notes[0]
    assert taken.ledger(20)[0].drawn == web.drawn  # the ledger is the truth
    (tmp_path / "data_mix.json").write_text("{not json")
    with pytest.raises(ConfigError, match="data_mix.json: not a readable JSON file"):
        read_data_mix(str(tmp_path))
    assert read_data_mix(str(tmp_path / "none")) is None

    def gone(_):
        raise ConfigError("dataset file 'web.bin' does not exist")

    history = MixHistory(record.phases, MixSources("blend_config", gone, None))
    with pytest.raises(ConfigError, match=r"data ledger phase 0 \(global samples from 0\): its "
                                          "datasets cannot be read again: dataset file"):
        history.drawn_before(10)


def test_phase_transition_and_provenance_flags_are_checked(tmp_path):
    import sys

    from megatron.config.arguments import validate_args
    from megatron.config.parser import get_parser
    from megatron.errors import ArgumentError
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import data_provenance

    base = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2",
            "--seq-length", "16", "--micro-batch-size", "1", "--train-iters", "8", "--lr", "1e-3"]

    def validated(*flags):
        return validate_args(get_parser().parse_args(base + list(flags)), 1, require_data=False)

    assert validated("--phase-transition-iterations", "6,2", "4").phase_transition_iterations == [2, 4, 6]
    assert validated().phase_transition_iterations is None
    with pytest.raises(ArgumentError, match=r"--phase-transition-iterations: 'x' is not an "
                                            r"iteration number \(give e.g. 1000,5000\)"):
        validated("--phase-transition-iterations", "10,x")
    with pytest.raises(ArgumentError, match="iteration 0 must be positive"):
        validated("--phase-transition-iterations", "0")
    assert data_provenance.parse_iterations("3:7") == (3, 7)
    for bad in ("5:2", "0:3", "x", "1:2:3"):
        with pytest.raises(ArgumentError, match=f"--iterations '{bad}': give A:B with 1 <= A <= B"):
            data_provenance.parse_iterations(bad)
    with pytest.raises(ArgumentError, match=r"--iterations 1:99: the run has 8 iterations"):
        data_provenance.main(base + ["--data-path", "x", "--load", str(tmp_path),
                                     "--iterations", "1:99", "--output", str(tmp_path / "p")])


@pytest.mark.parametrize("override", [False, True])
def test_a_smaller_global_batch_at_a_resume_covers_the_remaining_iterations(override):
    """Issue 45: 6 iterations at 16 sequences (96 samples), resumed for 12 iterations at 4
    sequences. The run draws 96 + 6 x 4 = 120 samples, not the 12 x 4 = 48 of a run at 4
    sequences from the start (which raised "begin 96 outside [0, num_samples 48]")."""
    sources = fake_sources()
    big = BatchSchedule(16, None, SEQ)
    mix = continue_training_mix(sources, blend(X), 12 * 16, big, 7, None)
    record = MixRecord.from_json(json.loads(json.dumps(mix.record(6, 96).to_json())))
    small = BatchSchedule(4, None, SEQ)
    resumed = continue_training_mix(sources, blend(X if not override else Y), 12 * 4, small, 7,
                                    DataResume("ckpt", 6, record, override=override))
    assert resumed.dataset.begin == (96 if override else resumed.dataset.begin)
    assert len(resumed.dataset) >= 120
    # the datasets continue at their ledger positions: samples 96.. draw no sample twice
    before = ledger(draws(mix.dataset.index)[:96])
    after = draws(resumed.dataset.index)[96 - resumed.dataset.begin:120 - resumed.dataset.begin]
    first = {}
    for path, k in after:
        first.setdefault(path, k)
    for path, k in first.items():
        assert k == before.get(path, 0), (path, k, before)


def test_a_mixer_is_recorded_with_its_blend_and_adding_one_is_an_edit():
    """The mixer (issue 46) travels in the ledger's blend JSON (absent without one: older
    ledgers unchanged) and a resume that adds, drops or changes it lists the change."""
    x = {"blend": [{"path": "web", "weight": 1}, {"path": "code", "weight": 3}]}
    mixed = dict(x, mixer={"policy": "odm", "interval": 2, "floor": 0.1})
    capped = dict(x, mixer={"policy": "odm", "interval": 2, "max_epochs": 1.5})
    assert blend_from_json(json.loads(json.dumps(blend_to_json(blend(capped))))).mixer == \
        blend(capped).mixer
    as_json = json.loads(json.dumps(blend_to_json(blend(mixed))))
    assert as_json["mixer"] == {"policy": "odm", "interval": 2, "floor": 0.1, "reward_scale": 10.0,
                                "smoothing": 0.9}
    assert "mixer" not in blend_to_json(blend(x))
    back = blend_from_json(as_json)
    assert back.mixer == blend(mixed).mixer
    assert json.loads(json.dumps(blend_to_json(back))) == as_json
    sources = fake_sources()
    mix = continue_training_mix(sources, blend(x), 16 * GBS, BS, 7, None)
    record = _record_after(mix, 5)
    with pytest.raises(ConfigError) as error:
        continue_training_mix(sources, blend(mixed), 16 * GBS, BS, 7, DataResume("ckpt", 5, record))
    assert "mixer none -> {floor: 0.1, interval: 2, policy: odm" in str(error.value)
