"""Unit, property and fuzz tests of the OCDBT codecs and read path."""
