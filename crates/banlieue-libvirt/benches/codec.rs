//! The codec benchmark against rpcgen/libtirpc (filled in by the next change).

fn main() {}
