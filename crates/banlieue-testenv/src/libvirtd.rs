//! A real libvirtd serving TLS on loopback with a throwaway PKI.
