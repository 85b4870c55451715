// Command etcd is upstream etcd, built from go.etcd.io/etcd/server/v3 at the
// version k8s.io/kubernetes requires, for the local test control plane.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
