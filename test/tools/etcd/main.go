// Command etcd is etcd v3.6 built from its Go module, for the test harness and the lab.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
