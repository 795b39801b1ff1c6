"""Multi-node data (megatron/data/shared_cache.py): which directories hold megatron-core's dataset
index caches, the error when some rank cannot see them, and the collective check in one process."""
import os

from megatron.data.shared_cache import MARKER_PREFIX, index_cache_dirs, require_shared_cache_dirs, unshared_cache_error


def _args(tmp_path, *extra):
    """The data config of the tiny run's validated flags with ``extra``."""
    from megatron.config.parser import parse_args
    return parse_args(["--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2",
                       "--seq-length", "8", "--micro-batch-size", "1", "--train-iters", "1",
                       "--lr", "1e-3", *extra], require_data=False).run_config.data


def test_cache_dirs_are_the_flag_or_megatron_cores_default_beside_each_prefix(tmp_path):
    a, b = str(tmp_path / "data" / "web_text_document"), str(tmp_path / "code_text_document")
    assert index_cache_dirs(_args(tmp_path, "--data-path", "0.3", a, "0.7", b,
                                  "--data-cache-path", "cache")) == [os.path.abspath("cache")]
    assert index_cache_dirs(_args(tmp_path, "--data-path", "0.3", a, "0.7", b, "0.1", a)) == [
        os.path.join(a, "cache", "GPTDataset_indices"), os.path.join(b, "cache", "GPTDataset_indices")]
    weighted = _args(tmp_path, "--train-weighted-split-paths", f"TRAIN: 1 0:0.9 {a}",
                     "--valid-weighted-split-paths", f"VALID: 1 0.9:1 {a}, 1 0:1 {b}")
    assert index_cache_dirs(weighted) == [os.path.join(p, "cache", "GPTDataset_indices") for p in (a, b)]


def _views(blind_hosts=(), rank0_wrote=True):
    """16 ranks on node1 (0-7) and node2 (8-15); ranks on ``blind_hosts`` do not see the marker."""
    views = [(f"node{1 + r // 8}", [f"node{1 + r // 8}" not in blind_hosts]) for r in range(16)]
    if not rank0_wrote:
        views[0] = ("node1", [False])
    return views


def test_a_cache_directory_other_nodes_do_not_see_is_an_error_naming_the_flag():
    message = unshared_cache_error(["/local/cache"], _views(blind_hosts=("node2",)), flag_given=True)
    assert message == (
        "--data-cache-path /local/cache: ranks 8-15 (host node2) do not see the files rank 0 (host "
        "node1) writes there. Rank 0 builds the dataset indices and every other rank reads them from "
        "the cache directory, so it must be on a filesystem all nodes share: give "
        "--data-cache-path a shared directory")
    default = unshared_cache_error(["/data/web/cache/GPTDataset_indices"],
                                   _views(blind_hosts=("node2",)), flag_given=False)
    assert default.startswith("the dataset index cache /data/web/cache/GPTDataset_indices "
                              "(megatron-core's default beside the data, as no --data-cache-path "
                              "is given): ranks 8-15 (host node2)")
    assert unshared_cache_error(["/shared/cache"], _views(), flag_given=True) is None
    # rank 0 could not write there: megatron-core's own "cannot write" error is the one to see
    assert unshared_cache_error(["/ro"], _views(blind_hosts=("node2",), rank0_wrote=False), True) is None


def test_the_collective_check_passes_on_a_shared_directory_and_leaves_no_marker(dist_group, tmp_path):
    cache = tmp_path / "cache" / "GPTDataset_indices"
    require_shared_cache_dirs([str(cache)], flag_given=False, single_host_skip=False)
    assert cache.is_dir() and not any(p.name.startswith(MARKER_PREFIX) for p in cache.iterdir())
    require_shared_cache_dirs([str(cache)], flag_given=False)  # one host: nothing to check
    looked = []
    require_shared_cache_dirs([str(cache)], True, single_host_skip=False,
                              exists=lambda path: looked.append(path) or True)
    assert len(looked) == 1 and os.path.dirname(looked[0]) == str(cache)


def test_one_process_runs_the_body_alone():
    from megatron.data.rank0_first import rank0_builds_first

    ran = []
    with rank0_builds_first("/nonexistent", "train") as rank:  # one rank: the body, no wait
        ran.append(rank)
    assert ran == [0]
