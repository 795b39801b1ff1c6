"""tools/preview_schedule.py as a user runs it: the command line writes its JSON, and a bad blend
file stops it with one error line (in process: tests/unit/test_preview_schedule.py)."""
import json
import os
import subprocess
import sys

import pytest

from helpers.flags import TINY_SCHEDULE as BASE
from helpers.paths import ROOT

pytestmark = pytest.mark.launch


def test_preview_cli(tmp_path):
    out = tmp_path / "cli.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "preview_schedule.py")] + BASE +
        "--global-batch-size 4 --train-iters 20 --lr 1e-3 --output-json".split() + [str(out)],
        cwd="/", capture_output=True, text=True, env=dict(os.environ, DS_ACCELERATOR="cpu"))
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(out.read_text())["lr"]) == 21


@pytest.mark.parametrize("text, words", [
    ("train:\n  blend:\n    - {path: no_such_dataset, weight: 1}\n",
     ["train.blend[0].path", "no_such_dataset.bin", "does not exist"]),
    ("__module__: megatron.energon\n__class__: MetadatasetV3\nsplits: {train: {path: a}}\n",
     ["__class__ 'MetadatasetV3'", "MetadatasetV2, Metadataset"]),
])
def test_preview_bad_blend_file_is_one_error_line(tmp_path, text, words):
    """A bad --data-blend-config: one `error: ...` line naming the file, key and value, exit
    status 1 (a ConfigError, as the training entry points), no traceback."""
    blend = tmp_path / "bad_blend.yaml"
    blend.write_text(text)
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "preview_schedule.py")] + BASE +
        "--global-batch-size 4 --train-iters 20 --lr 1e-3 --data-blend-config".split() +
        [str(blend), "--output-json", str(tmp_path / "p.json")],
        cwd=str(tmp_path), capture_output=True, text=True, env=dict(os.environ, DS_ACCELERATOR="cpu"))
    assert proc.returncode == 1, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {blend}: "), proc.stderr
    for word in words:
        assert word in lines[0], lines[0]
    assert not (tmp_path / "p.json").exists()
