// Package measure holds what coroner's benchmark programs (test/bench/...) share: the
// percentile of a sample of durations, a process's CPU time from /proc, klog kept off the terminal so that a program's
// table is all it prints, a program's main (root, signals, exit status), and for the
// benchmarks on the lab: the lab that is up, its nodes, a pod watch that resumes.
package measure

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"time"

	"k8s.io/klog/v2"
)

// Percentile returns the p-th percentile (nearest rank, 0 < p <= 100) of ds; 0 for none.
func Percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (p*len(s)+99)/100 - 1
	return s[min(max(i, 0), len(s)-1)]
}

// QuietKlog sends klog's output to file at verbosity v, or nowhere when file is empty.
func QuietKlog(file string, v int) {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("logtostderr", "false")
	_ = fs.Set("alsologtostderr", "false")
	_ = fs.Set("stderrthreshold", "FATAL")
	_ = fs.Set("v", fmt.Sprint(v))
	if file != "" {
		_ = fs.Set("log_file", file)
		return
	}
	klog.SetOutput(io.Discard)
}
