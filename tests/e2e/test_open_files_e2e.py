"""A blend of many prefixes under a low ``ulimit -n`` (megatron/data/source_pool.py): built and
read in a child process whose soft limit is lowered, its open files and memory maps of data stay
bounded by the pool, not by the blend; a limit too low for even a few open datasets is one line
naming ``ulimit -n`` and the number needed."""
import os
import subprocess
import sys
import textwrap

import pytest

from helpers.curriculum import write_corpus
from helpers.paths import ROOT
from megatron.data.source_pool import check_file_limit, pool_capacity
from megatron.errors import ConfigError

pytestmark = pytest.mark.launch  # a child process with the lowered limit

CHILD = textwrap.dedent("""
    import os, resource, sys, json
    limit = int(sys.argv[1]); blend_file = sys.argv[2]; cache = sys.argv[3]
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig
    from megatron.data.blend_config import load_blend_config
    from megatron.data.curriculum.dataset import build_curriculum_dataset
    from megatron.schedules.units import BatchSchedule
    from megatron.tokenizer import ByteLevelTokenizer

    def data_files():
        maps = open("/proc/self/maps").read().splitlines()
        mapped = {l.split()[-1] for l in maps if l.endswith((".bin", ".idx", ".npy"))}
        return len(os.listdir("/proc/self/fd")), len(mapped)

    config = GPTDatasetConfig(random_seed=1, sequence_length=16, blend=None, split=None,
                              path_to_cache=cache, tokenizer=ByteLevelTokenizer(),
                              reset_position_ids=False, reset_attention_mask=False,
                              eod_mask_loss=False)
    blend = load_blend_config(blend_file).train
    try:
        ds = build_curriculum_dataset(blend, 1500, config, BatchSchedule(8, None, 16))
    except Exception as exc:
        print(json.dumps({"error": str(exc)})); sys.exit(0)
    most = (0, 0)
    for i in range(len(ds)):
        ds[i]
        most = tuple(max(a, b) for a, b in zip(most, data_files()))
    seen = len(set(int(d) for d in ds.dataset_index))
    pool = ds.datasets[int(ds.dataset_index[0])].pool
    print(json.dumps({"fds": most[0], "maps": most[1], "seen": seen, "capacity": pool.capacity,
                      "opened": pool.opened, "open_now": len(pool)}))
""")


@pytest.fixture(scope="module")
def many_prefixes(tmp_path_factory):
    root = tmp_path_factory.mktemp("many")
    lines = ["train:", "  blend:"]
    for d in range(120):
        prefix = write_corpus(str(root / f"ds{d:04d}_text_document"), [40, 33, 50], seed=d)
        lines.append(f"    - {{path: {prefix}, weight: {1 + d % 9}}}")
    path = root / "blend.yaml"
    path.write_text("\n".join(lines) + "\n")
    return str(path), str(root)


def _child(limit, blend_file, cache):
    import json
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", CHILD, str(limit), blend_file, cache], env=env,
                         capture_output=True, text=True, timeout=600, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_hundred_and_twenty_prefixes_read_under_ulimit_400(many_prefixes, tmp_path):
    blend_file, _ = many_prefixes
    result = _child(400, blend_file, str(tmp_path / "cache"))
    assert "error" not in result, result
    assert result["seen"] == 120  # every prefix was read from
    assert result["capacity"] == pool_capacity(120, 400) == 17
    assert result["open_now"] <= 17 and result["opened"] >= 120
    # open files and maps of data: the pool's few datasets (.idx and .bin each), not 120, and the
    # one pack segment every dataset's indices are views of (megatron/data/index_pack.py) and the
    # curriculum index's two arrays
    assert result["maps"] <= 2 * 17 + 1 + 2, result
    assert result["fds"] < 400 - 64, result
    # the cache: one pack segment (.bin, .json) and the curriculum index, not 4 files per prefix
    cache = sorted(os.listdir(tmp_path / "cache"))
    assert len(cache) == 3 and sum(n.startswith("index-pack-") for n in cache) == 2, cache


def test_a_limit_too_low_is_one_line_naming_ulimit(many_prefixes, tmp_path):
    blend_file, _ = many_prefixes
    result = _child(230, blend_file, str(tmp_path / "cache"))
    assert "ulimit -n) is 230, too low to read its 120 datasets" in result["error"]
    assert "at least 240" in result["error"] and "ulimit -n 1024" in result["error"]
    with pytest.raises(ConfigError, match="at least 204"):
        check_file_limit(1, "train", soft_limit=100)
    check_file_limit(1, "train", soft_limit=204)
