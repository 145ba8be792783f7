"""Read algorithms over the pure codecs of :mod:`ocdbt_py.format`: fetching and caching nodes,
walking B+trees and version trees.  Imports :mod:`ocdbt_py.format`, :mod:`ocdbt_py.kvstore`
and :mod:`ocdbt_py.errors` only."""
