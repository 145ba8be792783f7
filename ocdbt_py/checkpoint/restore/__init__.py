"""The read side of checkpoints: ``restore()`` (:mod:`.api`), reading Zarr arrays of an item
(:mod:`.reader`, :mod:`.item`, :mod:`.storage`), chunk fetching from local files
(:mod:`.localread`) and object stores (:mod:`.remoteread`), and JAX/typed targets
(:mod:`.targets`, :mod:`.jax_restore`)."""
