// Command cmd is test/kind's front end (make kind-image, kind-lab, kind-down):
//
//	go run ./test/kind/cmd image   # build the offline node image (cached)
//	go run ./test/kind/cmd up      # dockerd, kind cluster, coroner deployed
//	go run ./test/kind/cmd smoke   # FailIndex through the shim, a limit OOM stamped
//	go run ./test/kind/cmd down    # nothing left behind (the image stays cached)
//	go run ./test/kind/cmd docker  # only start our dockerd; prints DOCKER_HOST
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/coroner-dev/coroner/test/kind"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: go run ./test/kind/cmd image|up|smoke|down|docker")
		os.Exit(2)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	c, err := kind.New()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	start := time.Now()
	switch os.Args[1] {
	case "image":
		err = c.BuildImage(ctx)
	case "up":
		err = c.Up(ctx)
	case "smoke":
		err = c.Smoke(ctx)
	case "down":
		err = c.Down(ctx)
	case "docker":
		if err = c.StartDocker(ctx); err == nil {
			fmt.Println("export DOCKER_HOST=" + c.DockerHost())
		}
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "kind %s: %v (after %s)\n", os.Args[1], err, time.Since(start).Round(time.Second))
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "kind %s: done in %s\n", os.Args[1], time.Since(start).Round(time.Second))
}
