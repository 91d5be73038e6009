// Command golibvirt drives github.com/digitalocean/go-libvirt for the peer benchmark
// (benches/peer.rs), which builds it once and runs it as a subprocess. Each mode connects
// over the TLS URI it is given (with ?pkipath=, as virsh takes it) and prints one line of
// space-separated numbers: seconds of wall time and of CPU time (getrusage: all threads, the
// garbage collector included), and counts the benchmark checks.
//
//	golibvirt connect URI K                    K connects: wall cpu (connect only, summed)
//	golibvirt calls URI N M T                  GET_LIB_VERSION: N sequential, then M over T
//	                                           goroutines: seq inflight seq_cpu inflight_cpu
//	golibvirt lookup URI PREFIX DOMAINS M T    M DOMAIN_LOOKUP_BY_NAME over T goroutines,
//	                                           names PREFIX0000…: wall cpu
//	golibvirt list URI K                       K sequential LIST_ALL_DOMAINS: wall cpu domains
//	golibvirt upload|download URI POOL VOL FILE
package main

import (
	"bufio"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	libvirt "github.com/digitalocean/go-libvirt"
)

func main() {
	if len(os.Args) < 3 {
		fail(fmt.Errorf("usage: golibvirt connect|calls|lookup|list|upload|download URI ..."))
	}
	mode, uri, rest := os.Args[1], os.Args[2], os.Args[3:]
	switch mode {
	case "connect":
		connects(uri, num(rest, 0))
	case "calls":
		calls(uri, num(rest, 0), num(rest, 1), num(rest, 2))
	case "lookup":
		if len(rest) < 4 {
			fail(fmt.Errorf("lookup URI PREFIX DOMAINS M T"))
		}
		lookups(uri, rest[0], num(rest, 1), num(rest, 2), num(rest, 3))
	case "list":
		lists(uri, num(rest, 0))
	case "upload", "download":
		if len(rest) < 3 {
			fail(fmt.Errorf("%s URI POOL VOL FILE", mode))
		}
		transfer(mode, uri, rest[0], rest[1], rest[2])
	default:
		fail(fmt.Errorf("unknown mode %q", mode))
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "golibvirt:", err)
	os.Exit(1)
}

func check(err error) {
	if err != nil {
		fail(err)
	}
}

func num(args []string, i int) int {
	if i >= len(args) {
		fail(fmt.Errorf("missing argument %d", i+1))
	}
	n, err := strconv.Atoi(args[i])
	check(err)
	return n
}

// cpu is this process's user and system time so far, all threads.
func cpu() time.Duration {
	var ru syscall.Rusage
	check(syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func connect(uri string) *libvirt.Libvirt {
	u, err := url.Parse(uri)
	check(err)
	l, err := libvirt.ConnectToURI(u)
	check(err)
	return l
}

func connects(uri string, k int) {
	var wall, spent time.Duration
	for i := 0; i < k; i++ {
		start, c := time.Now(), cpu()
		l := connect(uri)
		wall += time.Since(start)
		spent += cpu() - c
		check(l.Disconnect())
	}
	fmt.Println(wall.Seconds(), spent.Seconds())
}

// parallel runs m calls of f spread over t goroutines; f gets the call's index.
func parallel(m, t int, f func(i int) error) {
	var wg sync.WaitGroup
	errs := make(chan error, t)
	for g := 0; g < t; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := g; i < m; i += t {
				if err := f(i); err != nil {
					errs <- err
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		fail(err)
	}
}

func calls(uri string, n, m, t int) {
	l := connect(uri)
	defer l.Disconnect()
	for i := 0; i < 200; i++ {
		_, err := l.ConnectGetLibVersion()
		check(err)
	}
	start, c := time.Now(), cpu()
	for i := 0; i < n; i++ {
		_, err := l.ConnectGetLibVersion()
		check(err)
	}
	seq, seqCPU := time.Since(start), cpu()-c
	start, c = time.Now(), cpu()
	parallel(m, t, func(int) error {
		_, err := l.ConnectGetLibVersion()
		return err
	})
	fmt.Println(seq.Seconds(), time.Since(start).Seconds(), seqCPU.Seconds(), (cpu() - c).Seconds())
}

func lookups(uri, prefix string, domains, m, t int) {
	l := connect(uri)
	defer l.Disconnect()
	names := make([]string, domains)
	for i := range names {
		names[i] = fmt.Sprintf("%s%04d", prefix, i)
	}
	for i := 0; i < 200; i++ {
		_, err := l.DomainLookupByName(names[i%domains])
		check(err)
	}
	start, c := time.Now(), cpu()
	parallel(m, t, func(i int) error {
		_, err := l.DomainLookupByName(names[i%domains])
		return err
	})
	fmt.Println(time.Since(start).Seconds(), (cpu() - c).Seconds())
}

func lists(uri string, k int) {
	l := connect(uri)
	defer l.Disconnect()
	count := 0
	for i := 0; i < 2; i++ {
		doms, _, err := l.ConnectListAllDomains(1, 0)
		check(err)
		count = len(doms)
	}
	start, c := time.Now(), cpu()
	for i := 0; i < k; i++ {
		doms, _, err := l.ConnectListAllDomains(1, 0)
		check(err)
		if len(doms) != count {
			fail(fmt.Errorf("listed %d domains, then %d", count, len(doms)))
		}
	}
	fmt.Println(time.Since(start).Seconds(), (cpu() - c).Seconds(), count)
}

func transfer(mode, uri, poolName, volName, file string) {
	l := connect(uri)
	defer l.Disconnect()
	pool, err := l.StoragePoolLookupByName(poolName)
	check(err)
	vol, err := l.StorageVolLookupByName(pool, volName)
	check(err)
	if mode == "upload" {
		f, err := os.Open(file)
		check(err)
		defer f.Close()
		info, err := f.Stat()
		check(err)
		check(l.StorageVolUpload(vol, bufio.NewReaderSize(f, 1<<20), 0, uint64(info.Size()), 0))
		return
	}
	f, err := os.Create(file)
	check(err)
	w := bufio.NewWriterSize(f, 1<<20)
	check(l.StorageVolDownload(vol, w, 0, 0, 0))
	check(w.Flush())
	check(f.Close())
}
