// Command vcsim serves govmomi's vCenter simulator (package simulator) for banlieue's tests.
//
// govmomi's own vcsim command lives in a nested module that the Go module proxy does not
// serve, so `scripts/control-plane build-vcsim` builds this small front end against the pinned
// govmomi module instead. It accepts the subset of vcsim's flags the tests use, with the same
// names and meanings, and prints one line `vcsim listening on URL` once it serves.
package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"log"
	"net/url"
	"os"
	"os/signal"
	"syscall"

	"github.com/vmware/govmomi/simulator"
)

func main() {
	model := simulator.VPX()
	flag.IntVar(&model.Datacenter, "dc", model.Datacenter, "datacenters")
	flag.IntVar(&model.Cluster, "cluster", model.Cluster, "clusters per datacenter")
	flag.IntVar(&model.ClusterHost, "host", model.ClusterHost, "hosts per cluster")
	flag.IntVar(&model.Host, "standalone-host", model.Host, "standalone hosts per datacenter")
	flag.IntVar(&model.Datastore, "ds", model.Datastore, "local datastores")
	flag.IntVar(&model.Machine, "vm", model.Machine, "virtual machines per resource pool")
	flag.IntVar(&model.Pool, "pool", model.Pool, "child resource pools per cluster")
	flag.IntVar(&model.Portgroup, "pg", model.Portgroup, "distributed port groups per datacenter")
	flag.IntVar(&model.Folder, "folder", model.Folder, "datacenters placed in a folder")
	flag.BoolVar(&model.Autostart, "autostart", model.Autostart, "power on the model's VMs")
	listen := flag.String("l", "127.0.0.1:0", "listen address (port 0: any free port)")
	cert := flag.String("tlscert", "", "TLS certificate (PEM); TLS is always on")
	key := flag.String("tlskey", "", "TLS private key (PEM)")
	user := flag.String("username", "", "the only user Login accepts (default: any non-empty)")
	pass := flag.String("password", "", "that user's password")
	flag.Parse()

	// The model keeps its datastores' files under TMPDIR: whoever starts vcsim points it at
	// a directory it removes, since a killed vcsim cannot clean up.
	if err := model.Create(); err != nil {
		log.Fatalf("create the inventory: %v", err)
	}
	u := &url.URL{Host: *listen}
	if *user != "" {
		u.User = url.UserPassword(*user, *pass)
	}
	model.Service.Listen = u
	model.Service.TLS = new(tls.Config)
	if *cert != "" {
		pair, err := tls.LoadX509KeyPair(*cert, *key)
		if err != nil {
			log.Fatalf("load the TLS key pair: %v", err)
		}
		model.Service.TLS.Certificates = []tls.Certificate{pair}
	}
	server := model.Service.NewServer()
	served := *server.URL
	served.User = nil
	fmt.Printf("vcsim listening on %s\n", served.String())

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	server.Close()
	model.Remove()
}
