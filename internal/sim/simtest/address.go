package simtest

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"testing"

	"github.com/cp-rollout/cp-rollout/internal/sim/member"
)

// Loopback addresses. Simulated nodes and etcd members listen on the fixed
// kubeadm ports (2379, 2380), so two simulators, or two member clusters, must
// never share addresses — not within one test binary, and not between the test
// binaries `go test ./...` runs side by side. Every test that starts members
// takes a /24 of 127.0.0.0/8 (all of it is local on Linux) from here.
//
// A /24 is claimed by listening on its .1 address at the etcd client port for
// the rest of the process: the kernel hands that listener to one process only,
// so the claim holds across test binaries without any shared file, and it
// ends by itself when the process does. Nodes take .2 upwards, so .1 is never
// wanted by a member. Claims are never given back: there are 39,000 /24s to
// take and a test binary needs dozens.

const (
	// firstSecondOctet keeps clear of 127.0.0.0/16 (the API servers on
	// 127.0.0.1, and `make demo`'s default simulator on 127.0.0.x) and of the
	// fixed ranges older tests used.
	firstSecondOctet = 100
	lastSecondOctet  = 254
)

var addresses struct {
	sync.Mutex
	next   int // index of the next /24 to try
	claims []net.Listener
}

// AddressPrefix claims a loopback /24 of its own for the test and returns its
// first three octets ("127.x.y"), for sim.Options.AddressPrefix or for member
// addresses prefix+".2", prefix+".3", ….
func AddressPrefix(t testing.TB) string {
	t.Helper()
	prefix, err := claimPrefix()
	if err != nil {
		t.Fatal(err)
	}
	return prefix
}

func claimPrefix() (string, error) {
	addresses.Lock()
	defer addresses.Unlock()
	span := (lastSecondOctet - firstSecondOctet + 1) * 256
	if addresses.next == 0 {
		// Start each process somewhere else, so concurrent test binaries
		// rarely try the same /24s first; a collision only costs a retry.
		addresses.next = (os.Getpid() * 97) % span
	}
	for tries := 0; tries < span; tries++ {
		i := addresses.next % span
		addresses.next++
		prefix := fmt.Sprintf("127.%d.%d", firstSecondOctet+i/256, i%256)
		ln, err := net.Listen("tcp", net.JoinHostPort(prefix+".1", strconv.Itoa(member.DefaultClientPort)))
		if err != nil {
			continue // another process holds it
		}
		addresses.claims = append(addresses.claims, ln)
		return prefix, nil
	}
	return "", fmt.Errorf("no free loopback /24 in 127.%d-%d.x", firstSecondOctet, lastSecondOctet)
}
