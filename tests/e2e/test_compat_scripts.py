"""The launch scripts of examples/compat/: public BigScience, Megatron-LM and Microsoft
Megatron-DeepSpeed scripts' flags at tiny sizes. Every flag of every script parses (in-process,
fast); each script trains 3 iterations through the ``deepspeed`` launcher with 2 CPU ranks, with
what its flags promise (batch rampups, token budgets, a finetune from the pretraining checkpoint
with reset counters, an eval-only run, DeepSpeed's sequence-length curricula); flags this project
does not build are refused in one line that names them and the replacement.

All scripts share one module-scoped data directory (tools/make_compat_data.py). A script writes its
entry point and flags instead of launching when ``COMPAT_ARGS_FILE`` is set (examples/compat/common.sh).
"""
import glob
import itertools
import json
import os
import re
import subprocess
import sys
from typing import Dict, List, Tuple

import pytest

from helpers.launch import own_shm_buffers, read_jsonl
from helpers.paths import ROOT
from helpers.ports import free_port

SCRIPT_DIR = os.path.join(ROOT, "examples", "compat")
# name -> (script, environment)
SCRIPTS = {
    "tr11": ("bigscience_tr11_bloom_pretrain.sh", {}),
    "tr13": ("bigscience_tr13_bloomz_finetune.sh", {}),
    "tr13_eval_only": ("bigscience_tr13_bloomz_eval_only.sh", {}),
    "gpt3_2024": ("megatron_lm_gpt3_175b.sh", {"FLAG_SET": "2024"}),
    "gpt3_2026": ("megatron_lm_gpt3_175b.sh", {"FLAG_SET": "2026"}),
    "ms_gpt": ("microsoft_gpt_pretrain.sh", {}),
    "ms_llama2": ("microsoft_llama2_pretrain.sh", {}),
    "ms_sequence_parallel": ("microsoft_sequence_parallel.sh", {}),
    "ms_moe": ("microsoft_moe_pretrain.sh", {}),
    "ms_curriculum_slw": ("microsoft_curriculum_slw.sh", {}),
    "ms_data_efficiency": ("microsoft_data_efficiency_seqlen.sh", {}),
}
ITERATION_LINE = re.compile(r" iteration +(\d+)/ +(\d+) \|")


@pytest.fixture(scope="module")
def compat_data(tmp_path_factory) -> str:
    """The tokenizers and datasets of tools/make_compat_data.py, made once for the module."""
    from tools.make_compat_data import make_compat_data
    # the scripts set up the venv through tools/cpu_env.sh: never let them reinstall this one
    stamp = subprocess.run(["sha1sum", os.path.join(ROOT, "pyproject.toml")], capture_output=True,
                           text=True, check=True).stdout[:12]
    if not os.path.exists(os.path.join(sys.prefix, f".installed-{stamp}")):
        pytest.skip(f"{sys.prefix} was installed for another pyproject.toml; the scripts would "
                    "reinstall it")
    path = str(tmp_path_factory.mktemp("compat_data"))
    make_compat_data(path, verbose=False)
    return path


def _env(compat_data: str, **extra) -> Dict[str, str]:
    env = dict(os.environ, COMPAT_DATA=compat_data, VENV=sys.prefix, MASTER_PORT=str(free_port()))
    env.update(extra)
    return env


