// Command etcd is the etcd server, built from the etcd module at the version
// pinned in this module's go.mod so tests get a known etcd without downloading
// release archives.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
