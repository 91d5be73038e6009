"""Reads an ISO with pycdlib and extracts both hierarchies.

usage: pycdlib_read.py IMAGE OUTDIR

Walks the Joliet and the ISO 9660 trees, writes every file under OUTDIR/joliet and
OUTDIR/iso9660, and prints a JSON object {"volume_id", "joliet": [...], "iso9660": [...]} whose
lists hold {"path", "dir", "size"} for every entry.
"""
import json
import os
import sys

import pycdlib


def walk(iso, kind, key, out):
    entries = []
    for parent, dirs, files in iso.walk(**{key: "/"}):
        base = parent.rstrip("/")
        for name in dirs:
            os.makedirs(os.path.join(out, kind, base.lstrip("/"), name), exist_ok=True)
            entries.append({"path": base + "/" + name, "dir": True, "size": 0})
        for name in files:
            path = base + "/" + name
            local = os.path.join(out, kind, path.lstrip("/"))
            os.makedirs(os.path.dirname(local), exist_ok=True)
            with open(local, "wb") as sink:
                iso.get_file_from_iso_fp(sink, **{key: path})
            record = iso.get_record(**{key: path})
            entries.append({"path": path, "dir": False, "size": record.get_data_length()})
    os.makedirs(os.path.join(out, kind), exist_ok=True)
    return entries


def main():
    image, out = sys.argv[1], sys.argv[2]
    iso = pycdlib.PyCdlib()
    iso.open(image)
    if not iso.has_joliet():
        sys.exit("no Joliet tree")
    result = {
        "volume_id": iso.pvd.volume_identifier.decode("ascii", "replace").rstrip(" "),
        "joliet": walk(iso, "joliet", "joliet_path", out),
        "iso9660": walk(iso, "iso9660", "iso_path", out),
    }
    iso.close()
    json.dump(result, sys.stdout)


main()
