"""``ocdbt info``: configuration and statistics of a database version."""

from __future__ import annotations

import argparse

from ocdbt_py.cli.locate import open_database
from ocdbt_py.cli.options import add_json, add_location, add_version
from ocdbt_py.cli.output import human_bytes, out, print_json


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``info`` subcommand."""
    p = subparsers.add_parser(
        "info",
        help="show the configuration and statistics of a database",
        description="Show the manifest, configuration and statistics of the latest (or the "
        "selected) version.",
    )
    add_location(p)
    add_version(p)
    add_json(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the information."""

    # heavy (the Zarr layer): imported when the command runs, so `ocdbt --help` stays fast
    from ocdbt_py.maintenance.verify_data import NO_CHECKSUM, checksum_sample

    db = open_database(args)
    info = db.info()
    sample = checksum_sample(db)
    if args.json:
        info["values_checksummed"] = None if not sample["sampled"] else sample["checksummed"] == sample["sampled"]
        info["checksum_sample"] = sample
        print_json(info)
        return 0
    cfg = info["config"]
    comp = cfg["compression"]
    rows = [
        ("url", info["url"]),
        ("generation", f"{info['generation']} (latest {info['latest_generation']})"),
        ("commit time", info["commit_time"] or "-"),
        ("keys", f"{info['num_keys']:,}"),
        ("tree bytes", f"{human_bytes(info['num_tree_bytes'])} ({info['num_tree_bytes']:,})"),
        ("out-of-line value bytes",
         f"{human_bytes(info['num_indirect_value_bytes'])} ({info['num_indirect_value_bytes']:,})"),
        ("root height", str(info["root_height"])),
        ("manifest", f"{info['manifest_kind']} ({info['manifest_key']})"),
        ("versions in manifest", f"{info['inline_versions']} inline, "
                                 f"{info['version_node_refs']} version-tree node references"),
        ("uuid", cfg["uuid"]),
        ("max_inline_value_bytes", str(cfg["max_inline_value_bytes"])),
        ("max_decoded_node_bytes", str(cfg["max_decoded_node_bytes"])),
        ("version_tree_arity_log2", str(cfg["version_tree_arity_log2"])),
        ("compression", "none" if comp is None else f"{comp['id']} level {comp['level']}"),
        ("values checksummed", _checksummed(sample, NO_CHECKSUM)),
    ]
    w = max(len(k) for k, _ in rows) + 1
    stream = out()
    for k, v in rows:
        stream.write(f"{(k + ':').ljust(w)} {v}\n")
    return 0


def _checksummed(sample: dict[str, int], none: str) -> str:
    """The ``values checksummed`` row: yes / no (what that means) / partly, and how it was judged."""
    n, k = sample["sampled"], sample["checksummed"]
    if not n:
        return "- (no Zarr array chunks)"
    how = f"first chunk of {n} of {sample['arrays']} arrays"
    if k == n:
        return f"yes ({how})"
    if k == 0:
        return f"no: {none} ({how}; save with checksum=True to add them)"
    return f"partly: {k} of {n} sampled arrays ({how})"
