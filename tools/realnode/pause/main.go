// Command pause is the sandbox ("pause") container of the single-node
// cluster of scripts/realnode.sh: it holds a pod's namespaces open and does
// nothing until it is told to stop. Static, so it runs in an empty image.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	// As PID 1 of the pod it also inherits orphans; reap them so none stays
	// a zombie.
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			return
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
