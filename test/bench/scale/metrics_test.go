package main

import (
	"os"
	"testing"
	"time"
)

// TestParseWrites reads the write counts of a real /metrics page (testdata: kube-apiserver
// v1.36.3 of test/harness just after its start): 208 writes in all (its lines with a write
// verb, summed by awk), by verb and resource, GETs, LISTs and WATCHes left out.
func TestParseWrites(t *testing.T) {
	b, err := os.ReadFile("testdata/apiserver-metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	all, err := parseRequests(string(b))
	if err != nil {
		t.Fatal(err)
	}
	w := writesOnly(all)
	sum := 0.0
	for _, v := range w {
		sum += v
	}
	if sum != 208 {
		t.Errorf("writes in all %v, want 208: %v", sum, w)
	}
	for k, want := range map[writeKey]float64{"POST namespaces": 4, "PUT customresourcedefinitions/status": 2, "POST services": 1} {
		if w[k] != want {
			t.Errorf("%s = %v, want %v", k, w[k], want)
		}
	}
	for k := range w {
		if v := string(k); v[:3] == "GET" || v[:4] == "LIST" || v[:5] == "WATCH" {
			t.Errorf("a read counted as a write: %s", k)
		}
	}
	if _, err := parseRequests("apiserver_request_total{verb=\"PUT\",resource=\"leases\"} x\n"); err == nil {
		t.Error("a value that is not a number was accepted")
	}
}

func TestRates(t *testing.T) {
	a := writeCounts{"PUT leases": 100, "PATCH nodes/status": 10}
	b := writeCounts{"PUT leases": 700, "PATCH nodes/status": 10, "POST events": 30}
	r := rates(a, b, time.Minute)
	if r["PUT leases"] != 10 || r["POST events"] != 0.5 || len(r) != 2 {
		t.Errorf("rates = %v, want PUT leases 10/s, POST events 0.5/s and no unchanged kind", r)
	}
	if total(r) != 10.5 {
		t.Errorf("total = %v, want 10.5", total(r))
	}
}

func TestKubeletKinds(t *testing.T) {
	r := map[writeKey]float64{"PUT leases": 500, "PATCH nodes/status": 16, "POST endpoints": 0.1, "POST events": 2}
	k := kubeletKinds(r)
	if len(k) != 2 || total(k) != 516 {
		t.Errorf("kubeletKinds = %v, want the Leases and the nodes' status only", k)
	}
}
