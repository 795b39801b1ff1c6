"""The pool of open datasets (megatron/data/source_pool.py): least recently read closed first, its
capacity from the open-file limit."""
from megatron.data.source_pool import LazySource, SourcePool, pool_capacity


def test_the_pool_closes_the_least_recently_read():
    pool = SourcePool(2)
    opened = []
    sources = [LazySource(k, 5, lambda k=k: opened.append(k) or [k] * 5, pool) for k in range(3)]
    assert [s[0] for s in (sources[0], sources[1], sources[0], sources[2], sources[1])] == [0, 1, 0, 2, 1]
    assert opened == [0, 1, 2, 1] and len(pool) == 2  # 1 was closed when 2 opened, 0 kept
    assert len(sources[2]) == 5


def test_the_capacity_follows_ulimit_n():
    assert pool_capacity(10 ** 6, 10 ** 6) == 4096          # at most MAX_OPEN
    assert pool_capacity(120, 400) == 17                     # (400 - 192) // (3 x 4)
    assert pool_capacity(3, 10 ** 6) == 3                    # never more than the blend has
    assert pool_capacity(100, 220) == 4                      # at least MIN_OPEN
