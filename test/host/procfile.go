package host

import (
	"fmt"
	"strconv"
	"strings"
)

// KiBField is the value in bytes of the field key ("VmRSS", "MemAvailable") of a /proc
// file in the "Key:   1234 kB" form (/proc/PID/status, /proc/meminfo).
func KiBField(content, key string) (int64, error) {
	for line := range strings.SplitSeq(content, "\n") {
		if rest, ok := strings.CutPrefix(line, key+":"); ok {
			f := strings.Fields(rest)
			if len(f) == 0 {
				break
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: %w", key, err)
			}
			return kb * 1024, nil
		}
	}
	return 0, fmt.Errorf("no %s field", key)
}
