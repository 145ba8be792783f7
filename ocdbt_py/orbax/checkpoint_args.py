"""``orbax.checkpoint.checkpoint_args``' names (the argument base class and the handler
registry functions), for scripts that import that module; they live in :mod:`ocdbt_py.orbax.args`."""

from __future__ import annotations

from ocdbt_py.orbax.args import (
    CheckpointArgs,
    get_registered_args_cls,
    get_registered_handler_cls,
    register_with_handler,
)

__all__ = ["CheckpointArgs", "register_with_handler", "get_registered_handler_cls", "get_registered_args_cls"]
