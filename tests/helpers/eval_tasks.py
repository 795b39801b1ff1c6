"""Local lm-eval tasks of the evaluation tests (tests/unit/test_eval_harness.py,
tests/e2e/test_moe_e2e.py): a multiple-choice task and a rolling-perplexity one over JSON lines."""
import json

MC_DOCS = [
    {"question": "Is fire hot?", "choices": ["yes", "no"], "label": 0},
    {"question": "2 + 2 =", "choices": ["4", "5", "22"], "label": 0},
    {"question": "Opposite of up:", "choices": ["down", "left"], "label": 0},
    {"question": "Color of the sky?", "choices": ["blue", "green", "red"], "label": 2},
    {"question": "Cats say", "choices": ["meow", "moo"], "label": 1},
    {"question": "Ice is", "choices": ["cold", "warm"], "label": 0},
]
PPL_DOCS = [  # the first is longer than --seq-length (several rolling windows)
    {"text": "The quick brown fox jumps over the lazy dog; then it naps in the warm afternoon "
             "sun beside the old stone wall."},
    {"text": "Short one."},
]


def task_files(tmp_path):
    """A multiple-choice task YAML file and a rolling-perplexity task in an include directory,
    both reading local JSON lines."""
    (tmp_path / "mc.jsonl").write_text("".join(json.dumps(d) + "\n" for d in MC_DOCS))
    (tmp_path / "ppl.jsonl").write_text("".join(json.dumps(d) + "\n" for d in PPL_DOCS))
    cache = tmp_path / "hf_cache"
    mc = tmp_path / "tiny_mc.yaml"
    mc.write_text(
        "task: tiny_mc\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files: {{test: {tmp_path / 'mc.jsonl'}}}\n  cache_dir: {cache}\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: '{{question}}'\n"
        "doc_to_choice: '{{choices}}'\ndoc_to_target: label\n"
        "metric_list:\n  - metric: acc\n")
    include = tmp_path / "include"
    include.mkdir()
    (include / "tiny_ppl.yaml").write_text(
        "task: tiny_ppl\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files: {{test: {tmp_path / 'ppl.jsonl'}}}\n  cache_dir: {cache}\n"
        "test_split: test\noutput_type: loglikelihood_rolling\ndoc_to_text: ''\n"
        "doc_to_target: '{{text}}'\nmetric_list:\n  - metric: word_perplexity\n"
        "  - metric: byte_perplexity\n  - metric: bits_per_byte\n")
    return str(mc), str(include)
