package cli

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"
)

// AddLogFlags adds klog's verbosity flags (-v, --vmodule) to fs.
func AddLogFlags(fs *pflag.FlagSet) {
	gofs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(gofs)
	for _, name := range []string{"v", "vmodule"} {
		fs.AddGoFlag(gofs.Lookup(name))
	}
}

// Run runs a daemon's main loop: SIGTERM or SIGINT cancels its context for a graceful
// shutdown, a second signal exits at once; the context carries a logger named after the
// program. An error ends the program with one line on stderr and exit code 1.
func Run(name string, run func(ctx context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, syscall.SIGTERM, os.Interrupt)
	go func() {
		s := <-signals
		klog.Background().Info("Shutting down", "signal", s.String())
		cancel()
		<-signals
		fmt.Fprintf(os.Stderr, "%s: second signal, exiting without waiting\n", name)
		os.Exit(1)
	}()
	err := run(klog.NewContext(ctx, klog.Background().WithName(name)))
	cancel()
	klog.Flush()
	if err != nil {
		Exit(name, err)
	}
}

// Exit prints "name: err" on one line and exits 1 (a runtime failure, not bad usage).
func Exit(name string, err error) {
	fmt.Fprintf(os.Stderr, "%s: %s\n", name, oneLine(err))
	os.Exit(1)
}