def script_flags(name: str, compat_data: str, out_dir: str, extra=(), **env) -> List[str]:
    """The entry point and flags the script ``name`` would launch (COMPAT_ARGS_FILE)."""
    script, script_env = SCRIPTS[name]
    args_file = os.path.join(out_dir, "args.bin")
    os.makedirs(out_dir, exist_ok=True)
    proc = subprocess.run(["bash", os.path.join(SCRIPT_DIR, script), out_dir, *extra], cwd=ROOT,
                          env=_env(compat_data, COMPAT_ARGS_FILE=args_file, **script_env, **env),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(args_file, "rb") as f:
        return [a.decode() for a in f.read().split(b"\0")[:-1]]


def parse_in_process(flags: List[str], monkeypatch):
    """Parse and validate ``[entry point, flags...]`` as the entry point does, for 2 ranks."""
    import torch.distributed

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("RANK", raising=False)
    # Flags are parsed before torch.distributed starts: hide a process group an earlier test of
    # this session may have started (its store would count this error as already reported).
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    entry_point, argv = flags[0], flags[1:]
    if entry_point == "finetune_t0.py":
        from finetune_t0 import parse_t0_args
        return parse_t0_args(argv)
    assert entry_point == "pretrain_gpt.py", entry_point
    from megatron.config.parser import parse_args
    return parse_args(argv)


@pytest.mark.launch
@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_every_flag_of_the_script_parses(name, compat_data, tmp_path, monkeypatch, capsys):
    """The script's flags parse and validate for 2 ranks, and each is a flag of its public
    original (or one the scripts add, with the reason in their header), so it is in the table of
    docs/compatibility.md."""
    from tools.compat_table import ADDED_FLAGS, SOURCES

    flags = script_flags(name, compat_data, str(tmp_path / name))
    try:
        args = parse_in_process(flags, monkeypatch)
    except SystemExit as e:
        pytest.fail(f"{SCRIPTS[name][0]}: exit {e.code}: {capsys.readouterr().err.strip()}")
    assert args.num_layers == 2 and args.hidden_size == 64 and args.seq_length == 64
    script, env = SCRIPTS[name]
    source, = [s for s in SOURCES if script in s.compat_script
               and env.get("FLAG_SET", "") in s.key]
    given = {f.split("=")[0] for f in flags[1:] if f.startswith("--")}
    not_in_original = given - set(source.flags) - ADDED_FLAGS
    assert not_in_original == set(), (source.key, sorted(not_in_original))
    # the inert flags given are named in one start-up note
    from megatron.config.flag_compat import compat_flag
    inert = sorted(f for f in given if compat_flag(f) and compat_flag(f).status == "inert")
    notes = [n for n in args.run_config.notes if n.startswith("accepted without effect here")]
    if inert:
        assert len(notes) == 1 and all(f in notes[0] for f in inert), (inert, notes)


@pytest.mark.launch
def test_flag_set_must_be_known(compat_data, tmp_path):
    proc = subprocess.run(["bash", os.path.join(SCRIPT_DIR, "megatron_lm_gpt3_175b.sh"),
                           str(tmp_path)], cwd=ROOT, env=_env(compat_data, FLAG_SET="2025"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "FLAG_SET=2025: expected 2024 or 2026" in proc.stderr


@pytest.mark.launch
@pytest.mark.parametrize("name", ["gpt3_2026", "ms_gpt", "ms_moe", "ms_curriculum_slw",
                                  "ms_data_efficiency"])
def test_original_fp16_is_refused_on_cpu_in_one_line(name, compat_data, tmp_path, monkeypatch,
                                                     capsys):
    """PRECISION=fp16 restores the original's --fp16 (and, for Microsoft's, the JSON's fp16
    section); on an accelerator without fp16 (DeepSpeed's CPU accelerator on a CPU without
    oneDNN fp16, which is most of them; it is made so here, whatever this machine has) it stops
    in one line pointing at --bf16."""
    from deepspeed.accelerator import get_accelerator

    monkeypatch.setattr(type(get_accelerator()), "is_fp16_supported", lambda self: False)
    flags = script_flags(name, compat_data, str(tmp_path), PRECISION="fp16")
    assert "--fp16" in flags and "--bf16" not in flags
    with pytest.raises(SystemExit) as exit_info:
        parse_in_process(flags, monkeypatch)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--fp16" in err and "--bf16" in err, err
    if name in ("ms_curriculum_slw", "ms_data_efficiency"):  # the template as Microsoft fills it
        _, config = written_deepspeed_config(str(tmp_path))
        assert config["fp16"]["enabled"] is True and "bf16" not in config


@pytest.mark.launch
def test_ms_data_efficiency_refuses_random_ltd(compat_data, tmp_path, monkeypatch, capsys):
    """The data-efficiency script keeps random-LTD off, as the original's "CL seqlen truncation"
    setup; LTD_ENABLED=true (the original's ltd_enabled) adds --random-ltd, which stops the run in
    one line naming it."""
    flags = script_flags("ms_data_efficiency", compat_data, str(tmp_path), LTD_ENABLED="true")
    assert "--random-ltd" in flags
    with pytest.raises(SystemExit) as exit_info:
        parse_in_process(flags, monkeypatch)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--random-ltd" in err, err


REFUSED = [  # extra flags given to the sequence-parallel script, and the flags among them
    (["--ds-sequence-parallel-fpdt", "--ds-sequence-parallel-fpdt-chunk-size", "65536",
      "--ds-sequence-parallel-fpdt-offloading"],
     ["--ds-sequence-parallel-fpdt", "--ds-sequence-parallel-fpdt-chunk-size",
      "--ds-sequence-parallel-fpdt-offloading"]),
]


@pytest.mark.launch
@pytest.mark.parametrize("extra,named", REFUSED, ids=["fpdt"])
def test_sequence_parallel_script_refuses_fpdt(extra, named, compat_data, tmp_path,
                                               monkeypatch, capsys):
    """The 6.7B script's FPDT flags (left out of the runnable script) fail together in one line
    naming each of them and what to use instead (plain DeepSpeed-Ulysses)."""
    from megatron.config.flag_compat import compat_flag

    flags = script_flags("ms_sequence_parallel", compat_data, str(tmp_path), extra=extra)
    with pytest.raises(SystemExit) as exit_info:
        parse_in_process(flags, monkeypatch)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for flag in named:
        assert flag in err and compat_flag(flag).use_instead in err, (flag, err)
    assert "--ds-sequence-parallel-size N (DeepSpeed-Ulysses)" in err, err


MOE_SIBLINGS = {  # extra flags of the MoE script's PR-MoE and MoS siblings, what the error names
    "pr_moe": (["--num-experts", "4", "8", "--mlp-type", "residual"],
               ["--mlp-type residual", "--moe-shared-expert-intermediate-size",
                "--num-experts 4 8", "--num-experts N with --moe-layer-freq or --expert-interval"]),
    "mos": (["--mos", "--kd-beta-ce", "1", "--num-layers-teacher", "4", "--hidden-size-teacher",
             "64", "--num-attention-heads-teacher", "4", "--load-teacher", "teacher"],
            ["--mos", "--kd-beta-ce 1", "--num-layers-teacher 4", "--hidden-size-teacher 64",
             "--num-attention-heads-teacher 4", "--load-teacher teacher",
             "pretraining without a teacher"]),
}


@pytest.mark.launch
@pytest.mark.parametrize("name", sorted(MOE_SIBLINGS))
def test_moe_script_siblings_are_refused(name, compat_data, tmp_path, monkeypatch, capsys):
    """The PR-MoE scripts' per-layer expert counts and residual MoE, and the Mixture-of-Students
    scripts' distillation flags, added to the MoE script, stop it in one line naming each flag
    and what to use instead."""
    extra, named = MOE_SIBLINGS[name]
    flags = script_flags("ms_moe", compat_data, str(tmp_path), extra=extra)
    with pytest.raises(SystemExit) as exit_info:
        parse_in_process(flags, monkeypatch)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for fragment in named:
        assert fragment in err, (fragment, err)


def test_split_without_documents_is_an_error(demo_data):
    """Megatron-LM's --split 949,50,1 on a prefix of fewer than 500 documents leaves the test
    split no document: one error naming --split and the prefix (megatron-core would loop forever);
    a split where every share has documents passes."""
    from megatron.data.builder import check_split_has_documents
    from megatron.errors import ConfigError

    prefix = demo_data["web"]
    with open(prefix + ".idx", "rb") as f:
        f.seek(18)
        n = int.from_bytes(f.read(8), "little")
    assert 3 <= n < 500
    check_split_has_documents([prefix], "34,33,33")
    check_split_has_documents(["1", prefix], "949,51,0")  # a zero share is skipped
    with pytest.raises(ConfigError) as err:
        check_split_has_documents([prefix], "949,50,1")
    assert str(err.value) == (
        f"--split 949,50,1: the test split (0.999 to 1 of the documents) selects none of the {n} "
        f"documents of --data-path prefix {prefix!r}; give more documents or a larger test share "
        "(or share 0)")


# --------------------------------------------------------------------------- launches


def run_script(name: str, compat_data: str, out_dir: str, extra=(), **env) -> str:
    """Run the script ``name`` through the deepspeed launcher (2 CPU ranks); returns its log."""
    script, script_env = SCRIPTS[name]
    port = free_port()
    os.makedirs(out_dir, exist_ok=True)
    proc = subprocess.run(["bash", os.path.join(SCRIPT_DIR, script), out_dir, *extra], cwd=ROOT,
                          env=_env(compat_data, MASTER_PORT=str(port), **script_env, **env),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    log = proc.stdout
    with open(os.path.join(out_dir, "launch.log"), "w") as f:
        f.write(log)
    assert proc.returncode == 0, f"{script} exited {proc.returncode}\n{log[-8000:]}"
    assert "unrecognized arguments" not in log and "error:" not in log, log[-4000:]
    assert own_shm_buffers(port) == []
    return log


def iterations(log: str) -> List[int]:
    """Iteration numbers of the training log lines, checking each says ``/3``."""
    found = ITERATION_LINE.findall(log)
    assert all(total == "3" for _, total in found), found
    return [int(i) for i, _ in found]


def trained(name: str, compat_data: str, out_dir: str, **env) -> List[dict]:
    """Run ``name`` for its 3 iterations with --metrics-jsonl; returns the training records."""
    log = run_script(name, compat_data, out_dir,
                     extra=["--metrics-jsonl", os.path.join(out_dir, "metrics.jsonl")], **env)
    assert iterations(log) == [1, 2, 3], log[-4000:]
    return training_records(out_dir)


def training_records(out_dir: str) -> List[dict]:
    records = [r for r in read_jsonl(os.path.join(out_dir, "metrics.jsonl")) if "split" not in r]
    assert [r["iteration"] for r in records] == [1, 2, 3]
    return records


def evaluation_records(out_dir: str) -> Dict[str, dict]:
    """{validation group: its last evaluation record} of a run's --metrics-jsonl."""
    return {r["group"]: r for r in read_jsonl(os.path.join(out_dir, "metrics.jsonl"))
            if r.get("split") == "valid"}


@pytest.fixture(scope="module")
def tr11_run(compat_data, tmp_path_factory):
    """The BLOOM pretraining script's run directory and training records."""
    out = str(tmp_path_factory.mktemp("tr11"))
    return out, trained("tr11", compat_data, out)


@pytest.fixture(scope="module")
def tr13_run(compat_data, tr11_run, tmp_path_factory):
    """The BLOOMZ finetuning script, started from the tr11 run's checkpoint."""
    out = str(tmp_path_factory.mktemp("tr13"))
    return out, trained("tr13", compat_data, out, LOAD=os.path.join(tr11_run[0], "checkpoints"))


@pytest.mark.launch
def test_bigscience_tr11_bloom_pretraining(tr11_run):
    _, records = tr11_run
    # --rampup-batch-size 2 2 4 with --global-batch-size 4: batches of 2, 2, then 4 samples
    assert [r["consumed_samples"] for r in records] == [2, 4, 8]
    assert all(r["lm_loss"] > 0 for r in records)


@pytest.mark.launch
def test_bigscience_tr13_bloomz_finetune_from_tr11(tr11_run, tr13_run):
    out, records = tr13_run
    with open(os.path.join(out, "launch.log")) as f:
        log = f.read()
    tr11_checkpoints = os.path.join(tr11_run[0], "checkpoints")
    assert f"of iteration 3 of --load {tr11_checkpoints};" in log, log[-4000:]
    # --reset-progress: counters start at 0 from the pretrained checkpoint (iteration 3 there)
    assert [r["consumed_samples"] for r in records] == [4, 8, 12]
    with open(os.path.join(out, "checkpoints", "latest_checkpointed_iteration.txt")) as f:
        assert f.read().strip() == "3"


@pytest.mark.launch
def test_bigscience_tr13_eval_only(compat_data, tr13_run, tmp_path):
    """--eval-only True: the loaded finetuned model is evaluated on every validation group, with
    the losses the finetuning run logged for the same model, and nothing is trained."""
    out = str(tmp_path / "tr13-val")
    log = run_script("tr13_eval_only", compat_data, out,
                     extra=["--metrics-jsonl", os.path.join(out, "metrics.jsonl")],
                     LOAD=os.path.join(tr13_run[0], "checkpoints"))
    assert iterations(log) == [], log[-4000:]
    evals, finetune_evals = evaluation_records(out), evaluation_records(tr13_run[0])
    assert sorted(evals) == ["animal_or_object", "copy_valid", "first_word"]
    for group, record in evals.items():
        assert record["lm_loss"] == pytest.approx(finetune_evals[group]["lm_loss"], rel=1e-5)


@pytest.mark.launch
def test_megatron_lm_gpt3_175b(compat_data, tmp_path):
    """The 2026 flag set. The 2024 one differs by --rampup-batch-size (and no --attention-backend):
    its flags parse in test_every_flag_of_the_script_parses, and tr11 launches that rampup."""
    records = trained("gpt3_2026", compat_data, str(tmp_path))
    # --step-batch-size-schedule "0:2 256:4" (tokens, seq 64): the batch grows from 2 to 4 samples
    # after 4 consumed samples, as the 2024 flag set's --rampup-batch-size 2 2 4 does
    assert [r["consumed_samples"] for r in records] == [2, 4, 8]


@pytest.mark.launch
def test_microsoft_gpt_stops_at_train_tokens(compat_data, tmp_path):
    records = trained("ms_gpt", compat_data, str(tmp_path))
    # --train-tokens 768 ends the run after 3 iterations of 4 x 64 tokens although
    # --train-samples (24) allows 6
    assert [r["consumed_tokens"] for r in records] == [256, 512, 768]


@pytest.mark.launch
def test_microsoft_llama2(compat_data, tmp_path):
    records = trained("ms_llama2", compat_data, str(tmp_path))
    assert [r["consumed_samples"] for r in records] == [4, 8, 12]


@pytest.mark.launch
def test_microsoft_sequence_parallel(compat_data, tmp_path):
    records = trained("ms_sequence_parallel", compat_data, str(tmp_path))
    assert [r["consumed_tokens"] for r in records] == [128, 256, 384]


def written_deepspeed_config(out_dir: str) -> Tuple[str, dict]:
    """The path and content of the DeepSpeed JSON a script filled in from its template."""
    path, = glob.glob(os.path.join(out_dir, "ds_config_*.json"))
    with open(path) as f:
        return path, json.load(f)


# name -> (the keys of the consumed section in the script's JSON, its start-up note after
# "--deepspeed_config PATH: ", the lengths of the 3 iterations, the layout in the start-up line)
SEQLEN_CURRICULA = {
    # the legacy section (fixed_linear, 16 to 64 tokens over 3 steps) through the pipe engine,
    # which resizes its buffers at each new length
    "ms_curriculum_slw": (("curriculum_learning",),
                          "curriculum_learning (fixed_linear, 16 to 64 tokens): trained here as "
                          "the native schedule", [32, 48, 64], "pipeline-parallel 2"),
    # --data-efficiency-curriculum-learning's seqlen_truncate metric (fixed_root, root 1, 16 to 64
    # tokens over 4 steps) without the pipe engine
    "ms_data_efficiency": (("data_efficiency", "data_sampling", "curriculum_learning",
                            "curriculum_metrics", "seqlen_truncate"),
                           "data_efficiency.data_sampling.curriculum_learning.curriculum_metrics."
                           "seqlen_truncate (fixed_root, 16 to 64 tokens, mode truncate): trained "
                           "here as the native schedule", [24, 40, 48], "data-parallel 2"),
}


@pytest.mark.launch
@pytest.mark.parametrize("name", sorted(SEQLEN_CURRICULA))
def test_microsoft_seqlen_curriculum(name, compat_data, tmp_path):
    """Microsoft's sequence-length curriculum scripts train the lengths of DeepSpeed's
    ``CurriculumScheduler`` for their JSON's section (asked before each iteration with the
    iteration's number, as Microsoft's loop does), changing every iteration; the start-up note
    names the consumed section; every training record and log line has the iteration's length;
    the consumed tokens are global batch x length, and --train-tokens ends the run after the 3
    shorter iterations."""
    from deepspeed.runtime.data_pipeline.curriculum_scheduler import CurriculumScheduler

    keys, note, expected, layout = SEQLEN_CURRICULA[name]
    out = str(tmp_path)
    records = trained(name, compat_data, out)
    path, section = written_deepspeed_config(out)
    with open(os.path.join(out, "launch.log")) as f:
        log = f.read()
    note_line, = [line for line in log.splitlines() if f"--deepspeed_config {path}: {note}" in line]
    assert "left out of the config DeepSpeed sees" in note_line, note_line
    assert layout in log
    for key in keys:
        section = section[key]
    scheduler = CurriculumScheduler(section)
    lengths = [scheduler.update_difficulty(iteration) for iteration in (1, 2, 3)]
    assert lengths == expected
    assert [r["seq_length"] for r in records] == lengths
    tokens = list(itertools.accumulate(r["global_batch_size"] * r["seq_length"] for r in records))
    assert [r["consumed_tokens"] for r in records] == tokens
    assert f"--train-tokens {tokens[-1]}: training stops after iteration 3 " in log
    lines = [line for line in log.splitlines() if ITERATION_LINE.search(line)]
    assert len(lines) == 3, lines
    for line, length in zip(lines, lengths, strict=True):  # Microsoft's "curriculum seqlen"
        segment = f" | seq length: {length} |" if length < 64 else " | seq length:"
        assert (segment in line) == (length < 64), (length, line)


# --------------------------------------------------------------------------- docs/compatibility.md


@pytest.fixture(scope="module")
def flag_parser():
    """The parser of pretrain_gpt.py plus finetune_t0.py's flags."""
    from tools.compat_table import build_parser
    return build_parser()


def test_compatibility_doc_table_is_current(flag_parser):
    """The flag table in docs/compatibility.md is what tools/compat_table.py generates now from
    the parser and megatron/config/flag_compat.py (so no status in it is stale)."""
    from tools.compat_table import BEGIN, DOC, END, table

    with open(os.path.join(ROOT, DOC), encoding="utf-8") as f:
        text = f.read()
    in_doc = text[text.index(BEGIN) + len(BEGIN):text.index(END)]
    assert in_doc == "\n" + table(flag_parser), \
        f"{DOC} is out of date: run python tools/compat_table.py --write"


def test_every_flag_of_the_families_is_accepted_or_refused(flag_parser):
    """No flag of the public scripts is unknown here: each is implemented, an alias, inert or
    refused (with what to use instead)."""
    from megatron.config.flag_compat import compat_flag
    from tools.compat_table import statuses

    found = statuses(flag_parser)
    assert [f for f, status in found.items() if status == "missing"] == []
    assert all(compat_flag(f).use_instead for f, status in found.items() if status == "refused")


@pytest.mark.launch
def test_refused_flags_of_the_table_stop_the_run(flag_parser, compat_data, tmp_path, monkeypatch,
                                                 capsys):
    """Every flag the table calls refused, added to a script that otherwise runs, stops it with
    one line naming the flag and its replacement."""
    from megatron.config.flag_compat import compat_flag
    from tools.compat_table import statuses

    refused = sorted(f for f, status in statuses(flag_parser).items() if status == "refused")
    assert "--ds-sequence-parallel-fpdt" in refused and "--ds-sequence-parallel-size" not in refused
    flags = script_flags("ms_sequence_parallel", compat_data, str(tmp_path))
    for flag in refused:
        info = compat_flag(flag)
        with pytest.raises(SystemExit):
            parse_in_process(flags + [flag] + (["2"] if info.takes_value else []), monkeypatch)
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and flag in err and info.use_instead in err, err


@pytest.mark.launch
def test_microsoft_moe_script_gets_microsofts_moe_model(compat_data, tmp_path, monkeypatch):
    """Microsoft's MoE128 script names only the expert count, the expert-parallel size, the loss
    coefficient and the capacities: the model is Microsoft's (top-1 gating by the probability, MoE
    in every second layer, token dropping at factor 1.0), split over its 2 ranks; its
    --moe-min-capacity 4 and --moe-eval-capacity-factor 1.0 cannot bind and are named inert."""
    args = parse_in_process(script_flags("ms_moe", compat_data, str(tmp_path)), monkeypatch)
    assert (args.num_experts, args.expert_model_parallel_size) == (4, 2)
    assert (args.moe_router_topk, args.moe_router_pre_softmax, args.moe_aux_loss_coeff) == (
        1, True, 0.01)
    assert args.moe_layer_freq == [0, 1] and args.moe_expert_capacity_factor == 1.0
    notes = " ".join(args.run_config.notes)
    assert "--moe-min-capacity 4" in notes and "--moe-eval-capacity-factor 1.0" in notes
    dropless = parse_in_process(script_flags("ms_moe", compat_data, str(tmp_path / "dropless"),
                                             MOE_DROP_TOKEN="false"), monkeypatch)
    assert dropless.moe_expert_capacity_factor is None
