// Package e2eapps is upstream's e2e test binary cut down to the framework and the
// "[sig-apps]" specs of k8s.io/kubernetes v1.36.3 (test/e2e/apps), for test/upstream, which
// runs its "[sig-apps] Job" specs against the lab with the built-in Job controller and with
// coroner. It has no code of its own outside its test: build.sh e2e-upstream compiles it
// with `go test -c` into _output/bin/e2e-apps.test.
package e2eapps
