"""Loads meta-data documents the way cloud-init's NoCloud datasource does.

Reads a JSON list of documents on stdin, parses each with cloudinit.util.load_yaml (PyYAML's
safe loader underneath), and prints a JSON list of the resulting mappings (null where parsing
failed). Run with Debian's /usr/bin/python3, which has cloudinit.
"""
import json
import sys

from cloudinit import util

documents = json.load(sys.stdin)
parsed = [util.load_yaml(doc, default=None) for doc in documents]
json.dump(parsed, sys.stdout)
