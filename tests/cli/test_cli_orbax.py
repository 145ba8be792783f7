"""The command-line tool on a real Orbax checkpoint (written by Orbax in a child process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("jax")
pytest.importorskip("orbax.checkpoint")

pytestmark = pytest.mark.orbax

_SAVE = textwrap.dedent(
    """
    import os, sys
    os.environ["JAX_PLATFORMS"] = "cpu"
    import numpy as np
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    tree = {
        "params": {"w": jnp.arange(12, dtype=jnp.float32).reshape(3, 4), "b": jnp.ones((4,), jnp.float32)},
        "step": np.int32(7),
    }
    mngr = ocp.CheckpointManager(sys.argv[1], item_names=("state",))
    mngr.save(3, args=ocp.args.Composite(state=ocp.args.PyTreeSave(tree)))
    mngr.wait_until_finished()
    mngr.close()
    """
)


@pytest.fixture(scope="module")
def orbax_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("orbax") / "ckpt"
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    subprocess.run([sys.executable, "-c", _SAVE, str(root)], check=True, env=env, timeout=300,
                   capture_output=True)
    assert (root / "3" / "state" / "manifest.ocdbt").exists()
    return root


def test_ls_info_verify_on_item_directory(cli, orbax_root: Path) -> None:
    item = orbax_root / "3" / "state"
    r = cli("ls", item)
    assert r.status == 0, r.err
    keys = r.out.splitlines()
    assert {"params.w/.zarray", "params.b/.zarray", "step/.zarray"} <= set(keys)
    assert any(k.startswith("params.w/") and not k.endswith(".zarray") for k in keys)
    meta = json.loads(cli("get", item, "params.w/.zarray").out)
    assert meta["shape"] == [3, 4] and meta["dtype"] == "<f4"
    long = cli("ls", "-l", item).out
    assert "params.w/.zarray" in long
    info = json.loads(cli("info", "--json", item).out)
    assert info["num_keys"] == len(keys)
    assert cli("info", item).status == 0
    r = cli("verify", item)
    assert r.status == 0, r.out
    # the per-process database below the merged root is a database too
    assert cli("verify", item / "ocdbt.process_0").status == 0


def test_step_and_root_directories_point_to_the_item(cli, orbax_root: Path) -> None:
    item = orbax_root / "3" / "state"
    for where in (orbax_root / "3", orbax_root):
        r = cli("ls", where)
        assert r.status == 2
        assert str(item) in r.err and "Traceback" not in r.err
        assert cli("verify", where).status == 2


def test_subprocess_verify_on_checkpoint(subproc, orbax_root: Path) -> None:
    p = subproc("verify", orbax_root / "3" / "state")
    assert p.returncode == 0, p.stdout + p.stderr
    p = subproc("ls", orbax_root / "3")
    assert p.returncode == 2 and b"state" in p.stderr
