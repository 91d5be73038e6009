//! Nothing: the package is its test, `tests/public_api.rs`, which lists banlieue-libvirt's
//! public API and compares it with the reviewed snapshot.
