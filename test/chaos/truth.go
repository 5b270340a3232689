package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// The ground truth of a run is what the pods themselves wrote, through a hostPath volume,
// into a directory of this machine (the lab's nodes are processes on it): it does not
// depend on coroner, the kubelet or the API server being right, which is what is tested.
//
//	<root>/<job>/<index>/<pod>        "start <uptime> <node>", then "exit <code> <uptime>"
//	<root>/<job>/<index>/<pod>.beat   the uptime, rewritten every half second while it runs
//	<root>/<job>/<index>/failed       made (mkdir, atomic) by the one attempt that fails
//	<root>/restart/<pod>              "start <n> <uptime>" / "exit <code> <n> <uptime>" per
//	                                  run of a container restarted in place (n: its ordinal)
//
// Times are /proc/uptime, the same clock for every container of the machine (no time
// namespaces) at 10 ms resolution.

// attempt is one pod's run of an index, as the pod recorded it.
type attempt struct {
	Pod, Node  string
	Start, End float64
	// Exited is false when the pod never wrote its exit (it was killed, or still runs):
	// End is then its last heartbeat.
	Exited bool
	Code   int
}

// jobTruth is a Job's attempts by index.
type jobTruth map[int][]attempt

// readJobTruth reads <root>/<job>.
func readJobTruth(root, job string) (jobTruth, error) {
	t := jobTruth{}
	dir := filepath.Join(root, job)
	idxDirs, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return t, nil
	}
	if err != nil {
		return nil, err
	}
	for _, d := range idxDirs {
		ix, err := strconv.Atoi(d.Name())
		if err != nil || !d.IsDir() {
			continue
		}
		files, err := os.ReadDir(filepath.Join(dir, d.Name()))
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			name := f.Name()
			if f.IsDir() || strings.HasSuffix(name, ".beat") || name == "ran" {
				continue
			}
			a, err := readAttempt(filepath.Join(dir, d.Name(), name))
			if err != nil {
				return nil, err
			}
			a.Pod = name
			t[ix] = append(t[ix], a)
		}
		sort.Slice(t[ix], func(i, j int) bool { return t[ix][i].Start < t[ix][j].Start })
	}
	return t, nil
}

func readAttempt(path string) (attempt, error) {
	var a attempt
	b, err := os.ReadFile(path)
	if err != nil {
		return a, err
	}
	a, err = parseAttempt(string(b))
	if err != nil {
		return a, fmt.Errorf("%s: %w", path, err)
	}
	if beat, err := os.ReadFile(path + ".beat"); err == nil {
		if u, err := strconv.ParseFloat(strings.TrimSpace(string(beat)), 64); err == nil && !a.Exited && u > a.End {
			a.End = u
		}
	}
	return a, nil
}

// parseAttempt reads the lines a pod wrote: "start U NODE" and perhaps "exit CODE U".
func parseAttempt(s string) (attempt, error) {
	var a attempt
	started := false
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) >= 2 && f[0] == "start":
			u, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				return a, fmt.Errorf("bad start line %q", sc.Text())
			}
			a.Start, a.End, started = u, u, true
			if len(f) >= 3 {
				a.Node = f[2]
			}
		case len(f) == 3 && f[0] == "exit":
			code, err1 := strconv.Atoi(f[1])
			u, err2 := strconv.ParseFloat(f[2], 64)
			if err1 != nil || err2 != nil {
				return a, fmt.Errorf("bad exit line %q", sc.Text())
			}
			a.Exited, a.Code, a.End = true, code, u
		}
	}
	if !started {
		return a, fmt.Errorf("no start line")
	}
	return a, nil
}

// failures is how many attempts exited with a code other than 0.
func (t jobTruth) failures() int {
	n := 0
	for _, as := range t {
		for _, a := range as {
			if a.Exited && a.Code != 0 {
				n++
			}
		}
	}
	return n
}

// failuresOf is failures for one index.
func (t jobTruth) failuresOf(ix int) int {
	n := 0
	for _, a := range t[ix] {
		if a.Exited && a.Code != 0 {
			n++
		}
	}
	return n
}

// overlap is the total time, in seconds, during which two attempts of the same index ran
// at once (the sum over pairs of the intersection of their [Start, End]).
func overlap(as []attempt) float64 {
	total := 0.0
	for i := range as {
		for j := i + 1; j < len(as); j++ {
			lo := max(as[i].Start, as[j].Start)
			hi := min(as[i].End, as[j].End)
			if hi > lo {
				total += hi - lo
			}
		}
	}
	return total
}

// maxOverlap is the largest overlap of an index and that index (-1 when none overlaps).
func (t jobTruth) maxOverlap() (float64, int) {
	best, at := 0.0, -1
	for ix, as := range t {
		if o := overlap(as); o > best {
			best, at = o, ix
		}
	}
	return best, at
}

// restartRun is one run of a container restarted in place.
type restartRun struct {
	Ordinal int // the restart count of the container while it ran
	Exited  bool
	Code    int
	End     float64
}

// readRestartTruth reads <root>/restart/<pod>: the runs by pod.
func readRestartTruth(root string) (map[string][]restartRun, error) {
	out := map[string][]restartRun{}
	dir := filepath.Join(root, "restart")
	files, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return out, nil
	}
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(dir, f.Name()))
		if err != nil {
			return nil, err
		}
		runs, err := parseRestartRuns(string(b))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.Name(), err)
		}
		out[f.Name()] = runs
	}
	return out, nil
}

// parseRestartRuns reads "start N U" and "exit CODE N U" lines.
func parseRestartRuns(s string) ([]restartRun, error) {
	var runs []restartRun
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 3 && f[0] == "start":
			n, err := strconv.Atoi(f[1])
			if err != nil {
				return nil, fmt.Errorf("bad start line %q", sc.Text())
			}
			runs = append(runs, restartRun{Ordinal: n})
		case len(f) == 4 && f[0] == "exit":
			code, err1 := strconv.Atoi(f[1])
			n, err2 := strconv.Atoi(f[2])
			u, err3 := strconv.ParseFloat(f[3], 64)
			if err1 != nil || err2 != nil || err3 != nil || len(runs) == 0 || runs[len(runs)-1].Ordinal != n {
				return nil, fmt.Errorf("bad exit line %q", sc.Text())
			}
			r := &runs[len(runs)-1]
			r.Exited, r.Code, r.End = true, code, u
		}
	}
	return runs, nil
}

// uptime is this machine's /proc/uptime, the clock of the truth files.
func uptime() (float64, error) {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, fmt.Errorf("empty /proc/uptime")
	}
	return strconv.ParseFloat(f[0], 64)
}
