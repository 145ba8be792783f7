"""Metadata parsing, validation and TensorStore-identical output."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

import zarr3
from ocdbt_py.kvstore import MemoryStore
from zarr3.codecs import ShardingCodec
from zarr3.errors import MetadataError
from zarr3.metadata_v2 import ArrayMetadataV2, parse_zarray
from zarr3.metadata_v3 import ArrayMetadataV3, GroupMetadataV3, parse_zarr_json

# Exactly what Orbax/TensorStore write (orbax-layout.md §2.2 and §2.3).
ORBAX_ZARRAY = (
    b'{"chunks":[2,8],"compressor":{"id":"zstd","level":1},"dimension_separator":".",'
    b'"dtype":"<f4","fill_value":null,"filters":null,"order":"C","shape":[8,16],"zarr_format":2}'
)
ORBAX_ZARR_JSON = (
    b'{"chunk_grid":{"configuration":{"chunk_shape":[2,8]},"name":"regular"},'
    b'"chunk_key_encoding":{"name":"default"},'
    b'"codecs":[{"configuration":{"chunk_shape":[2,8],'
    b'"codecs":[{"configuration":{"endian":"little"},"name":"bytes"},'
    b'{"configuration":{"checksum":false,"level":3},"name":"zstd"}],'
    b'"index_codecs":[{"configuration":{"endian":"little"},"name":"bytes"},{"name":"crc32c"}]},'
    b'"name":"sharding_indexed"}],'
    b'"data_type":"float32","fill_value":0.0,"node_type":"array","shape":[8,16],"zarr_format":3}'
)


def test_orbax_v2_metadata_round_trips_byte_exact() -> None:
    meta = parse_zarray(ORBAX_ZARRAY)
    assert meta.shape == (8, 16) and meta.chunk_shape == (2, 8)
    assert meta.fill_value is None
    assert meta.to_bytes() == ORBAX_ZARRAY


def test_orbax_v3_metadata_round_trips_byte_exact() -> None:
    meta = parse_zarr_json(ORBAX_ZARR_JSON)
    assert isinstance(meta, ArrayMetadataV3)
    assert isinstance(meta.chain.ab, ShardingCodec)
    assert meta.to_bytes() == ORBAX_ZARR_JSON


def test_create_writes_orbax_identical_metadata() -> None:
    store = MemoryStore()
    zarr3.create(
        store,
        "p3",
        shape=(8, 16),
        dtype="float32",
        chunks=(2, 8),
        shards=(2, 8),
        codecs=None,
        compressor={"name": "zstd", "configuration": {"level": 3}},
    )
    assert store.get("p3/zarr.json") == ORBAX_ZARR_JSON
    zarr3.create(
        store,
        "p2",
        shape=(8, 16),
        dtype="<f4",
        chunks=(2, 8),
        zarr_format=2,
        compressor={"id": "zstd", "level": 1},
    )
    assert store.get("p2/.zarray") == ORBAX_ZARRAY


def _base(**over: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": [4, 6],
        "data_type": "float32",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2, 3]}},
        "chunk_key_encoding": {"name": "default"},
        "fill_value": 0.0,
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
    }
    meta.update(over)
    return meta


def test_normalisation_like_tensorstore() -> None:
    m = ArrayMetadataV3.from_json(
        _base(
            data_type="uint8",
            fill_value=0,
            codecs=[
                {"name": "transpose", "configuration": {"order": "F"}},
                "bytes",
                {"name": "gzip"},
                {"name": "zstd"},
                {"name": "crc32c", "configuration": {}},
            ],
            dimension_names=[None, None],
            attributes={},
            storage_transformers=[],
            chunk_key_encoding={"name": "default", "configuration": {"separator": "/"}},
        )
    )
    out = json.loads(m.to_bytes())
    assert out["codecs"] == [
        {"configuration": {"order": [1, 0]}, "name": "transpose"},
        {"name": "bytes"},  # no endian for 1-byte types
        {"configuration": {"level": 6}, "name": "gzip"},
        {"configuration": {"checksum": False, "level": 3}, "name": "zstd"},
        {"name": "crc32c"},
    ]
    assert "dimension_names" not in out and "attributes" not in out
    assert "storage_transformers" not in out
    assert out["chunk_key_encoding"] == {"name": "default"}


def test_dimension_names_attributes_and_extensions_kept() -> None:
    m = ArrayMetadataV3.from_json(
        _base(
            dimension_names=["x", None],
            attributes={"z": 1, "a": [1, 2]},
            foo={"must_understand": False, "v": 1},
        )
    )
    text = m.to_bytes().decode()
    assert text.startswith('{"attributes":{"a":[1,2],"z":1},')
    assert '"dimension_names":["x",null]' in text
    assert '"foo":{"must_understand":false,"v":1}' in text


@pytest.mark.parametrize(
    "over, field",
    [
        ({"zarr_format": 2}, "zarr_format"),
        ({"node_type": "banana"}, "node_type"),
        ({"shape": [4, -1]}, "shape"),
        ({"shape": "4"}, "shape"),
        ({"data_type": "float128"}, "data_type"),
        ({"chunk_grid": {"name": "rectilinear", "configuration": {}}}, "chunk_grid.name"),
        (
            {"chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2]}}},
            "chunk_grid.configuration.chunk_shape",
        ),
        (
            {"chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [0, 3]}}},
            "chunk_grid.configuration.chunk_shape",
        ),
        ({"chunk_key_encoding": {"name": "v3"}}, "chunk_key_encoding.name"),
        (
            {"chunk_key_encoding": {"name": "default", "configuration": {"separator": "-"}}},
            "chunk_key_encoding.configuration.separator",
        ),
        ({"fill_value": "zero"}, "fill_value"),
        ({"codecs": [{"name": "zstd"}]}, "codecs[0].name"),
        ({"codecs": []}, "codecs"),
        ({"codecs": ["bytes", "bytes"]}, "codecs[1].name"),
        ({"codecs": ["bytes", {"name": "transpose", "configuration": {"order": [1, 0]}}]}, "codecs[1].name"),
        (
            {"codecs": [{"name": "transpose", "configuration": {"order": [0, 0]}}, "bytes"]},
            "codecs[0].configuration.order",
        ),
        (
            {"codecs": [{"name": "transpose", "configuration": {"order": [0, 1, 2]}}, "bytes"]},
            "codecs[0].configuration.order",
        ),
        ({"codecs": [{"name": "zstd", "configuration": {"level": "high"}}]}, "codecs[0].configuration.level"),
        ({"codecs": ["bytes", {"name": "zstd", "configuration": {"level": 1.5}}]}, "codecs[1].configuration.level"),
        ({"codecs": ["bytes", {"name": "gzip", "configuration": {"level": "9"}}]}, "codecs[1].configuration.level"),
        ({"codecs": ["bytes", {"name": "blosc", "configuration": {"cname": "lzma"}}]}, "codecs[1].configuration.cname"),
        ({"codecs": [{"name": "bytes", "configuration": {"endian": "middle"}}]}, "codecs[0].configuration.endian"),
        ({"codecs": [{"name": "bytes", "configuration": {"foo": 1}}]}, "codecs[0].configuration.foo"),
        (
            {"codecs": [{"name": "sharding_indexed", "configuration": {"chunk_shape": [3, 3]}}]},
            "codecs[0].configuration.chunk_shape",
        ),
        (
            {
                "codecs": [
                    {
                        "name": "sharding_indexed",
                        "configuration": {"chunk_shape": [1, 1], "index_codecs": ["bytes", "zstd"]},
                    }
                ]
            },
            "codecs[0].configuration.index_codecs",
        ),
        (
            {
                "codecs": [
                    {"name": "sharding_indexed", "configuration": {"chunk_shape": [1, 1], "index_location": "middle"}}
                ]
            },
            "codecs[0].configuration.index_location",
        ),
        ({"dimension_names": ["x"]}, "dimension_names"),
        ({"attributes": [1]}, "attributes"),
        ({"storage_transformers": [{"name": "x"}]}, "storage_transformers"),
        ({"unknown_field": 1}, "unknown_field"),
        ({"unknown_field": {"must_understand": True}}, "unknown_field"),
    ],
)
def test_invalid_v3_metadata_names_field_and_value(over: dict[str, Any], field: str) -> None:
    with pytest.raises(MetadataError) as ei:
        ArrayMetadataV3.from_json(_base(**over))
    assert ei.value.field == field, str(ei.value)
    assert field in str(ei.value)


def test_missing_required_members() -> None:
    for key in ("shape", "data_type", "chunk_grid", "fill_value", "codecs"):
        meta = _base()
        del meta[key]
        with pytest.raises(MetadataError) as ei:
            ArrayMetadataV3.from_json(meta)
        assert ei.value.field == key


def test_absurd_sizes_rejected_up_front() -> None:
    with pytest.raises(MetadataError):
        ArrayMetadataV3.from_json(
            _base(shape=[4] * 33, chunk_grid={"name": "regular", "configuration": {"chunk_shape": [1] * 33}})
        )
    with pytest.raises(MetadataError) as ei:
        ArrayMetadataV3.from_json(
            _base(
                shape=[2**40, 2**40], chunk_grid={"name": "regular", "configuration": {"chunk_shape": [2**30, 2**30]}}
            )
        )
    assert ei.value.field == "chunk_grid.configuration.chunk_shape"
    with pytest.raises(MetadataError):
        ArrayMetadataV3.from_json(_base(shape=[2**63, 1]))
    # a shard index with more entries than the limit
    with pytest.raises(MetadataError) as ei:
        ArrayMetadataV3.from_json(
            _base(
                data_type="uint8",
                fill_value=0,
                shape=[2**20, 2**20],
                chunk_grid={"name": "regular", "configuration": {"chunk_shape": [2**14, 2**14]}},
                codecs=[{"name": "sharding_indexed", "configuration": {"chunk_shape": [1, 1]}}],
            )
        )
    assert "inner chunks per shard" in str(ei.value)


def test_invalid_json_is_metadata_error() -> None:
    with pytest.raises(MetadataError):
        parse_zarr_json(b"{not json")
    with pytest.raises(MetadataError):
        parse_zarr_json(b"[1, 2]")
    with pytest.raises(MetadataError):
        parse_zarr_json(b'{"zarr_format":3,"node_type":"array","fill_value":NaN}')


def test_group_metadata() -> None:
    g = parse_zarr_json(b'{"zarr_format":3,"node_type":"group","attributes":{"b":1,"a":2}}')
    assert isinstance(g, GroupMetadataV3)
    assert g.attrs == {"a": 2, "b": 1}
    assert g.to_bytes() == b'{"attributes":{"a":2,"b":1},"node_type":"group","zarr_format":3}'


# -- v2 ----------------------------------------------------------------------------------
def _zarray(**over: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "zarr_format": 2,
        "shape": [4, 6],
        "chunks": [2, 3],
        "dtype": "<f4",
        "compressor": None,
        "fill_value": None,
        "filters": None,
        "order": "C",
    }
    meta.update(over)
    return meta


def test_v2_defaults_and_output() -> None:
    m = ArrayMetadataV2.from_json(_zarray())
    assert m.dimension_separator == "."
    assert m.chunk_key((1, 2)) == "1.2"
    assert m.chunk_key(()) == "0"
    out = json.loads(m.to_bytes())
    assert out["dimension_separator"] == "." and out["filters"] is None
    m2 = ArrayMetadataV2.from_json(_zarray(dimension_separator="/", order="F", dtype=">i8", fill_value=3))
    assert m2.chunk_key((1, 2)) == "1/2"
    assert json.loads(m2.to_bytes())["dtype"] == ">i8"


@pytest.mark.parametrize(
    "over, field",
    [
        ({"zarr_format": 3}, "zarr_format"),
        ({"filters": [{"id": "delta"}]}, "filters[0].dtype"),
        ({"filters": {"id": "delta"}}, "filters"),
        ({"order": "K"}, "order"),
        ({"dimension_separator": "-"}, "dimension_separator"),
        ({"compressor": {"id": 3}}, "compressor.id"),
        ({"compressor": {"id": "zstd", "level": "x"}}, "compressor.level"),
        ({"compressor": {"id": "blosc", "shuffle": 7}}, "compressor.shuffle"),
        ({"compressor": 5}, "compressor"),
        ({"dtype": "<U0"}, "dtype"),
        ({"dtype": "|O"}, "filters"),
        ({"chunks": [2]}, "chunks"),
        ({"chunks": [0, 3]}, "chunks"),
        ({"fill_value": "NaN", "dtype": "<i4"}, "fill_value"),
    ],
)
def test_invalid_v2_metadata(over: dict[str, Any], field: str) -> None:
    with pytest.raises(MetadataError) as ei:
        ArrayMetadataV2.from_json(_zarray(**over))
    assert ei.value.field == field, str(ei.value)


@pytest.mark.parametrize(
    "v3, v2",
    [
        ({"codecs": [{"name": "lzmaX"}]}, {"compressor": {"id": "zfpy"}}),
        ({"codecs": ["bytes", {"name": "numcodecs.fletcher32"}]}, {"filters": [{"id": "pickle"}], "dtype": "|O"}),
    ],
)
def test_unknown_codecs_are_unsupported_not_invalid(v3: dict[str, Any], v2: dict[str, Any]) -> None:
    """A codec we do not implement is a real limit (UnsupportedError naming it), not bad metadata."""
    from ocdbt_py.errors import UnsupportedError as OcdbtUnsupported
    from zarr3.errors import UnsupportedError

    with pytest.raises(UnsupportedError) as ei:
        ArrayMetadataV3.from_json(_base(**v3))
    assert isinstance(ei.value, OcdbtUnsupported) and not isinstance(ei.value, MetadataError)
    with pytest.raises(UnsupportedError) as ei:
        ArrayMetadataV2.from_json(_zarray(**v2))
    assert ("zfpy" in str(ei.value)) or ("pickle" in str(ei.value) and "arbitrary code" in str(ei.value))


@pytest.mark.parametrize(
    "comp",
    [
        {"id": "gzip", "level": -1},
        {"id": "zlib", "level": -1},
        {"id": "lz4", "acceleration": 0},
        {"id": "lz4", "acceleration": -1},
        {"id": "zstd", "level": 100},
        {"id": "blosc", "cname": "zstd", "clevel": 12, "shuffle": 1},
    ],
)
def test_encoder_only_settings_are_accepted_and_kept(comp: dict[str, Any]) -> None:
    """zarr-python writes these; the decoder does not need them, encoding clamps them."""
    m = ArrayMetadataV2.from_json(_zarray(compressor=comp))
    out = json.loads(m.to_bytes())["compressor"]
    assert {k: out[k] for k in comp} == comp
    chunk = np.arange(6, dtype="<f4").reshape(2, 3)
    enc = m.chain.encode(chunk)
    assert enc is not None
    np.testing.assert_array_equal(m.chain.decode(enc), chunk)


def test_v2_compressors_round_trip() -> None:
    for comp, expected in [
        ({"id": "zstd", "level": 1}, {"id": "zstd", "level": 1}),
        ({"id": "zstd", "level": 0, "checksum": False}, {"id": "zstd", "level": 0}),
        ({"id": "zlib"}, {"id": "zlib", "level": 1}),
        ({"id": "gzip", "level": 5}, {"id": "gzip", "level": 5}),
        ({"id": "bz2", "level": 9}, {"id": "bz2", "level": 9}),
        ({"id": "lz4"}, {"acceleration": 1, "id": "lz4"}),
        (
            {"id": "blosc"},
            {"blocksize": 0, "clevel": 5, "cname": "lz4", "id": "blosc", "shuffle": 1},
        ),
        (
            {"id": "blosc", "cname": "zstd", "clevel": 3, "shuffle": -1, "blocksize": 0},
            {"blocksize": 0, "clevel": 3, "cname": "zstd", "id": "blosc", "shuffle": -1},
        ),
    ]:
        m = ArrayMetadataV2.from_json(_zarray(compressor=comp))
        assert json.loads(m.to_bytes())["compressor"] == expected


def test_metadata_error_in_store_names_location() -> None:
    store = MemoryStore({"a/zarr.json": json.dumps(_base(data_type="nope")).encode()})
    with pytest.raises(MetadataError) as ei:
        zarr3.open(store, "a")
    assert "data_type" in str(ei.value) and "'nope'" in str(ei.value)
    assert "MemoryStore" in str(ei.value)


def test_fill_value_bits_preserved_through_metadata() -> None:
    m = ArrayMetadataV3.from_json(_base(data_type="bfloat16", fill_value="0x7fe0"))
    assert m.fill_value.view(np.uint16) == 0x7FE0
    assert b'"fill_value":"0x7fe0"' in m.to_bytes()
