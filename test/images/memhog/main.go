// Command memhog allocates memory until it is killed, for tests of OOM kills. It is built
// statically (CGO_ENABLED=0) into the busybox test image as /bin/memhog.
//
//	memhog [-step-mib N] [-interval D] [-max-mib M [-exit-after D]] [-child]
//
// Every interval it allocates step-mib MiB and writes to every page, so the memory is
// resident and charged to the container's memory cgroup; it never frees. With -max-mib it
// stops growing at M MiB and sleeps forever, or, with -exit-after, exits 0 that long after
// it got there (a task that needs M MiB and then succeeds). With -child it runs the allocation in a
// child process and waits for it: the child is the biggest process in the cgroup, so the
// OOM killer picks it while memhog itself (PID 1 of the container) survives, reports how
// the child ended on stderr, and sleeps until it is stopped. That is the "a child process
// was OOM-killed but the container kept running" case, where no exit code says OOM.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	step := flag.Int("step-mib", 4, "MiB to allocate per step")
	interval := flag.Duration("interval", 20*time.Millisecond, "time between steps")
	maxMiB := flag.Int("max-mib", 0, "stop growing at this many MiB (0: never)")
	child := flag.Bool("child", false, "allocate in a child process and survive its death")
	exitAfter := flag.Duration("exit-after", 0, "with -max-mib: exit 0 this long after reaching it (0: never)")
	flag.Parse()

	if *child {
		runChild(*step, *interval, *maxMiB)
		return
	}
	hog(*step, *interval, *maxMiB, *exitAfter)
}

// kept holds every allocation of hog, so that none is ever garbage: a package variable
// stays reachable whatever the compiler makes of a local one nothing reads.
var kept [][]byte

// hog allocates and touches step MiB per interval, forever or up to max MiB; with
// exitAfter it exits 0 that long after reaching max.
func hog(step int, interval time.Duration, maxMiB int, exitAfter time.Duration) {
	total := 0
	var reached time.Time
	for {
		if maxMiB > 0 && total >= maxMiB && exitAfter > 0 {
			if reached.IsZero() {
				reached = time.Now()
			} else if time.Since(reached) >= exitAfter {
				fmt.Fprintf(os.Stderr, "memhog: held %d MiB for %v, done\n", total, exitAfter)
				os.Exit(0)
			}
		}
		if maxMiB == 0 || total < maxMiB {
			b := make([]byte, step<<20)
			for i := 0; i < len(b); i += 4096 {
				b[i] = 1
			}
			kept = append(kept, b)
			total += step
			fmt.Fprintf(os.Stderr, "memhog: %d MiB\n", total)
		}
		time.Sleep(interval)
	}
}

// runChild starts memhog again without -child, waits for it and then waits for SIGTERM.
func runChild(step int, interval time.Duration, maxMiB int) {
	self, err := os.Executable()
	if err != nil {
		self = "/bin/memhog"
	}
	cmd := exec.Command(self, fmt.Sprintf("-step-mib=%d", step), fmt.Sprintf("-interval=%v", interval),
		fmt.Sprintf("-max-mib=%d", maxMiB))
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	err = cmd.Run()
	fmt.Fprintf(os.Stderr, "memhog: child ended: %v\n", err)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}
