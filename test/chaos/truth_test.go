package main

import (
	"math"
	"os"
	"path/filepath"
	"testing"
)

func TestParseAttempt(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      string
		want    attempt
		wantErr bool
	}{
		{name: "exited", in: "start 10.50 lab-node-1\nexit 1 14.25\n", want: attempt{Node: "lab-node-1", Start: 10.5, End: 14.25, Exited: true, Code: 1}},
		{name: "killed", in: "start 3.00 lab-node-3\n", want: attempt{Node: "lab-node-3", Start: 3, End: 3}},
		{name: "no start", in: "exit 0 4.00\n", wantErr: true},
		{name: "bad exit", in: "start 1.00 n\nexit x 2\n", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseAttempt(tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err %v, wantErr %v", err, tc.wantErr)
			}
			if err == nil && got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestOverlap(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []attempt
		want float64
	}{
		{name: "one", in: []attempt{{Start: 1, End: 5}}, want: 0},
		{name: "one after the other", in: []attempt{{Start: 1, End: 5}, {Start: 5, End: 9}}, want: 0},
		{name: "replacement started 1.5s early", in: []attempt{{Start: 1, End: 5}, {Start: 3.5, End: 9}}, want: 1.5},
		{name: "three, two pairs", in: []attempt{{Start: 0, End: 10}, {Start: 2, End: 3}, {Start: 9, End: 12}}, want: 2},
		{name: "contained", in: []attempt{{Start: 0, End: 10}, {Start: 2, End: 4}}, want: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := overlap(tc.in); math.Abs(got-tc.want) > 1e-9 {
				t.Errorf("overlap %v, want %v", got, tc.want)
			}
		})
	}
}

func TestReadJobTruth(t *testing.T) {
	root := t.TempDir()
	write := func(rel, s string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("j/0/j-0-a", "start 1.00 n1\nexit 1 3.00\n")
	write("j/0/j-0-a.beat", "2.50\n")
	write("j/0/j-0-b", "start 4.00 n2\nexit 0 6.00\n")
	write("j/1/j-1-a", "start 1.00 n1\n") // killed: its last beat ends it
	write("j/1/j-1-a.beat", "7.50\n")
	write("j/1/j-1-b", "start 7.00 n2\nexit 0 9.00\n")
	write("j/1/ran", "")
	if err := os.MkdirAll(filepath.Join(root, "j/0/failed"), 0o755); err != nil {
		t.Fatal(err)
	}
	tr, err := readJobTruth(root, "j")
	if err != nil {
		t.Fatal(err)
	}
	if got := tr.failures(); got != 1 {
		t.Errorf("failures %d, want 1", got)
	}
	if got := len(tr[0]) + len(tr[1]); got != 4 {
		t.Errorf("%d attempts, want 4", got)
	}
	if tr[0][0].End != 3 {
		t.Errorf("an exited attempt ends at its exit, not its beat: %v", tr[0][0].End)
	}
	o, ix := tr.maxOverlap()
	if ix != 1 || math.Abs(o-0.5) > 1e-9 {
		t.Errorf("max overlap %v at %d, want 0.5 at 1", o, ix)
	}
}

func TestParseRestartRuns(t *testing.T) {
	runs, err := parseRestartRuns("start 0 1.0\nexit 3 0 3.0\nstart 1 13.0\nexit 3 1 15.0\nstart 2 40.0\n")
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 3 || !runs[1].Exited || runs[1].Ordinal != 1 || runs[2].Exited {
		t.Errorf("runs %+v", runs)
	}
	if _, err := parseRestartRuns("start 0 1.0\nexit 3 1 3.0\n"); err == nil {
		t.Error("an exit of another run than the last started: want an error")
	}
}
