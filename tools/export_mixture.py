#!/usr/bin/env python
"""Export a run's data mixture, an adaptive mixer's learned weights included, as a blend file.

    python tools/export_mixture.py --load CKPT [--iteration N] --output FILE.yaml \
        [--data-blend-config THE_RUN'S_BLEND_FILE]

reads the checkpoint's data ledger (``data_mix.json``: every phase of the run's mix, one per
mixer update) and writes ``FILE.yaml``, a ``--data-blend-config`` file whose training section is
one ``sequential`` stage per phase (megatron/data/mixture_export.py). A run from that file with
the run length, ``--global-batch-size`` (and rampup), ``--seed`` and ``--data-index-order`` the
file's header names draws at every global sample what the recorded run drew;
``tools/data_provenance.py`` shows it. With ``--data-blend-config`` the run's ``valid``/``test``
groups and ``loss_weight`` values are copied into the file. Prints one line per phase.
"""
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.path.pardir)))

import argparse  # noqa: E402
from typing import List, Optional  # noqa: E402

import yaml  # noqa: E402

from megatron.checkpoint.format import read_data_mix, resolve_checkpoint  # noqa: E402
from megatron.data.blend_config import load_blend_config  # noqa: E402
from megatron.data.mix_ledger import MixRecord  # noqa: E402
from megatron.data.mixture_export import exported_blend_file, mixer_updates  # noqa: E402
from megatron.errors import ConfigError  # noqa: E402
from megatron.utils.atomic_io import atomic_write_text  # noqa: E402


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--load", required=True, help="The run's checkpoint directory.")
    parser.add_argument("--iteration", type=int, default=None,
                        help="The checkpoint to read (default: the latest, from the tracker).")
    parser.add_argument("--output", required=True, help="The blend file to write (YAML).")
    parser.add_argument("--data-blend-config", default=None,
                        help="The run's blend file: its valid/test groups and loss_weight values "
                             "are copied.")
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    try:
        directory, iteration = resolve_checkpoint(args.load, args.iteration)
        obj = read_data_mix(directory)
        if obj is None:
            raise ConfigError(f"--load {args.load}: checkpoint of iteration {iteration} has no "
                              "data_mix.json (written before checkpoints carried the data ledger)")
        record = MixRecord.from_json(obj, where=os.path.join(directory, "data_mix.json"))
        original = load_blend_config(args.data_blend_config) if args.data_blend_config else None
        blend, notes = exported_blend_file(record, original)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    header = "".join(f"# {line}\n" for line in [f"exported from {directory}"] + notes)
    atomic_write_text(args.output, header + yaml.safe_dump(blend, sort_keys=False))
    updates = {u["begin"]: u for u in mixer_updates(record.phases)}
    for k, phase in enumerate(record.phases):
        stage = blend["train"]["sequential"][k]
        weights = ", ".join(f"{os.path.basename(e['path'])} {e['weight']:.4g}"
                            if isinstance(e["weight"], (int, float)) else
                            f"{os.path.basename(e['path'])} (a schedule)" for e in stage["blend"])
        why = (f"mixer {updates[phase.begin]['policy']} update" if phase.begin in updates
               else "the blend file" if k == 0 else "an edit (--override-data-mix)")
        print(f"stage {k}: from iteration {phase.begin_iteration} (global sample {phase.begin}), "
              f"{why}: {weights}")
    print(f"wrote {args.output}: {len(record.phases)} stages; run it with {notes[1].split(': ', 1)[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
