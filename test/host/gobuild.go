package host

// ProductBuildFlags are the `go build` flags of the coroner binaries the lab's and kind's
// images carry (with CGO_ENABLED=0: the images have no C library): trimmed paths, no
// symbol tables, and the build tag grpcnotrace. Without that tag grpc imports
// golang.org/x/net/trace, whose html/template calls methods by name through reflection, and
// the linker then keeps every exported method of every type the binary can reach:
// coroner-agent's text was 23.5 MB with it and 15.4 MB without, its resident memory at
// start 33 and 26 MB (docs/performance.md). The Makefile sets the same tag for every build
// and test (GOFLAGS), and `make lint` fails when coroner-agent links html/template again.
var ProductBuildFlags = []string{"-trimpath", "-ldflags=-s -w", "-tags=grpcnotrace"}
