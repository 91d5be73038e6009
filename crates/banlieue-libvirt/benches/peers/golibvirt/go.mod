module banlieue.invalid/golibvirt-peer

go 1.24.0

require github.com/digitalocean/go-libvirt v0.0.0-20261013170128-efbbdf578ac8

require (
	golang.org/x/crypto v0.48.0 // indirect
	golang.org/x/sys v0.41.0 // indirect
)
