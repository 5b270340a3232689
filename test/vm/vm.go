// Package vm runs the lab's VM node (issue 10): a Debian bookworm image with systemd on
// pure cgroup v2, booted under QEMU, that gets the host-built kubelet and containerd over
// 9p. It knows images and QEMU, not Kubernetes: test/lab makes the VM a lab node (its
// network, certificates, configuration and the state Down goes by).
//
//	_output/vm/rootfs.ext4, vmlinuz, initrd.img   the image, made by build-image.sh (make vm-image)
//
// Per run (paths the caller chooses): a qcow2 overlay of rootfs.ext4, the serial console
// in a file, a pid file. The guest's boot unit mounts the 9p shares (tags corbin, corimg,
// cornode, corlog: see guest.sh) and runs guest.sh from the node share.
package vm

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/coroner-dev/coroner/test/host"
)

// GuestScript is guest.sh, which the caller writes into the node share as guest.sh.
//
//go:embed guest.sh
var GuestScript string

// Image is the built image.
type Image struct {
	Dir, Rootfs, Kernel, Initrd string
}

// ImageIn is the image in dir (<repo>/_output/vm).
func ImageIn(dir string) Image {
	return Image{Dir: dir, Rootfs: filepath.Join(dir, "rootfs.ext4"), Kernel: filepath.Join(dir, "vmlinuz"), Initrd: filepath.Join(dir, "initrd.img")}
}

// Exists reports whether the image's three files are there.
func (im Image) Exists() bool {
	for _, f := range []string{im.Rootfs, im.Kernel, im.Initrd} {
		if _, err := os.Stat(f); err != nil {
			return false
		}
	}
	return true
}

// Build runs test/vm/build-image.sh of the repository at root, which builds the image
// into <root>/_output/vm when it is missing or was built by another version of the
// script, and says so otherwise (a second or two).
func Build(ctx context.Context, root string, out io.Writer) (Image, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(root, "test", "vm", "build-image.sh"))
	cmd.Dir = root
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		return Image{}, fmt.Errorf("test/vm/build-image.sh: %w", err)
	}
	im := ImageIn(filepath.Join(root, "_output", "vm"))
	if !im.Exists() {
		return im, fmt.Errorf("test/vm/build-image.sh left no image in %s", im.Dir)
	}
	return im, nil
}

// Share is a host directory the guest mounts over 9p by its tag.
type Share struct {
	Tag, Path string
	ReadOnly  bool
}

// Machine is one VM.
type Machine struct {
	Name  string
	Image Image
	// Overlay is the qcow2 file the VM writes to (backed by Image.Rootfs, which stays
	// unchanged); Console the file of the serial console; PIDFile QEMU's pid file.
	Overlay, Console, PIDFile string
	CPUs, MemoryMB            int
	// Tap is a host tap device for the VM's only NIC (eth0 in the guest), with MAC.
	Tap, MAC string
	Shares   []Share
	// Accel is "kvm" or "tcg"; "" is Accel().
	Accel string
	// Cmdline is appended to the kernel command line.
	Cmdline string
	// QMP is the path of a unix socket for QEMU's machine protocol ("" for none): Status
	// asks it whether the guest runs, or why QEMU stopped it (an I/O error on its disk, a
	// guest panic), which the network cannot tell.
	QMP string
}

// Accel is the accelerator to use: $LAB_VM_ACCEL when set ("kvm" or "tcg"), else kvm when
// /dev/kvm is a real KVM (kvm_intel or kvm_amd), else tcg. lab-notes.md: this machine's
// /dev/kvm is kvm_pvm (nested PVM), which cannot boot Debian's kernel, so TCG it is.
func Accel() string {
	if a := os.Getenv("LAB_VM_ACCEL"); a != "" {
		return a
	}
	if _, err := os.Stat("/dev/kvm"); err != nil {
		return "tcg"
	}
	if _, err := os.Stat("/sys/module/kvm_pvm"); err == nil {
		return "tcg"
	}
	for _, m := range []string{"kvm_intel", "kvm_amd"} {
		if _, err := os.Stat("/sys/module/" + m); err == nil {
			return "kvm"
		}
	}
	return "tcg"
}

// CreateOverlay makes m.Overlay, a new qcow2 backed by the image's raw file.
func (m Machine) CreateOverlay(ctx context.Context) error {
	_ = os.Remove(m.Overlay)
	out, err := exec.CommandContext(ctx, "qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", m.Image.Rootfs, m.Overlay).CombinedOutput()
	if err != nil {
		return fmt.Errorf("qemu-img create %s: %w\n%s", m.Overlay, err, out)
	}
	return nil
}

