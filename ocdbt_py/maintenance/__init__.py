"""Whole-database maintenance above :class:`ocdbt_py.store.OcdbtStore`: ``verify`` (every
node of every version) and ``gc`` (unreferenced data files)."""
