"""Every checkpoint of the Orbax corpus restores exactly as Orbax's own restore returns it."""

from __future__ import annotations

import math
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ocdbt_py import checkpoint
from ocdbt_py.checkpoint import LazyArray, LeafMetadata
from ocdbt_py.errors import CorruptionError
from tests.checkpoint.conftest import Corpus, compare

# Case names are known only after generation, so cases are iterated inside each test and
# failures collected, reporting every broken case at once.


def _restore_case(corpus: Corpus, name: str, **kw: Any) -> Any:
    case = corpus.cases[name]
    item = case.get("item") if case.get("tier", "").startswith("local") else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", checkpoint.UncommittedStepWarning)
        return checkpoint.restore(corpus.path(name), item=item, **kw)


def test_corpus_was_generated_completely(orbax_corpus: Corpus) -> None:
    assert orbax_corpus.info["failures"] == {}, orbax_corpus.info["failures"]
    names = set(orbax_corpus.with_expected())
    for required in ("std_zarr2_ocdbt", "pytree_zarr3_ocdbt", "perparam_zarr2", "perparam_zarr3", "manager",
                     "manager_commit_file", "v1_pytree", "multiprocess_zarr3", "multiprocess_zarr2",
                     "legacy_msgpack_crafted", "no_merged_root", "chunked_zarr3", "exotic_zarr3_nocompress"):
        assert required in names
    assert any(n.startswith("emergency_local") for n in names)
    assert any(n.startswith("emergency_persistent") for n in names)


def test_restore_matches_orbax(orbax_corpus: Corpus) -> None:
    problems = {}
    for name in orbax_corpus.with_expected():
        got = _restore_case(orbax_corpus, name)
        errs = compare(orbax_corpus.expected(name), got)
        if errs:
            problems[name] = errs[:5]
    assert problems == {}


