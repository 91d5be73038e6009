//! libvirt client.
