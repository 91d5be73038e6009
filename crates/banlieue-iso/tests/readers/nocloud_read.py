"""Parses an extracted seed directory with cloud-init's own NoCloud datasource.

usage: nocloud_read.py SEEDDIR   (run with Debian's /usr/bin/python3, which has cloudinit)

Places SEEDDIR where DataSourceNoCloud looks for a seed directory (seed_dir/nocloud), disables
the device search (there is no block device here), runs the datasource, and prints JSON with
the instance id, hostname, and the raw user-data, vendor-data and parsed network-config.
"""
import base64
import json
import os
import sys
import tempfile

from cloudinit import helpers
from cloudinit.sources import DataSourceNoCloud


def b64(data):
    if data is None:
        return None
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    return base64.b64encode(data).decode("ascii")


def main():
    seed = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory() as cloud_dir:
        seed_dir = os.path.join(cloud_dir, "seed")
        os.makedirs(seed_dir)
        os.symlink(seed, os.path.join(seed_dir, "nocloud"))
        paths = helpers.Paths({"cloud_dir": cloud_dir, "run_dir": cloud_dir})
        sys_cfg = {"datasource": {"NoCloud": {"fs_label": None}}}
        source = DataSourceNoCloud.DataSourceNoCloud(sys_cfg, None, paths)
        if not source.get_data():
            sys.exit("NoCloud did not accept the seed")
        print(json.dumps({
            "instance_id": source.get_instance_id(),
            "local_hostname": source.metadata.get("local-hostname"),
            "user_data": b64(source.userdata_raw),
            "vendor_data": b64(source.vendordata_raw),
            "network_config": source.network_config,
        }))


main()
