// Command etcd is go.etcd.io/etcd/server/v3's etcdmain, built here so envtest
// can start a real etcd. See scripts/envtest.sh.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
