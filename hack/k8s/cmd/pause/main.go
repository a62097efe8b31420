// Command pause is PID 1 of the one-node cluster's pod sandboxes (the image
// registry.k8s.io/pause cannot be pulled here): it holds the pod's
// namespaces and exits on SIGTERM or SIGINT.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
	<-c
}
