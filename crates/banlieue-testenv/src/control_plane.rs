//! A real kube-apiserver, kube-controller-manager and etcd on loopback.
