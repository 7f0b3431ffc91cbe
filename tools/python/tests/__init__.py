"""Tests of the zpccl Python package; run them with tools/python/tests/run.py."""
import os
import pathlib

#: The source tree the package under test comes from: $ZPCCL_TEST_SOURCE_TREE (run.py --installed sets it, when
#: the suite runs from a copy against the installed package), else the tree holding this folder.
SOURCE_TREE = pathlib.Path(os.environ.get("ZPCCL_TEST_SOURCE_TREE") or pathlib.Path(__file__).resolve().parents[3])
