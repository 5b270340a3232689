package nvidia

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// GPUsDir is where the NVIDIA driver serves one directory per GPU, named by
// its PCI address, each with an information file.
const GPUsDir = "/proc/driver/nvidia/gpus"

// Information is what the driver's /proc/driver/nvidia/gpus/<address>/information
// file says about a GPU. The driver writes one "Key: \t value" line per
// field (kernel-open/nvidia/nv-procfs.c, nv_procfs_read_gpu_info):
//
//	Model: 		 NVIDIA H100 80GB HBM3
//	IRQ:   		 10
//	GPU UUID: 	 GPU-9221d5d1-b60b-a624-bf14-0a1819cfda3b
//	Video BIOS: 	 96.00.99.00.01
//	Bus Type: 	 PCIe
//	DMA Size: 	 52 bits
//	DMA Mask: 	 0xfffffffffffff
//	Bus Location: 	 0000:62:00.0
//	Device Minor: 	 5
//	GPU Firmware: 	 535.129.03
//	GPU Excluded: 	 No
//
// Fields other than these are ignored.
type Information struct {
	Model string
	// UUID is the GPU's UUID, "GPU-...", the device ID NVIDIA's device
	// plugin gives the kubelet. It is "" when the file has no "GPU UUID"
	// line: the driver leaves it out when it cannot read the UUID (a GPU it
	// excluded, or not initialized).
	UUID string
	// Address is the "Bus Location", normalized.
	Address Address
	// Minor is the minor number of the GPU's /dev/nvidiaN, -1 when the file
	// has no "Device Minor" (drivers before about 2018).
	Minor int
	// Excluded says the driver refuses the GPU: "GPU Excluded: Yes", or
	// "Blacklisted: Yes" in older drivers.
	Excluded bool
}

// ParseInformation parses an information file. A file without a "Bus
// Location", or with a field it cannot read, is malformed.
func ParseInformation(text string) (Information, error) {
	info := Information{Minor: -1}
	var haveAddress bool
	for _, line := range strings.Split(text, "\n") {
		key, val, ok := strings.Cut(line, ":")
		if !ok {
			if strings.TrimSpace(line) != "" {
				return Information{}, fmt.Errorf("line %q is not \"Key: value\"", truncate(line))
			}
			continue
		}
		key, val = strings.TrimSpace(key), strings.TrimSpace(val)
		switch key {
		case "Model":
			info.Model = val
		case "GPU UUID":
			if !strings.HasPrefix(val, "GPU-") || strings.ContainsAny(val, " \t") {
				return Information{}, fmt.Errorf("field \"GPU UUID\" %q does not start with GPU- or holds a blank", truncate(val))
			}
			info.UUID = val
		case "Bus Location":
			a, err := ParseAddress(val)
			if err != nil {
				return Information{}, fmt.Errorf("field \"Bus Location\": %w", err)
			}
			info.Address, haveAddress = a, true
		case "Device Minor":
			n, err := strconv.ParseUint(val, 10, 31)
			if err != nil {
				return Information{}, fmt.Errorf("field \"Device Minor\" %q is not a number", truncate(val))
			}
			info.Minor = int(n)
		case "GPU Excluded", "Blacklisted":
			info.Excluded = info.Excluded || val == "Yes"
		}
	}
	if !haveAddress {
		return Information{}, errors.New("no \"Bus Location\" field")
	}
	return info, nil
}

// UUIDsByAddress maps the PCI address of each GPU the driver serves to its
// UUID, reading dir/<address>/information for every subdirectory of dir
// (GPUsDir on a node). The keys are normalized addresses, as ParseXid
// returns them.
//
// A missing dir (no NVIDIA driver loaded) gives an empty map and no error.
// A GPU whose file has no UUID is left out. A subdirectory not named by a
// PCI address, an information file that cannot be read or is malformed, or
// whose Bus Location is not its directory's name, is an error naming the
// file; the map then still holds every GPU that could be read.
func UUIDsByAddress(dir string) (map[Address]string, error) {
	uuids := map[Address]string{}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return uuids, nil
	}
	if err != nil {
		return uuids, fmt.Errorf("nvidia: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		path := filepath.Join(dir, e.Name(), "information")
		dirAddress, err := ParseAddress(e.Name())
		if err != nil {
			errs = append(errs, fmt.Errorf("nvidia: %s: directory name: %w", path, err))
			continue
		}
		b, err := os.ReadFile(path)
		if err != nil {
			errs = append(errs, fmt.Errorf("nvidia: %w", err))
			continue
		}
		info, err := ParseInformation(string(b))
		if err != nil {
			errs = append(errs, fmt.Errorf("nvidia: %s: %w", path, err))
			continue
		}
		if info.Address != dirAddress {
			errs = append(errs, fmt.Errorf("nvidia: %s: \"Bus Location\" %s is not its directory's", path, info.Address))
			continue
		}
		if info.UUID != "" {
			uuids[info.Address] = info.UUID
		}
	}
	return uuids, errors.Join(errs...)
}