def _materialize(tree: Any) -> Any:
    if isinstance(tree, LazyArray):
        return np.asarray(tree)
    if isinstance(tree, dict):
        return {k: _materialize(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_materialize(v) for v in tree]
    if isinstance(tree, tuple):
        return tuple(_materialize(v) for v in tree)
    return tree


def test_lazy_restore_matches_orbax(orbax_corpus: Corpus) -> None:
    problems = {}
    for name in orbax_corpus.with_expected():
        got = _restore_case(orbax_corpus, name, lazy=True)
        errs = compare(orbax_corpus.expected(name), _materialize(got))
        if errs:
            problems[name] = errs[:5]
    assert problems == {}


def test_lazy_array_reads_slices(orbax_corpus: Corpus) -> None:
    tree = checkpoint.restore(orbax_corpus.path("chunked_zarr3"), lazy=True)
    big = tree["big"]
    assert isinstance(big, LazyArray)
    assert big.shape == (256, 512) and big.dtype == np.float32 and big.nbytes == 256 * 512 * 4
    full = np.asarray(big)
    np.testing.assert_array_equal(big[10:70, 100:300], full[10:70, 100:300])
    np.testing.assert_array_equal(big[5], full[5])
    np.testing.assert_array_equal(big[::-3, 7], full[::-3, 7])


def _leaves(tree: Any) -> list[Any]:
    out = []
    stack = [tree]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
        else:
            out.append(x)
    return out


def test_metadata_agrees_with_restored_values(orbax_corpus: Corpus) -> None:
    problems = {}
    for name in orbax_corpus.with_expected():
        case = orbax_corpus.cases[name]
        item = case.get("item") if case.get("tier", "").startswith("local") else None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", checkpoint.UncommittedStepWarning)
            md = checkpoint.metadata(orbax_corpus.path(name), item=item)
        got = _restore_case(orbax_corpus, name)
        errs = _compare_md(md, got, name, gaps=name == "missing_chunk_legacy")
        if errs:
            problems[name] = errs[:5]
    assert problems == {}


def _compare_md(md: Any, got: Any, path: str, gaps: bool = False) -> list[str]:
    if isinstance(md, LeafMetadata):
        if md.kind == "array":
            if not isinstance(got, np.ndarray):
                return [f"{path}: metadata says array, restored {type(got).__name__}"]
            if md.shape != got.shape or md.dtype != got.dtype or md.nbytes != got.nbytes:
                return [f"{path}: metadata {md.dtype}{md.shape} vs restored {got.dtype}{got.shape}"]
            if md.chunks is None or len(md.chunks) != got.ndim:
                return [f"{path}: bad chunks {md.chunks}"]
            if md.stored_bytes is not None and md.chunks_stored != md.nchunks and not gaps:
                return [f"{path}: {md.chunks_stored} chunks stored, grid has {md.nchunks}"]
        elif md.kind == "scalar":
            if md.shape != () or not isinstance(got, (int, float, bool, complex)):
                return [f"{path}: scalar metadata {md.shape} vs {got!r}"]
        elif md.kind == "string" and md.value != got:
            return [f"{path}: string {md.value!r} vs {got!r}"]
        return []
    if isinstance(md, dict):
        if not isinstance(got, dict) or set(md) != set(got):
            return [f"{path}: metadata keys differ from restored keys"]
        return [e for k in md for e in _compare_md(md[k], got[k], f"{path}.{k}", gaps)]
    if isinstance(md, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(md) != len(got):
            return [f"{path}: metadata list differs"]
        return [e for i, (a, b) in enumerate(zip(md, got)) for e in _compare_md(a, b, f"{path}[{i}]", gaps)]
    return [] if md == got or (isinstance(md, float) and math.isnan(md)) else [f"{path}: {md!r} != {got!r}"]


def test_metadata_stored_sizes_match_files(orbax_corpus: Corpus) -> None:
    """For per-param dirs the stored size is the sum of the chunk files' sizes."""
    md = checkpoint.metadata(orbax_corpus.path("perparam_zarr2"))
    kernel = md["params"]["layer0"]["kernel"]
    d = orbax_corpus.path("perparam_zarr2") / "params.layer0.kernel"
    files = [p for p in d.iterdir() if not p.name.startswith(".")]
    assert kernel.chunks_stored == len(files) == kernel.nchunks == 8
    assert kernel.stored_bytes == sum(p.stat().st_size for p in files)
    md3 = checkpoint.metadata(orbax_corpus.path("pytree_zarr3_ocdbt"))
    k3 = md3["params"]["layer0"]["kernel"]
    assert k3.zarr_format == 3 and k3.chunks == (2, 8) and k3.write_shape == (2, 8)
    assert k3.sharding["sharding_type"] == "NamedSharding" and k3.sharding["partition_spec"] == ["data", "model"]
    assert k3.stored_bytes > 0 and k3.chunks_stored == 8
    assert md3["name"].kind == "string" and md3["name"].value == "hello world"
    assert md3["nothing"].kind == "empty" and md3["nothing"].value is None


def test_manager_root_and_steps(orbax_corpus: Corpus) -> None:
    case = orbax_corpus.cases["manager"]
    root = orbax_corpus.path("manager")
    steps = checkpoint.list_steps(root)
    assert [s.step for s in steps] == case["steps"]
    assert all(s.committed for s in steps)
    # the tmp dir with a higher step number is ignored; step= picks an older step
    best = checkpoint.restore(root, step=orbax_corpus.cases["manager_best"]["step"])
    assert compare(orbax_corpus.expected("manager_best"), best) == []
    only = checkpoint.restore(root, item="params")
    assert compare(orbax_corpus.expected("manager")["params"], only) == []
    assert checkpoint.restore(root, item="meta") == {"step": 5, "lr": 0.1 / 6, "tags": ["a", "b"]}


def test_uncommitted_step_is_skipped_with_warning(orbax_corpus: Corpus) -> None:
    root = orbax_corpus.path("manager_commit_file")
    with pytest.warns(checkpoint.UncommittedStepWarning, match="step 3"):
        steps = checkpoint.list_steps(root)
    assert [s.step for s in steps] == orbax_corpus.cases["manager_commit_file"]["steps"] == [1, 2]
    with pytest.warns(checkpoint.UncommittedStepWarning):
        latest = checkpoint.restore(root)
    assert latest["step"] == 2
    # Asking for the uncommitted step explicitly is an error; its directory can still be read.
    with pytest.warns(checkpoint.UncommittedStepWarning), pytest.raises(FileNotFoundError):
        checkpoint.restore(root, step=3)
    direct = checkpoint.restore(root / "3")
    assert direct["step"] == 3


def test_missing_chunk_is_an_error_for_modern_checkpoints(orbax_corpus: Corpus) -> None:
    case = orbax_corpus.cases["missing_chunk_modern"]
    assert case["orbax_error"] is not None  # Orbax refuses it too
    with pytest.raises(CorruptionError, match="missing"):
        checkpoint.restore(orbax_corpus.path("missing_chunk_modern"))
    lazy = checkpoint.restore(orbax_corpus.path("missing_chunk_modern"), lazy=True)
    rows = lazy["w"].chunks[0]  # the deleted chunk "1.0" holds rows [rows, 2 * rows)
    full = np.arange(32.0, dtype=np.float32).reshape(8, 4) + 1
    np.testing.assert_array_equal(lazy["w"][:rows], full[:rows])  # other chunks still read
    np.testing.assert_array_equal(lazy["w"][2 * rows:], full[2 * rows:])
    with pytest.raises(CorruptionError):
        lazy["w"][rows: 2 * rows]
    # the legacy variant (no store_array_data_equal_to_fill_value) reads the gap as zeros
    legacy = checkpoint.restore(orbax_corpus.path("missing_chunk_legacy"))
    assert (legacy["w"][rows: 2 * rows] == 0).all()
    np.testing.assert_array_equal(np.delete(legacy["w"], np.s_[rows: 2 * rows], axis=0),
                                  np.delete(full, np.s_[rows: 2 * rows], axis=0))


def test_per_process_databases_without_merged_root(orbax_corpus: Corpus, tmp_path: Path) -> None:
    """Deleting the merged root of a 2-process checkpoint leaves two per-process databases."""
    src = orbax_corpus.path("multiprocess_zarr3")
    dst = tmp_path / "mp"
    shutil.copytree(src, dst)
    (dst / "manifest.ocdbt").unlink()
    shutil.rmtree(dst / "d")
    got = checkpoint.restore(dst)
    assert compare(orbax_corpus.expected("multiprocess_zarr3"), got) == []
    md = checkpoint.metadata(dst)
    assert md["kernel"].chunks_stored == md["kernel"].nchunks


def test_step_dir_dict_and_item_selection(orbax_corpus: Corpus) -> None:
    step = orbax_corpus.path("manager") / orbax_corpus.cases["manager"]["step_dir"]
    everything = checkpoint.restore(step)
    assert set(everything) == {"params", "opt_state", "meta", "metrics"}
    assert everything["metrics"] == {"loss": 2.0}
    assert checkpoint.restore(step, item="meta") == everything["meta"]
    with pytest.raises(FileNotFoundError, match="no item"):
        checkpoint.restore(step, item="nope")
    with pytest.raises(ValueError, match="step directory"):
        checkpoint.restore(step / "params", item="params")


def test_numpy_targets_and_subtree_selection(orbax_corpus: Corpus) -> None:
    """Targets without JAX: dtype casts, scalar types, ``...`` skips, ``None`` subtrees."""
    p = orbax_corpus.path("pytree_zarr3_ocdbt")
    full = checkpoint.restore(p)
    target = {
        "params": {"layer0": None, "embed": np.zeros((32, 4), np.float32)},
        "py_int": 0.0,
        "np_scalar": np.float64(0),
        "name": ...,
        "lst": [np.zeros(3, np.float16), 0, None, None],
    }
    got = checkpoint.restore(p, target)
    assert set(got["params"]) == {"layer0", "embed"}
    assert compare(orbax_corpus.expected("pytree_zarr3_ocdbt")["params"]["layer0"], got["params"]["layer0"]) == []
    assert got["params"]["embed"].dtype == np.float32
    np.testing.assert_array_equal(got["params"]["embed"], full["params"]["embed"].astype(np.float32))
    assert got["py_int"] == 3.0 and type(got["py_int"]) is float
    assert type(got["np_scalar"]) is np.float64 and got["np_scalar"] == 2.5
    assert got["name"] is Ellipsis
    assert got["lst"][0].dtype == np.float16 and got["lst"][2] == "in a list"
    assert compare(orbax_corpus.expected("pytree_zarr3_ocdbt")["lst"][3], got["lst"][3]) == []
    lazy = checkpoint.restore(p, {"params": {"embed": np.zeros((32, 4), np.float32)}}, lazy=True)
    assert isinstance(lazy["params"]["embed"], LazyArray) and lazy["params"]["embed"].dtype == np.float32
    np.testing.assert_array_equal(lazy["params"]["embed"][3:5], full["params"]["embed"][3:5].astype(np.float32))
    with pytest.raises(FileNotFoundError, match="no leaf named 'params.nope'"):
        checkpoint.restore(p, {"params": {"nope": np.zeros(1)}})
    with pytest.raises(ValueError, match="shape"):
        checkpoint.restore(p, {"params": {"embed": np.zeros((4, 32), np.float32)}})


def test_metadata_scanner_agrees_with_generic_parser(orbax_corpus: Corpus) -> None:
    """Every ``_METADATA`` Orbax wrote: the specialised scanner gives the same TreeMetadata as
    the generic JSON parser (or declines), and takes the regular ones."""
    from ocdbt_py.checkpoint.jsonio import parse_json
    from ocdbt_py.checkpoint.treemeta import Leaf, parse_tree_metadata, scan_tree_metadata

    def fields(tm: Any) -> Any:
        return ([tuple(repr(getattr(x, s)) for s in Leaf.__slots__) for x in tm.leaves], tm.use_ocdbt, tm.use_zarr3,
                tm.store_array_data_equal_to_fill_value, repr(tm.custom_metadata), tm.has_rich_value_tree)

    files = sorted(orbax_corpus.root.rglob("_METADATA"))
    taken = 0
    for f in files:
        raw = f.read_bytes()
        try:
            slow = fields(parse_tree_metadata(parse_json(raw, what=str(f))))
        except CorruptionError:
            slow = None
        fast = scan_tree_metadata(raw.decode("utf-8", "replace"))
        if fast is not None:
            taken += 1
            assert fields(fast) == slow, f
    assert files and taken >= len(files) * 0.9, (taken, len(files))
