// Command runcwrap is the OCI runtime test/kind registers with its own dockerd
// (--add-runtime coroner-runc=... --default-runtime coroner-runc): it removes from the
// container's OCI spec every capability missing from this process's capability bounding set,
// then executes runc with the same arguments.
//
// Why: on these machines the sandbox's bounding set lacks CAP_SYS_RESOURCE, so runc fails
// every --privileged container (kind's node containers) with "unable to apply caps:
// operation not permitted", and --cap-drop does not apply to --privileged. The bounding set
// is read from /proc/self/status (CapBnd), never hard-coded. `runc create|run --bundle DIR`
// has the spec in DIR/config.json; `runc exec --process FILE` (docker exec) in FILE.
//
// The runc executed is $CORONER_KIND_RUNC, else the first runc on PATH.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// capNames are the Linux capabilities by bit number (linux/capability.h).
var capNames = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
	"CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE",
	"CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK",
	"CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE",
	"CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE", "CAP_SYS_RESOURCE",
	"CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE", "CAP_AUDIT_WRITE",
	"CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG",
	"CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF",
	"CAP_CHECKPOINT_RESTORE",
}

func main() {
	runc := os.Getenv("CORONER_KIND_RUNC")
	if runc == "" {
		var err error
		if runc, err = lookRunc(); err != nil {
			fmt.Fprintln(os.Stderr, "runcwrap:", err)
			os.Exit(127)
		}
	}
	if missing, err := missingCaps(); err != nil {
		fmt.Fprintln(os.Stderr, "runcwrap:", err)
	} else if len(missing) > 0 {
		for _, f := range specFiles(os.Args[1:]) {
			if err := dropCaps(f, missing); err != nil {
				fmt.Fprintln(os.Stderr, "runcwrap:", err)
				os.Exit(1)
			}
		}
	}
	args := append([]string{runc}, os.Args[1:]...)
	if err := syscall.Exec(runc, args, os.Environ()); err != nil {
		fmt.Fprintln(os.Stderr, "runcwrap: exec", runc+":", err)
		os.Exit(127)
	}
}

// lookRunc finds runc on PATH, skipping this executable.
func lookRunc() (string, error) {
	self, _ := os.Executable()
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		p := filepath.Join(dir, "runc")
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			if r, _ := filepath.EvalSymlinks(p); r != "" && r == self {
				continue
			}
			return p, nil
		}
	}
	return "", fmt.Errorf("runc not found on PATH")
}

// missingCaps returns the names of the capabilities not in this process's bounding set.
func missingCaps() (map[string]bool, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		v, ok := strings.CutPrefix(sc.Text(), "CapBnd:")
		if !ok {
			continue
		}
		bnd, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		if err != nil {
			return nil, fmt.Errorf("CapBnd %q: %w", v, err)
		}
		missing := map[string]bool{}
		for i, name := range capNames {
			if bnd&(1<<uint(i)) == 0 {
				missing[name] = true
			}
		}
		return missing, nil
	}
	return nil, fmt.Errorf("no CapBnd in /proc/self/status")
}

// specFiles returns the JSON files of the runc command line that hold capabilities:
// --bundle DIR (DIR/config.json; create and run) and --process FILE (exec).
func specFiles(args []string) []string {
	var files []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		val := func(flag string) (string, bool) {
			if a == flag && i+1 < len(args) {
				i++
				return args[i], true
			}
			if v, ok := strings.CutPrefix(a, flag+"="); ok {
				return v, true
			}
			return "", false
		}
		if v, ok := val("--bundle"); ok {
			files = append(files, filepath.Join(v, "config.json"))
		} else if v, ok := val("-b"); ok {
			files = append(files, filepath.Join(v, "config.json"))
		} else if v, ok := val("--process"); ok {
			files = append(files, v)
		} else if v, ok := val("-p"); ok {
			files = append(files, v)
		}
	}
	return files
}

// dropCaps removes the missing capabilities from every list of the spec's (or process
// file's) capabilities object, leaving every other field as it is.
func dropCaps(file string, missing map[string]bool) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	proc := doc
	if p, ok := doc["process"].(map[string]any); ok {
		proc = p
	}
	caps, ok := proc["capabilities"].(map[string]any)
	if !ok {
		return nil
	}
	changed := false
	for set, v := range caps {
		list, ok := v.([]any)
		if !ok {
			continue
		}
		kept := make([]any, 0, len(list))
		for _, c := range list {
			if s, _ := c.(string); missing[s] {
				changed = true
				continue
			}
			kept = append(kept, c)
		}
		caps[set] = kept
	}
	if !changed {
		return nil
	}
	out, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	st, err := os.Stat(file)
	if err != nil {
		return err
	}
	return os.WriteFile(file, out, st.Mode().Perm())
}
