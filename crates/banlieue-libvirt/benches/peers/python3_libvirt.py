# The python3-libvirt side of the peer benchmark (benches/peer.rs runs it with Debian's
# /usr/bin/python3). Same modes and output as golibvirt/main.go: one line of numbers, seconds
# of wall time and of CPU time (time.process_time: all threads, the interpreter included).
#
#   connect URI K                   K connects: wall cpu (connect only, summed)
#   calls URI N M T                 GET_LIB_VERSION: N sequential, then M over T threads
#   lookup URI PREFIX DOMAINS M T   M DOMAIN_LOOKUP_BY_NAME over T threads: wall cpu
#   list URI K                      K sequential LIST_ALL_DOMAINS: wall cpu domains
#   upload|download URI POOL VOL FILE
import os
import sys
import threading
import time

import libvirt


def parallel(m, t, f):
    """m calls of f(i) spread over t threads, which libvirt-python runs concurrently."""
    errors = []

    def work(g):
        try:
            for i in range(g, m, t):
                f(i)
        except Exception as e:  # reported after the join, as a failure of the whole run
            errors.append(e)

    threads = [threading.Thread(target=work, args=(g,)) for g in range(t)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]


def connects(uri, k):
    wall = spent = 0.0
    for _ in range(k):
        s, c = time.perf_counter(), time.process_time()
        conn = libvirt.open(uri)
        wall += time.perf_counter() - s
        spent += time.process_time() - c
        conn.close()
    print(wall, spent)


def calls(uri, n, m, t):
    c = libvirt.open(uri)
    for _ in range(200):
        c.getLibVersion()
    s, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        c.getLibVersion()
    seq, seq_cpu = time.perf_counter() - s, time.process_time() - cpu
    s, cpu = time.perf_counter(), time.process_time()
    parallel(m, t, lambda i: c.getLibVersion())
    print(seq, time.perf_counter() - s, seq_cpu, time.process_time() - cpu)


def lookups(uri, prefix, domains, m, t):
    c = libvirt.open(uri)
    names = ["%s%04d" % (prefix, i) for i in range(domains)]
    for i in range(200):
        c.lookupByName(names[i % domains])
    s, cpu = time.perf_counter(), time.process_time()
    parallel(m, t, lambda i: c.lookupByName(names[i % domains]))
    print(time.perf_counter() - s, time.process_time() - cpu)


def lists(uri, k):
    c = libvirt.open(uri)
    count = 0
    for _ in range(2):
        count = len(c.listAllDomains(0))
    s, cpu = time.perf_counter(), time.process_time()
    for _ in range(k):
        n = len(c.listAllDomains(0))
        if n != count:
            raise SystemExit("listed %d domains, then %d" % (count, n))
    print(time.perf_counter() - s, time.process_time() - cpu, count)


def transfer(mode, uri, pool, vol, path):
    c = libvirt.open(uri)
    v = c.storagePoolLookupByName(pool).storageVolLookupByName(vol)
    st = c.newStream(0)
    if mode == "upload":
        with open(path, "rb") as f:
            v.upload(st, 0, os.fstat(f.fileno()).st_size, 0)
            st.sendAll(lambda _st, n, f: f.read(n), f)
    else:
        with open(path, "wb") as f:
            v.download(st, 0, 0, 0)
            st.recvAll(lambda _st, buf, f: f.write(buf), f)
    st.finish()


def main():
    mode, uri, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
    if mode == "connect":
        connects(uri, int(rest[0]))
    elif mode == "calls":
        calls(uri, *map(int, rest[:3]))
    elif mode == "lookup":
        lookups(uri, rest[0], *map(int, rest[1:4]))
    elif mode == "list":
        lists(uri, int(rest[0]))
    elif mode in ("upload", "download"):
        transfer(mode, uri, *rest[:3])
    else:
        raise SystemExit("unknown mode " + mode)


main()
