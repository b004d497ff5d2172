// Command pause is the sandbox container's process for the end-to-end suite's node: it holds
// the pod's namespaces open, doing nothing, until SIGTERM or SIGINT. (Kubernetes' own pause is
// C; this one is built from Go like every other peer, so no image has to be downloaded.)
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	<-signals
}
