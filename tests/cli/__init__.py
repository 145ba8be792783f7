"""Tests of the ocdbt command-line tool and of ocdbt_py.maintenance.verify."""
