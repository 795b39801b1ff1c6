"""Reading an offline W&B run back: its ``run-ID.wandb`` file is wandb's datastore, a LevelDB-style
log (a 7-byte header ``:W&B`` / 0xBEE1 / version 0, then 32 KiB blocks of records, each with a
CRC-32 of its type byte and data, a length and a FULL/FIRST/MIDDLE/LAST type) of
``wandb.proto.wandb_internal_pb2.Record`` messages. wandb 0.31 no longer ships the Python reader
(``wandb.sdk.internal.datastore``), so this is a small one, checking every record's CRC."""
import glob
import json
import os
import struct
import zlib
from typing import Dict, Iterator, List

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4

WANDB_ENV = {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}


def wandb_env(tmp_dir) -> Dict[str, str]:
    """Environment for an offline run with wandb's config and cache under ``tmp_dir``."""
    return dict(WANDB_ENV, WANDB_CONFIG_DIR=os.path.join(str(tmp_dir), "wandb_config"),
                WANDB_CACHE_DIR=os.path.join(str(tmp_dir), "wandb_cache"),
                WANDB_DATA_DIR=os.path.join(str(tmp_dir), "wandb_data"))


def offline_runs(save_dir) -> List[str]:
    """The ``.wandb`` files of the offline runs under ``save_dir`` (``save_dir/wandb/
    offline-run-*/run-*.wandb``), oldest first."""
    return sorted(glob.glob(os.path.join(str(save_dir), "wandb", "offline-run-*", "run-*.wandb")))


def _raw_records(path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        data = f.read()
    ident, magic, version = struct.unpack("<4sHB", data[:HEADER])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), (ident, magic, version)
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # a block's trailer
            pos += left
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if (crc, length, kind) == (0, 0, 0):  # zero padding to the block's end
            pos += left
            continue
        chunk = data[pos + HEADER:pos + HEADER + length]
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF == crc, f"{path}@{pos}"
        pos += HEADER + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            yield pending + chunk
        else:
            raise AssertionError(f"{path}@{pos}: record type {kind}")


def read_run(path) -> dict:
    """An offline run's ``{"id", "name", "project", "config": {key: value}, "history": {step:
    {key: value}}}`` (history rows of one step merged, wandb's ``_``-keys left out)."""
    from wandb.proto import wandb_internal_pb2

    run = {"history": {}, "config": {}}
    for raw in _raw_records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.update(id=record.run.run_id, name=record.run.display_name,
                       project=record.run.project)
            for item in record.run.config.update:
                run["config"][item.key] = json.loads(item.value_json)
        elif kind == "history":
            row = run["history"].setdefault(record.history.step.num, {})
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)
                if not key.startswith("_"):
                    row[key] = json.loads(item.value_json)
    return run


def assert_wandb_run_holds_the_records(save_dir, records, project: str, name: str,
                                       iterations: List[int], config: Dict = None) -> None:
    """One offline run under ``save_dir`` (rank 0's) named ``project``/``name``, whose config
    holds ``config``'s items, and at each of ``iterations`` as the step exactly the values the
    ``--metrics-jsonl`` ``records`` hold: every training scalar, per-dataset loss and samples
    drawn (the data ledger), and each validation group's loss and perplexity (and its losses per
    position bucket, ``lm_loss_pos_LO_HI``) under its name."""
    runs = offline_runs(save_dir)
    assert len(runs) == 1, runs
    run = read_run(runs[0])
    assert (run["project"], run["name"]) == (project, name)
    for key, value in (config or {}).items():
        assert run["config"][key] == value, key
    history = run["history"]
    assert sorted(history) == list(iterations)
    for r in (r for r in records if "split" not in r and r["iteration"] in history):
        row = history[r["iteration"]]
        for key in ("lm_loss", "lr", "weight_decay", "global_batch_size", "consumed_samples",
                    "consumed_tokens", "tokens_per_second", "grad_norm"):
            assert row.get(f"train/{key}") == r[key], (r["iteration"], key)
        for group in ("per_dataset_loss", "samples_drawn"):
            logged = {k.rsplit("/", 1)[1]: v for k, v in row.items()
                      if k.startswith(f"train/{group}/")}
            assert logged == r[group] and logged, (r["iteration"], group)
    evals = [r for r in records if r.get("split") == "valid" and r["iteration"] in history]
    assert evals
    for r in evals:
        row = history[r["iteration"]]
        assert row[f"valid/{r['group']}/lm_loss"] == r["lm_loss"]
        assert row[f"valid/{r['group']}/ppl"] == r["ppl"]
        for key in (k for k in r if k.startswith("lm_loss_pos_")):  # --eval-position-buckets
            assert row[f"valid/{r['group']}/{key}"] == r[key], key
