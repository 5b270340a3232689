// Command coronerctl is coroner's command-line tool: explain what happened to a Job's pods,
// check a Job's policy offline, and inject failures. It follows kubectl's conventions
// (cobra commands, kubectl's kubeconfig, context and namespace flags, -o json|yaml) and is
// also a kubectl plugin: installed as kubectl-coroner on the PATH it runs as
// `kubectl coroner ...`. This main only wires the commands; they live in the packages
// explain, check and chaos.
package main

import (
	"os"
	"path/filepath"
)

func main() {
	os.Exit(run(filepath.Base(os.Args[0]), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