// Args is QEMU's command line (without the program).
func (m Machine) Args() []string {
	accel := m.Accel
	if accel == "" {
		accel = Accel()
	}
	cpus, mem := m.CPUs, m.MemoryMB
	if cpus == 0 {
		cpus = 2
	}
	if mem == 0 {
		mem = 2048
	}
	args := []string{"-name", m.Name, "-machine", "q35", "-nodefaults", "-no-user-config",
		"-display", "none", "-monitor", "none", "-no-reboot"}
	if accel == "kvm" {
		args = append(args, "-accel", "kvm", "-cpu", "host")
	} else {
		args = append(args, "-accel", "tcg,thread=multi,tb-size=128", "-cpu", "max")
	}
	cmdline := "root=/dev/vda rw console=ttyS0 systemd.unified_cgroup_hierarchy=1 net.ifnames=0 panic=-1"
	if m.Cmdline != "" {
		cmdline += " " + m.Cmdline
	}
	args = append(args,
		"-smp", strconv.Itoa(cpus), "-m", strconv.Itoa(mem),
		"-kernel", m.Image.Kernel, "-initrd", m.Image.Initrd, "-append", cmdline,
		"-drive", "file="+m.Overlay+",if=virtio,format=qcow2,cache=unsafe,discard=unmap",
		"-serial", "file:"+m.Console,
		"-device", "virtio-rng-pci",
		// The guest hands the pages it frees back to the host (QEMU's RSS shrinks after
		// the image imports; guest.sh drops the page cache then).
		"-device", "virtio-balloon-pci,free-page-reporting=on",
		"-pidfile", m.PIDFile,
	)
	if m.QMP != "" {
		args = append(args, "-qmp", "unix:"+m.QMP+",server=on,wait=off")
	}
	if m.Tap != "" {
		args = append(args, "-netdev", "tap,id=net0,ifname="+m.Tap+",script=no,downscript=no",
			"-device", "virtio-net-pci,netdev=net0,mac="+m.MAC)
	}
	for _, s := range m.Shares {
		opt := "local,path=" + s.Path + ",mount_tag=" + s.Tag + ",security_model=none"
		if s.ReadOnly {
			opt += ",readonly=on"
		}
		args = append(args, "-virtfs", opt)
	}
	return args
}

// QEMU is the program that runs the VM.
const QEMU = "qemu-system-x86_64"

// RSS is the resident memory of a process in bytes (VmRSS of /proc/PID/status).
func RSS(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	return host.KiBField(string(b), "VmRSS")
}

// Tail is the end of a file (the console), at most n bytes.
func Tail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > n {
		_, _ = f.Seek(st.Size()-n, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	return string(b)
}

// SSHOptions are ssh's options for the guest: key, no host-key bookkeeping, no prompts.
// ConnectTimeout covers the TCP connection and sshd's banner: a TCG guest under a loaded
// host has taken over 5 s to send its banner (a CI run: "Connection timed out during
// banner exchange"), so it is generous; SSHRetry retries what still fails to connect.
func SSHOptions(key string) []string {
	return []string{"-i", key, "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
		"-o", "LogLevel=ERROR", "-o", "ConnectTimeout=20", "-o", "BatchMode=yes"}
}

// NotConnected tells whether ssh's output says it never reached a shell in the guest
// (exit status 255 and one of OpenSSH's messages for a connection that did not come up),
// so nothing ran there and the same command may run again.
func NotConnected(err error, out []byte) bool {
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 255 {
		return false
	}
	for _, m := range []string{"banner exchange", "kex_exchange_identification", "Connection timed out",
		"Connection refused", "Connection reset by peer", "No route to host"} {
		if strings.Contains(string(out), m) {
			return true
		}
	}
	return false
}

// sshRetryPause is the pause between SSHRetry's tries (shorter in its tests).
var sshRetryPause = 5 * time.Second

// SSHRetry runs one ssh invocation (run returns its error and the output that tells why)
// until it connects: up to 4 tries, 5 s apart, while ctx lasts. Only a failure to connect
// is retried (NotConnected); any other result is returned as it is.
func SSHRetry(ctx context.Context, run func() ([]byte, error)) ([]byte, error) {
	var out []byte
	var err error
	for try := 1; ; try++ {
		out, err = run()
		if try == 4 || !NotConnected(err, out) {
			return out, err
		}
		select {
		case <-ctx.Done():
			return out, err
		case <-time.After(sshRetryPause):
		}
	}
}

// SSH runs a command in the guest as root over ssh with key, at ip; its combined output.
func SSH(ctx context.Context, key, ip string, timeout time.Duration, command string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return SSHRetry(ctx, func() ([]byte, error) {
		return exec.CommandContext(ctx, "ssh", append(SSHOptions(key), "root@"+ip, command)...).CombinedOutput()
	})
}
