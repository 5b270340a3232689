package controller

import (
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/coroner-dev/coroner/shim/backoff"
)

// TestJobStateRetriesByUID: the backoff is the Job's, not its name's.
func TestJobStateRetriesByUID(t *testing.T) {
	s := newJobStates()
	job := newJob("j")
	s.setRetries(job, backoff.Record{Failures: 2})
	if got, ok := s.retries(job); !ok || got.Failures != 2 {
		t.Errorf("retries = %+v, %v; want 2 failures", got, ok)
	}
	again := job.DeepCopy()
	again.UID = "j-uid-2"
	if got, ok := s.retries(again); ok {
		t.Errorf("a Job recreated under the name has retries %+v", got)
	}
	s.setRetries(again, backoff.Record{}) // another Job's zero leaves this one's
	if _, ok := s.retries(job); !ok {
		t.Errorf("the retries of the Job went with another Job's zero backoff")
	}
	s.setRetries(job, backoff.Record{})
	if _, ok := s.retries(job); ok {
		t.Errorf("a zero backoff kept")
	}
	if len(s.jobs) != 0 {
		t.Errorf("empty states kept: %v", s.jobs)
	}
}

// TestJobStateDeleted: a deleted Job's UID is remembered past the recreation of its name,
// and forgotten after deletedJobsKept once 1024 are kept.
func TestJobStateDeleted(t *testing.T) {
	s := newJobStates()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	job := newJob("j")
	s.jobDeleted(job, now)
	s.setRetries(newJob("j"), backoff.Record{Failures: 1}) // recreated (same UID here: the name matters)
	s.forgetDeletedManaged(job)
	if !s.seenDeleted(testNS, "j", job.UID) {
		t.Errorf("the deletion is forgotten")
	}
	if s.seenDeleted(testNS, "j", "other") || s.seenDeleted("other", "j", job.UID) {
		t.Errorf("another Job is seen deleted")
	}
	for i := range 1023 {
		j := newJob(fmt.Sprintf("j%d", i))
		s.jobDeleted(j, now.Add(time.Duration(i)*time.Second))
	}
	later := now.Add(deletedJobsKept + 30*time.Second)
	s.jobDeleted(newJob("last"), later)
	if s.seenDeleted(testNS, "j", job.UID) || s.seenDeleted(testNS, "j0", "j0-uid") {
		t.Errorf("deletions older than %v kept", deletedJobsKept)
	}
	if !s.seenDeleted(testNS, "j1000", "j1000-uid") || !s.seenDeleted(testNS, "last", "last-uid") {
		t.Errorf("recent deletions forgotten")
	}
	if want := 1024 - 30; s.deletedCount != want {
		t.Errorf("deletedCount = %d, want %d", s.deletedCount, want)
	}
	if _, ok := s.jobs[testNS+"/j0"]; ok {
		t.Errorf("an empty state kept")
	}
}

// TestJobStateManaged: the count behind coroner_managed_jobs.
func TestJobStateManaged(t *testing.T) {
	s := newJobStates()
	steps := []struct {
		key         string
		managed     bool
		wantCount   int
		wantChanged bool
	}{
		{"ns/a", true, 1, true},
		{"ns/a", true, 0, false},
		{"ns/b", true, 2, true},
		{"ns/c", false, 0, false},
		{"ns/a", false, 1, true},
	}
	for i, st := range steps {
		n, changed := s.setManaged(st.key, st.managed)
		if n != st.wantCount || changed != st.wantChanged {
			t.Errorf("step %d: setManaged(%s, %v) = %d, %v; want %d, %v", i, st.key, st.managed, n, changed, st.wantCount, st.wantChanged)
		}
	}
}

// TestJobStateUrgent: urgency runs out, and is dropped then.
func TestJobStateUrgent(t *testing.T) {
	s := newJobStates()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	s.markUrgent("ns/j", now.Add(time.Second))
	if !s.urgent("ns/j", now) {
		t.Errorf("not urgent before the time")
	}
	if s.urgent("ns/j", now.Add(time.Second)) {
		t.Errorf("urgent at the time")
	}
	if len(s.jobs) != 0 {
		t.Errorf("an urgency that ran out is kept")
	}
	s.markUrgent("ns/j", now.Add(time.Second))
	s.clearUrgent("ns/j")
	if s.urgent("ns/j", now) {
		t.Errorf("urgent after clearUrgent")
	}
}

// TestJobStateFinishedPods: the pods counted "add", by pod UID, whatever their Job.
func TestJobStateFinishedPods(t *testing.T) {
	s := newJobStates()
	uid := types.UID("p")
	s.setFinishedPod(uid, true)
	s.jobDeleted(newJob("j"), time.Now())
	if !s.finishedPod(uid) {
		t.Errorf("the pod's count went with its Job")
	}
	s.setFinishedPod(uid, false)
	if s.finishedPod(uid) {
		t.Errorf("the pod is still counted")
	}
}
